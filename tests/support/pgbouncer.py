"""A PgBouncer of a test's own in transaction mode (Debian's `pgbouncer`; CI installs it
and sets REQUIRE_PGBOUNCER), in front of the test's PostgreSQL, with fewer server
connections than its clients hold: consecutive transactions of one client connection
run on different server connections, as behind a busy pooler."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.support.servers import free_port, wait_listening

CONFIG = """[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {auth_file}
pool_mode = transaction
default_pool_size = {server_connections}
max_client_conn = 1000
logfile = {logfile}
"""


class PgBouncer:
    def __init__(
        self, tmp_path: Path, database_url: str, *, server_connections: int = 3
    ) -> None:
        binary = shutil.which("pgbouncer") or shutil.which(
            "pgbouncer", path="/usr/sbin"
        )
        if binary is None:
            if os.environ.get("REQUIRE_PGBOUNCER"):
                pytest.fail("REQUIRE_PGBOUNCER is set, but pgbouncer is not installed")
            pytest.skip(
                "pgbouncer is not installed (Debian: apt-get install pgbouncer)"
            )
        target = make_url(database_url)
        self.port = free_port()
        self.url = target.set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False
        )
        # PgBouncer refuses to run as root: as root it drops to `nobody`, which must
        # be able to read its files (a test's tmp_path is private to its user).
        home = self.home = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        home.chmod(0o755)
        self.log = home / "pgbouncer.log"
        auth_file = home / "users.txt"
        auth_file.write_text(f'"{target.username}" ""\n')
        config = home / "pgbouncer.ini"
        config.write_text(
            CONFIG.format(
                host=target.host or "127.0.0.1",
                port=target.port or 5432,
                listen_port=self.port,
                auth_file=auth_file,
                server_connections=server_connections,
                logfile=self.log,
            )
        )
        for path in (auth_file, config):
            path.chmod(0o644)
        # Written by `nobody` (touch's mode would be cut by the umask).
        self.log.touch()
        self.log.chmod(0o666)
        command = [binary, str(config)]
        if os.geteuid() == 0:
            command[1:1] = ["-u", "nobody"]
        self.stderr = tmp_path / f"pgbouncer-{self.port}.err"
        with self.stderr.open("wb") as sink:
            self.process = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT
            )
        wait_listening(self.port, "pgbouncer", self.log)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.home, ignore_errors=True)
