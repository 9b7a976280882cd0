"""Test lanes and fixtures: every database test runs on SQLite, and also on PostgreSQL when
TEST_DATABASE_URL is set. Schemas come from the migrations we ship."""

import asyncio
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from everruns_sdk import Everruns
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.migrate import upgrade
from app.main import create_app
from app.settings import Settings, normalize_database_url

ROOT = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get("TEST_DATABASE_URL")
LANES = ["sqlite"] + (["postgresql"] if PG_URL else [])
TABLES = ("composer_summaries", "events", "messages", "api_keys", "sessions")


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    upgrade(f"sqlite+aiosqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A PostgreSQL database of our own for this run, migrated once, dropped at the end."""
    assert PG_URL is not None
    base = make_url(normalize_database_url(PG_URL))
    name = f"evermirror_test_{os.getpid()}"

    async def admin(sql: str) -> None:
        engine = create_async_engine(base, isolation_level="AUTOCOMMIT")
        async with engine.connect() as conn:
            await conn.execute(text(sql))
        await engine.dispose()

    asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    url = base.set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    yield url
    asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def truncate(url: str) -> None:
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {', '.join(TABLES)} CASCADE"))
    await engine.dispose()


@pytest.fixture(params=LANES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database on the lane under test."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "test.db"
        shutil.copy(template, path)
        return f"sqlite+aiosqlite:///{path}"
    url: str = request.getfixturevalue("pg_database")
    return url  # emptied by the `settings` fixture


def test_settings(database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "auto_migrate": False,
        "scripted_delay_ms": 1,
        "sse_heartbeat_seconds": 1.0,
        "sse_cycle_seconds": 5.0,
        "runner_sweep_seconds": 1.0,
        # In-process clients share one address; tests of the limiter set their own rate.
        "rate_limit_per_second": 0.0,
        **overrides,
    }
    return Settings(**values)


@pytest.fixture
async def settings(database_url: str) -> Settings:
    if database_url.startswith("postgresql"):
        await truncate(database_url)
    return test_settings(database_url)


@dataclass
class Running:
    app: Any
    client: httpx.AsyncClient


@asynccontextmanager
async def running_app(settings: Settings) -> AsyncIterator[Running]:
    """The app with its lifespan running, called in-process over httpx."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test"
        ) as client:
            yield Running(app, client)


@pytest.fixture
async def running(settings: Settings) -> AsyncIterator[Running]:
    async with running_app(settings) as app:
        yield app


@pytest.fixture
async def client(running: Running) -> httpx.AsyncClient:
    return running.client


def free_port() -> int:
    """A bindable port picked at random from a wide range: the kernel's ephemeral
    assignment is sequential, so concurrent runs asking it would often collide."""
    for _ in range(100):
        port = random.randint(20_000, 60_000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


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
    """A real `python -m app serve` process on loopback; waits until /health answers."""
    port = port or free_port()
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
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port)],
        cwd=ROOT,
        env=environment,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return Server(url, process, environment, log)
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server did not start: {log.read_text()}")


@pytest.fixture
def server(settings: Settings, tmp_path: Path) -> Iterator[Server]:
    srv = start_server(settings.database_url, tmp_path)
    yield srv
    srv.stop()


@pytest.fixture
def pg_settings(settings: Settings) -> Settings:
    """`settings`, on the PostgreSQL lane only (tests of several processes)."""
    if not os.environ.get("TEST_DATABASE_URL") or not settings.database_url.startswith(
        "postgresql"
    ):
        pytest.skip("needs PostgreSQL (set TEST_DATABASE_URL)")
    return settings


@pytest.fixture
async def sdk(server: Server) -> AsyncIterator[Everruns]:
    """The official Python client against `server`, with the SDK's own base URL shape
    (`.../api`) and a bare API key (open mode accepts any)."""
    client = Everruns(
        api_key="evm_any_key_in_open_mode",
        base_url=f"{server.url}/api",
        org_id="org_00000000000000000000000000000001",
    )
    # The management client warns (once per process) that agents should be called
    # through AgentClient; that is upstream's advice, not a failure here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield client
    await client.close()
