"""Readiness: `/ready` answers 200 when the database answers, its schema is at this
release's migration head and the bus listens, and 503 problem+json naming the failed
check otherwise; like `/health` it needs no key and is never rate limited. The first
API key is created once however many processes start together."""

import asyncio
import time
import uuid

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from app.auth import create_first_key, create_key
from app.db import models
from app.db.migrate import head_revisions
from app.db.session import Database
from app.ids import DEFAULT_ORG_ID
from app.ops.ready import CHECK_TIMEOUT_SECONDS
from app.settings import Settings
from tests.support.in_process import Running, running_app
from tests.support.lanes import make_settings
from tests.support.problems import assert_problem

READY = {"database": "ok", "migrations": "ok", "bus": "ok"}


async def test_ready_when_migrated_and_listening(running: Running) -> None:
    response = await running.client.get("/ready")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ready", "checks": READY}


async def test_probes_need_no_key_and_are_never_rate_limited(
    settings: Settings,
) -> None:
    limited = make_settings(
        settings.database_url, rate_limit_per_second=0.5, rate_limit_burst=1
    )
    async with running_app(limited) as running:
        async with running.app.state.app.database.write() as db:
            await create_key(db, organization_id=uuid.uuid4())
        client = running.client
        assert_problem(await client.get("/v1/sessions"), 401)
        for _ in range(10):
            for path in ("/ready", "/health"):
                response = await client.get(path)
                assert response.status_code == 200, (path, response.text)


async def test_ready_is_503_while_the_schema_is_not_this_releases(
    running: Running, settings: Settings
) -> None:
    """A database another release migrated (here: its version moved back, as a
    rollback of the schema would leave it) must not get this process's traffic."""
    (head,) = head_revisions()
    engine = create_async_engine(settings.database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = '0002'"))
        try:
            response = await running.client.get("/ready")
            problem = assert_problem(response, 503, code="not_ready")
            assert problem["checks"] == {
                **READY,
                "migrations": f"at 0002, this release needs {head}",
            }
            assert (
                problem["detail"] == f"migrations: at 0002, this release needs {head}"
            )
        finally:
            async with engine.begin() as conn:
                await conn.execute(
                    text("UPDATE alembic_version SET version_num = :head"),
                    {"head": head},
                )
    finally:
        await engine.dispose()
    response = await running.client.get("/ready")
    assert response.status_code == 200, response.text


@pytest.mark.postgres_only
async def test_ready_is_503_in_bounded_time_when_the_database_hangs(
    running: Running, settings: Settings
) -> None:
    """A table lock stands in for a database that stopped answering: the probe says
    so within its bound instead of hanging, and recovers with the database."""
    # The app's first request builds FastAPI's route models (up to a second under
    # load with coverage on): made here, so what is timed below is the check alone.
    assert (await running.client.get("/ready")).status_code == 200
    engine = create_async_engine(settings.database_url)
    try:
        async with engine.connect() as holder:
            await holder.execute(text("BEGIN"))
            await holder.execute(
                text("LOCK TABLE alembic_version IN ACCESS EXCLUSIVE MODE")
            )
            started = time.monotonic()
            response = await running.client.get("/ready")
            waited = time.monotonic() - started
            await holder.execute(text("ROLLBACK"))
    finally:
        await engine.dispose()
    problem = assert_problem(response, 503, code="not_ready")
    assert problem["checks"]["database"] == (
        f"no answer within {CHECK_TIMEOUT_SECONDS:g} s"
    )
    assert CHECK_TIMEOUT_SECONDS <= waited < CHECK_TIMEOUT_SECONDS + 1.0, waited
    recovered = await running.client.get("/ready")
    assert recovered.status_code == 200, recovered.text


@pytest.mark.parametrize("processes", [5])
async def test_processes_starting_together_create_one_first_key(
    settings: Settings, processes: int
) -> None:
    """`--first-key` on several replicas at once: one key between them (each its own
    database handle, as separate processes would have)."""
    databases = [Database.from_settings(settings) for _ in range(processes)]

    async def first_key(database: Database) -> str | None:
        async with database.write() as db:
            created = await create_first_key(db)
        return None if created is None else created[1]

    try:
        keys = await asyncio.gather(*(first_key(d) for d in databases))
        created = [key for key in keys if key is not None]
        assert len(created) == 1, keys
        async with databases[0].read() as db:
            rows = (await db.execute(select(models.ApiKey))).scalars().all()
            assert [row.organization_id for row in rows] == [DEFAULT_ORG_ID]
            # Once a key exists (revoked or not), none is created again.
            assert await first_key(databases[0]) is None
            assert await db.scalar(select(func.count()).select_from(models.ApiKey)) == 1
    finally:
        for database in databases:
            await database.dispose()
