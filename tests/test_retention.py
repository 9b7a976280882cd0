"""Retention: sessions past their `expires_at` (set on create and by PATCH) or without
activity for SESSION_RETENTION_DAYS are purged, exactly those, never one whose turn
runs; the dry run lists the same ones; `evermirror purge` and the service's own purge
task do it, and /metrics counts it."""

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import update

from app.db import models
from app.db.session import Database
from app.db.types import utcnow
from app.ids import parse_id
from app.sessions import retention
from app.settings import Settings
from tests.support.api import uuid_of
from tests.support.cli import run_cli
from tests.support.in_process import Running, running_app
from tests.support.lanes import make_settings
from tests.support.problems import assert_problem
from tests.support.waits import wait_until

PAST = "2020-01-01T00:00:00Z"
FUTURE = "2999-01-01T00:00:00Z"


@pytest.fixture
async def kept_30_days(settings: Settings) -> AsyncIterator[Running]:
    fresh = make_settings(settings.database_url, session_retention_days=30)
    async with running_app(fresh) as running:
        yield running


async def new_session(client: httpx.AsyncClient, **body: str) -> str:
    created = await client.post("/v1/sessions", json=body)
    assert created.status_code == 201, created.text
    sid: str = created.json()["id"]
    return sid


async def age(
    database: Database, sid: str, days: int, *, running: bool = False
) -> None:
    """Move the session's last activity `days` back (and mark a turn running)."""
    values: dict[str, object] = {"last_activity_at": utcnow() - timedelta(days=days)}
    if running:
        values["active_turn_id"] = uuid.uuid4()
    async with database.write() as db:
        conn = await db.core()
        await conn.execute(
            update(models.Session)
            .where(models.Session.id == uuid_of(sid))
            .values(values)
        )


async def exists(client: httpx.AsyncClient, sid: str) -> bool:
    return (await client.get(f"/v1/sessions/{sid}")).status_code == 200


async def test_exactly_the_expired_sessions_go(kept_30_days: Running) -> None:
    client = kept_30_days.client
    state = kept_30_days.app.state.app
    expired = await new_session(client, expires_at=PAST)
    idle = await new_session(client)
    await age(state.database, idle, 40)
    fresh = await new_session(client)
    later = await new_session(client, expires_at=FUTURE)
    recent = await new_session(client)
    await age(state.database, recent, 29)
    busy = await new_session(client)
    await age(state.database, busy, 40, running=True)

    planned = await retention.expired(state.database, state.settings)
    assert {(str(e.session_id), e.reason) for e in planned} == {
        (str(uuid_of(expired)), "expires_at"),
        (str(uuid_of(idle)), "retention"),
    }
    # The dry run deletes nothing.
    assert await exists(client, expired)

    purged = await retention.purge(state.database, state.settings)
    assert sorted(e.session_id for e in purged) == sorted(e.session_id for e in planned)
    for sid in (expired, idle):
        assert not await exists(client, sid)
    for sid in (fresh, later, recent, busy):
        assert await exists(client, sid)
    assert await retention.purge(state.database, state.settings) == []


async def test_batches_purge_all(kept_30_days: Running) -> None:
    client = kept_30_days.client
    state = kept_30_days.app.state.app
    ids = [await new_session(client, expires_at=PAST) for _ in range(5)]
    batched = state.settings.model_copy(update={"purge_batch": 2})
    counted: list[int] = []
    purged = await retention.purge(state.database, batched, counted.append)
    assert len(purged) == 5
    assert counted == [2, 2, 1]
    for sid in ids:
        assert not await exists(client, sid)


async def test_expires_at_on_create_and_patch(client: httpx.AsyncClient) -> None:
    sid = await new_session(client, expires_at=FUTURE)
    assert (await client.get(f"/v1/sessions/{sid}")).json()["expires_at"] == (
        "2999-01-01T00:00:00.000000Z"
    )
    patched = await client.patch(f"/v1/sessions/{sid}", json={"expires_at": None})
    assert patched.status_code == 200, patched.text
    assert "expires_at" not in patched.json()
    bad = await client.patch(f"/v1/sessions/{sid}", json={"expires_at": 1700000000})
    assert_problem(bad, 422)
    assert "expires_at" not in (await client.get(f"/v1/sessions/{sid}")).json()


async def test_the_cli_dry_run_lists_what_purge_deletes(
    kept_30_days: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = kept_30_days.client
    url = kept_30_days.app.state.app.settings.database_url
    expired = await new_session(client, expires_at=PAST)
    kept = await new_session(client)
    monkeypatch.setenv("SESSION_RETENTION_DAYS", "30")
    dry = await run_cli(url, "purge", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert [line.split("\t")[0] for line in lines] == [expired]
    assert lines[0].endswith("\texpires_at")
    assert "1 session(s) would be purged" in dry.stderr
    assert await exists(client, expired)
    done = await run_cli(url, "purge")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == lines
    assert not await exists(client, expired)
    assert await exists(client, kept)
    assert parse_id("session", kept)


async def test_the_service_purges_on_its_own(settings: Settings) -> None:
    fast = make_settings(settings.database_url, purge_interval_seconds=0.2)
    async with running_app(fast) as running:
        client = running.client
        sid = await new_session(client, expires_at=PAST)

        async def gone() -> bool:
            return not await exists(client, sid)

        await wait_until(gone, "the purge task to delete the expired session")
        scraped = (await client.get("/metrics")).text
        assert "evermirror_sessions_purged_total 1.0" in scraped
