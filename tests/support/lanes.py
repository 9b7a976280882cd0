"""The database lanes: every database test runs on SQLite, and also on PostgreSQL when
TEST_DATABASE_URL is set. A test is on a lane through a parameter whose values are
LANES (the `database_url` fixture, a module's shared server, or its own); the markers
`postgres_only` and `sqlite_only` keep it to one (tests/conftest.py skips it on the
other, saying why)."""

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.backend import Backend
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PG_URL = os.environ.get("TEST_DATABASE_URL")
SQLITE, POSTGRESQL = Backend.SQLITE.value, Backend.POSTGRESQL.value
LANES = [SQLITE] + ([POSTGRESQL] if PG_URL else [])
TABLES = (
    "feedback",
    "composer_summaries",
    "events",
    "messages",
    "api_keys",
    "sessions",
)

NEEDS_POSTGRESQL = "needs PostgreSQL (set TEST_DATABASE_URL)"
NEEDS_SQLITE = "needs SQLite"


def lane_of(item: pytest.Item) -> str | None:
    """The lane `item` runs on: the value of its lane parameter, or None for a test
    that is on no lane (it makes its own database, or needs none)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    for value in callspec.params.values():
        if value in (SQLITE, POSTGRESQL):
            return str(value)
    return None


def lane_skip(item: pytest.Item) -> str | None:
    """Why `item` does not run here, by its `postgres_only` or `sqlite_only` marker
    (`reason=` overrides the default), or None when it runs. A test on no lane that
    needs PostgreSQL runs only when there is a PostgreSQL lane."""
    lane = lane_of(item)
    postgres_only = item.get_closest_marker("postgres_only")
    if postgres_only is not None and (lane == SQLITE or PG_URL is None):
        return str(postgres_only.kwargs.get("reason", NEEDS_POSTGRESQL))
    sqlite_only = item.get_closest_marker("sqlite_only")
    if sqlite_only is not None and lane == POSTGRESQL:
        return str(sqlite_only.kwargs.get("reason", NEEDS_SQLITE))
    return None


async def truncate(url: str) -> None:
    """Empty every table of a PostgreSQL database."""
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {', '.join(TABLES)} CASCADE"))
    await engine.dispose()


def make_settings(database_url: str, **overrides: Any) -> Settings:
    """The service's settings for a test: fast heartbeats, sweeps and scripted model,
    no limiter; `overrides` are fields of Settings."""
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


def lane_database_url(request: pytest.FixtureRequest, directory: Path) -> str:
    """A migrated, empty database on the lane `request.param` ("sqlite" or
    "postgresql"), for a server shared by the tests of one module (each test uses
    sessions of its own)."""
    if request.param == SQLITE:
        template: Path = request.getfixturevalue("sqlite_template")
        path = directory / "live.db"
        shutil.copy(template, path)
        return f"sqlite+aiosqlite:///{path}"
    url: str = request.getfixturevalue("pg_database")
    # Start from an empty database: keys or sessions left by earlier modules would change
    # what this server answers (a key makes every request need one).
    asyncio.run(truncate(url))
    return url
