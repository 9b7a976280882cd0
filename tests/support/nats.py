"""A nats-server of a test's own (Debian's `nats-server`; CI installs it and sets
REQUIRE_NATS), which the test can stop and start again on the same port."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.servers import free_port, wait_listening


class Nats:
    """A nats-server on a port of its own, which the test can stop and start again."""

    def __init__(self, tmp_path: Path) -> None:
        binary = shutil.which("nats-server")
        if binary is None:
            if os.environ.get("REQUIRE_NATS"):
                pytest.fail("REQUIRE_NATS is set, but nats-server is not installed")
            pytest.skip(
                "nats-server is not installed (Debian: apt-get install nats-server)"
            )
        self.binary = binary
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.log = tmp_path / f"nats-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                [self.binary, "-a", "127.0.0.1", "-p", str(self.port)],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        wait_listening(self.port, "nats-server", self.log)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
