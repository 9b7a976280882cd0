"""The suite's fixtures and its lane rule: every database test runs on SQLite, and also
on PostgreSQL when TEST_DATABASE_URL is set; a test marked `postgres_only` or
`sqlite_only` is skipped on the other lane, saying why. Schemas come from the
migrations we ship. What test modules import lives in tests/support."""

import asyncio
import os
import shutil
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from everruns_sdk import Everruns
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from app.backend import Backend
from app.db.migrate import upgrade
from app.settings import Settings, normalize_database_url
from tests.support.in_process import Running, running_app
from tests.support.lanes import (
    LANES,
    PG_URL,
    SQLITE,
    lane_skip,
    make_settings,
    truncate,
)
from tests.support.nats import Nats
from tests.support.servers import Server, start_server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The lane markers: `postgres_only` skips a test on the SQLite lane (and where
    there is no PostgreSQL lane), `sqlite_only` on the PostgreSQL lane."""
    for item in items:
        reason = lane_skip(item)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


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


@pytest.fixture(params=LANES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database on the lane under test."""
    if request.param == SQLITE:
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "test.db"
        shutil.copy(template, path)
        return f"sqlite+aiosqlite:///{path}"
    url: str = request.getfixturevalue("pg_database")
    return url  # emptied by the `settings` fixture


@pytest.fixture
async def settings(database_url: str) -> Settings:
    settings = make_settings(database_url)
    if settings.backend is Backend.POSTGRESQL:
        await truncate(database_url)
    return settings


@pytest.fixture
async def running(settings: Settings) -> AsyncIterator[Running]:
    async with running_app(settings) as app:
        yield app


@pytest.fixture
async def client(running: Running) -> httpx.AsyncClient:
    return running.client


@pytest.fixture
def server(settings: Settings, tmp_path: Path) -> Iterator[Server]:
    srv = start_server(settings.database_url, tmp_path)
    yield srv
    srv.stop()


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


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[Nats]:
    """A nats-server of the test's own (tests/support/nats.py)."""
    server = Nats(tmp_path)
    server.start()
    yield server
    server.stop()
