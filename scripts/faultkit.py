"""Shared pieces of the fault and load scripts (scripts/fault_*.py, scripts/soak.py):
a server process on loopback, a throwaway PostgreSQL cluster, a cheap raw-socket SSE
reader, and the Mutation-stream merge rules a client follows.

Not a test module and not part of the service: the scripts import it from their own
directory (`python scripts/<name>.py` puts scripts/ on sys.path).
"""

import argparse
import asyncio
import contextlib
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import asyncpg
import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
PG_BIN = Path("/usr/lib/postgresql/15/bin")
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(q / 100 * len(ordered)))) - 1
    return ordered[rank]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


# ---- the server process --------------------------------------------------------------


@dataclass
class ServerProcess:
    """`python -m app serve` on loopback. Restartable on the same port and database."""

    database_url: str
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"server-{self.port}.log"

    def start(self, timeout: float = 60.0) -> None:
        environment = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "RATE_LIMIT_PER_SECOND": "0",
            "LOG_LEVEL": "warning",
            **self.env,
        }
        self.starts += 1
        log = self.log_path.open("ab")
        log.write(f"\n==== start {self.starts} ====\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", str(self.port)],
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.process.kill()
        raise RuntimeError(f"server did not start; see {self.log_path}")

    def sigkill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def rss_kb(self) -> int:
        """VmRSS of the server process, in kB (0 if it is gone)."""
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def migrate(database_url: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "app", "migrate"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        check=True,
        capture_output=True,
    )


# ---- PostgreSQL ------------------------------------------------------------------------


def asyncpg_dsn(url: str) -> str:
    """postgresql+asyncpg://... -> postgresql://... for asyncpg.connect."""
    _, _, rest = url.partition("://")
    return "postgresql://" + rest


def with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


async def pg_admin(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(with_database(url, "postgres")))
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@dataclass
class ThrowawayCluster:
    """A PostgreSQL 15 cluster of our own (initdb into a temp dir, trust auth, a free
    port), so a restart fault never touches anyone else's server. We run as root, so
    the binaries run as the postgres user."""

    directory: Path = field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix="evm_fault_pg_"))
    )
    port: int = field(default_factory=free_port)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["runuser", "-u", "postgres", "--", *args],
            check=check,
            capture_output=True,
            text=True,
        )

    def init(self) -> None:
        shutil.chown(self.directory, "postgres")
        self._run(
            str(PG_BIN / "initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
        )
        # A little more headroom than the default 100 for the pool + listener + leases.
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\nmax_connections = 200\nfsync = on\n")

    def start(self) -> None:
        self._run(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            f"-p {self.port} -k {self.directory}",
            "-l",
            str(self.directory / "postgres.log"),
            "-w",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"
        )

    def url(self, database: str) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def remove(self) -> None:
        self._run(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-m",
            "immediate",
            "-w",
            "stop",
            check=False,
        )
        shutil.rmtree(self.directory, ignore_errors=True)


# ---- a raw-socket SSE reader -----------------------------------------------------------


@dataclass
class Frame:
    event: bytes
    id: str | None
    data: bytes


class StreamRefused(Exception):
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        super().__init__(f"status {status}")
        self.status = status
        self.headers = headers
        self.body = body


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _chunks(
    reader: asyncio.StreamReader, headers: dict[str, str]
) -> AsyncIterator[bytes]:
    if "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
        return
    if headers.get("transfer-encoding", "").lower() != "chunked":
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0], 16)
        if size == 0:
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


@contextlib.asynccontextmanager
async def raw_stream(
    base_url: str,
    path: str,
    headers: dict[str, str] | None = None,
    connect_timeout: float = 10.0,
) -> AsyncIterator[AsyncIterator[Frame]]:
    """Open an SSE stream on a plain socket and yield an iterator of its frames
    (comments are skipped). Non-200 answers raise StreamRefused with the body."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, int(port), limit=1 << 22), connect_timeout
    )
    try:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n{extra}\r\n".encode()
        )
        await writer.drain()
        status, response_headers = await asyncio.wait_for(
            _read_head(reader), connect_timeout
        )
        if status != 200:
            body = b""
            with contextlib.suppress(Exception):
                async for chunk in _chunks(reader, response_headers):
                    body += chunk
                    if len(body) > 65536:
                        break
            raise StreamRefused(status, response_headers, body)

        async def frames() -> AsyncIterator[Frame]:
            buffer = b""
            async for chunk in _chunks(reader, response_headers):
                buffer += chunk
                while True:
                    end = buffer.find(b"\n\n")
                    if end < 0:
                        break
                    block, buffer = buffer[:end], buffer[end + 2 :]
                    event = b"message"
                    event_id: str | None = None
                    data: list[bytes] = []
                    for line in block.split(b"\n"):
                        if line.startswith(b"data: "):
                            data.append(line[6:])
                        elif line.startswith(b"event: "):
                            event = line[7:]
                        elif line.startswith(b"id: "):
                            event_id = line[4:].decode()
                    if data or event_id is not None:
                        yield Frame(event, event_id, b"\n".join(data))

        yield frames()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 2)


# ---- the Mutation-stream client rules --------------------------------------------------


@dataclass
class MutationView:
    """What a Mutation-stream client holds: the newest snapshot of every message it was
    sent, merged by id + revision (docs/streams.md)."""

    messages: dict[str, dict[str, Any]] = field(default_factory=dict)
    cursor: str | None = None

    def merge(self, message: dict[str, Any]) -> None:
        held = self.messages.get(message["id"])
        if held is None or held["revision"] < message["revision"]:
            self.messages[message["id"]] = message

    def apply(self, frame: Frame) -> None:
        if frame.event == b"message":
            self.merge(orjson.loads(frame.data)["message"])
            if frame.id is not None:
                self.cursor = frame.id


async def all_messages(
    client: httpx.AsyncClient, session_id: str
) -> tuple[list[dict[str, Any]], str]:
    """Every visible message of a session (walking pages back), oldest first, and the
    cursor of the newest page."""
    out: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 200}
    cursor = "0"
    first = True
    while True:
        response = await client.get(
            f"/v1/sessions/{session_id}/messages", params=params
        )
        response.raise_for_status()
        body = response.json()
        if first:
            cursor = body["cursor"]
            first = False
        out = body["data"] + out
        if not body["has_more"]:
            return out, cursor
        params = {"limit": 200, "before_sequence": body["next_before_sequence"]}


def compare_view(
    view: dict[str, dict[str, Any]], truth: list[dict[str, Any]]
) -> list[str]:
    """Differences between a client's merged snapshots and GET .../messages."""
    problems = []
    truth_by_id = {m["id"]: m for m in truth}
    for message_id in truth_by_id.keys() - view.keys():
        problems.append(f"missing {message_id}")
    for message_id in view.keys() - truth_by_id.keys():
        problems.append(f"extra {message_id}")
    for message_id in view.keys() & truth_by_id.keys():
        if view[message_id] != truth_by_id[message_id]:
            problems.append(
                f"differs {message_id}: rev {view[message_id]['revision']} "
                f"vs {truth_by_id[message_id]['revision']}"
            )
    return problems


def text_body(text: str, client_message_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"message": {"content": [{"type": "text", "text": text}]}}
    if client_message_id is not None:
        body["client_message_id"] = client_message_id
    return body


def new_tag() -> str:
    return uuid.uuid4().hex[:10]


def exit_on_sigterm() -> None:
    """Turn SIGTERM (and SIGINT, which a background job ignores) into SystemExit, so a
    script's `finally` still stops its server and removes its database or cluster."""

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop when available: the client shares two cores with the
    server, so its event loop should be cheap."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def add_database_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database", choices=("sqlite", "postgresql"), default="sqlite"
    )
    parser.add_argument(
        "--pg-url",
        default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL server on which to create (and drop) evm_fault_<hex>",
    )


def run_with_server(
    args: argparse.Namespace,
    *,
    prefix: str,
    env: dict[str, str],
    scenario: Callable[[ServerProcess, Path | None], Coroutine[Any, Any, bool]],
) -> NoReturn:
    """A scratch database (a SQLite file, or evm_fault_<hex> on --pg-url), migrated, a
    server on it, the scenario run against it (with the SQLite file's path, if any), then
    everything removed; kept for inspection when the scenario fails. Exits 0 only if it
    passed."""
    exit_on_sigterm()
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    sqlite_path: Path | None = None
    pg_name: str | None = None
    if args.database == "sqlite":
        sqlite_path = tmp / "fault.db"
        url = f"sqlite+aiosqlite:///{sqlite_path}"
    else:
        pg_name = f"evm_fault_{uuid.uuid4().hex[:12]}"
        run(pg_admin(args.pg_url, f'CREATE DATABASE "{pg_name}"'))
        url = with_database(args.pg_url, pg_name)
    server = ServerProcess(url, tmp, env={**env, "AUTO_MIGRATE": "false"})
    ok = False
    try:
        migrate(url)
        server.start()
        print(f"server pid {server.pid} on {server.url}, database {url}")
        ok = run(scenario(server, sqlite_path))
    finally:
        server.stop()
        if pg_name is not None:
            drop = f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)'
            run(pg_admin(args.pg_url, drop))
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"server log and database kept in {tmp}")
    sys.exit(0 if ok else 1)
