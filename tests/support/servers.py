"""Real `python -m app serve` processes on loopback: one for a test or a block of it,
or one per lane shared by the tests of a module (`live_server_fixture`,
`keyed_server_fixture`), and an HTTP client of it (`api_fixture`)."""

import asyncio
import functools
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.scratch_db import create_key
from tests.support.lanes import LANES, ROOT, lane_database_url

DEFAULT_ORG = "org_00000000000000000000000000000001"


# Below the kernel's ephemeral range (32768-60999 here): a port in it can be taken
# between our check and the server's bind by any outgoing connection, such as a
# database client's. Random, because the kernel's own assignment is sequential, so
# concurrent runs asking it would often collide.
PORTS = (20_000, 32_000)


def bound_socket() -> socket.socket:
    """A loopback socket bound to a port picked at random from `PORTS`, held until a
    server listens on it."""
    for _ in range(100):
        port = random.randint(*PORTS)
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        return sock
    raise RuntimeError("no free port")


def wait_listening(port: int, name: str, log: Path, within: float = 10.0) -> None:
    """Until something accepts connections on 127.0.0.1:`port` (a helper process the
    test started); AssertionError with its log if nothing does within `within` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
        except OSError:
            time.sleep(0.05)
            continue
        return
    raise AssertionError(f"{name} did not listen: {log.read_text()}")


def free_port() -> int:
    """A port that is free now, for a server that starts at once (one that starts
    later, when another process may have taken the port, gets a `bound_socket`)."""
    with bound_socket() as sock:
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    env: dict[str, str]
    log: Path

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def start_server(
    database_url: str, tmp_path: Path, port: int | None = None, **env: str
) -> Server:
    """A real `python -m app serve` process on loopback; waits until /health answers.
    Without a `port`, a port another process took before the server bound it is
    retried on another one."""
    for _ in range(2 if port is None else 0):
        try:
            return _start_server(database_url, tmp_path, free_port(), **env)
        except PortTaken:
            continue
    return _start_server(database_url, tmp_path, port or free_port(), **env)


class PortTaken(RuntimeError):
    pass


def _start_server(database_url: str, tmp_path: Path, port: int, **env: str) -> Server:
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "SCRIPTED_DELAY_MS": "5",
        "SSE_HEARTBEAT_SECONDS": "1",
        "RUNNER_SWEEP_SECONDS": "1",
        "LOG_LEVEL": "warning",
        **env,
    }
    log = tmp_path / f"server-{port}-{uuid.uuid4().hex[:6]}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", str(port)],
            cwd=ROOT,
            env=environment,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = log.read_text()
            if "address already in use" in output:
                raise PortTaken(f"port {port} taken: {output}")
            raise RuntimeError(f"server exited: {output}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return Server(url, process, environment, log)
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server did not start: {log.read_text()}")


@asynccontextmanager
async def server_process(
    database_url: str, tmp_path: Path, *, kill: bool = False, **env: str
) -> AsyncIterator[Server]:
    """A real server (see `start_server`) for the block: stopped after it, or killed
    with `kill`."""
    start = functools.partial(start_server, database_url, tmp_path, None, **env)
    server = await asyncio.to_thread(start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.kill if kill else server.stop)


async def start_own_server(database_url: str, tmp_path: Path, **env: str) -> Server:
    """`start_server` at info level, confirmed to be our process: its /health probe is
    answered by whatever holds the port, and a free port can be taken by another
    process (another test run on this machine) before our server binds it. Only our
    server logs that it bound the port; if it could not, start another."""
    env = {"LOG_LEVEL": "info", **env}
    for _ in range(3):
        server = await asyncio.to_thread(
            functools.partial(start_server, database_url, tmp_path, None, **env)
        )
        bound = f"Uvicorn running on {server.url}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and server.process.poll() is None:
            if bound in server.log.read_text(errors="replace"):
                return server
            await asyncio.sleep(0.05)
        await asyncio.to_thread(server.stop)
    raise AssertionError(f"no server of our own started: {server.log.read_text()}")


def live_server_fixture(name: str, **env: str) -> Any:
    """A module's `live_server` fixture: one real server process per lane, shared by
    the module's tests (each uses sessions of its own). `env` configures the server.

        live_server = live_server_fixture("live-turn")
    """

    @pytest.fixture(scope="module", params=LANES)
    def live_server(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Server]:
        directory = tmp_path_factory.mktemp(name)
        server = start_server(
            lane_database_url(request, directory), directory, None, **env
        )
        yield server
        server.stop()

    return live_server


@dataclass
class KeyedServer:
    """A server whose database holds one API key: every request needs it."""

    server: Server
    api_key: str

    @property
    def url(self) -> str:
        return self.server.url


def keyed_server_fixture(name: str, **env: str) -> Any:
    """A module's `keyed_server` fixture: like `live_server_fixture`, with an API key
    of the default organization created before the server starts (the client tests
    prove every call carries it).

        keyed_server = keyed_server_fixture("python-client", SSE_CYCLE_SECONDS="1")
    """

    @pytest.fixture(scope="module", params=LANES)
    def keyed_server(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[KeyedServer]:
        directory = tmp_path_factory.mktemp(name)
        database_url = lane_database_url(request, directory)
        key = asyncio.run(create_key(database_url, DEFAULT_ORG))
        server = start_server(database_url, directory, None, **env)
        yield KeyedServer(server, key)
        server.stop()

    return keyed_server


def api_fixture() -> Any:
    """A module's `api` fixture (`api = api_fixture()`): an HTTP client of its
    `live_server`."""

    @pytest.fixture
    async def api(live_server: Server) -> AsyncIterator[httpx.AsyncClient]:
        async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as client:
            yield client

    return api
