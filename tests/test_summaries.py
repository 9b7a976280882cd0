"""Composer summaries over HTTP, offline: the scripted driver goes through the Composer
too, so a server with a small context window (MODEL_CONTEXT_TOKENS=1000) summarizes its
history. A summary is derived data: stored in its own table, it takes no sequence,
never shows in messages, events or streams, is rebuilt when missing, and goes with its
session."""

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import delete, select

from app.db import models
from app.db.session import Database
from app.settings import Settings
from tests.support.api import list_events, list_messages, post_message, uuid_of
from tests.support.servers import Server, live_server_fixture
from tests.support.waits import wait_idle

live_server = live_server_fixture("summaries", MODEL_CONTEXT_TOKENS="1000")


@pytest.fixture
async def api(live_server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as client:
        yield client


@pytest.fixture
async def database(live_server: Server) -> AsyncIterator[Database]:
    database = Database.from_settings(
        Settings(database_url=live_server.env["DATABASE_URL"])
    )
    yield database
    await database.dispose()


async def summaries(database: Database, sid: str) -> list[Any]:
    async with database.read() as db:
        rows = await db.execute(
            select(
                models.ComposerSummary.first_sequence,
                models.ComposerSummary.last_sequence,
                models.ComposerSummary.text,
            )
            .where(models.ComposerSummary.session_id == uuid_of(sid))
            .order_by(models.ComposerSummary.last_sequence)
        )
        return list(rows.all())


def words(tag: str, count: int = 250) -> str:
    return " ".join(f"{tag}{i}" for i in range(count))


async def test_history_past_the_budget_is_summarized_as_derived_data(
    api: httpx.AsyncClient, database: Database
) -> None:
    response = await api.post("/v1/sessions", json={"title": "summaries"})
    sid = response.json()["id"]
    for tag in ("alpha", "beta"):
        await post_message(api, sid, words(tag))
        await wait_idle(api, sid)
    stored = await summaries(database, sid)
    assert len(stored) == 1
    first, last, text = stored[0]
    assert first == 1
    # The first exchange (user at 1, agent at 5) is what no longer fit.
    page = await list_messages(api, sid)
    sequences = [m["sequence"] for m in page["data"]]
    assert last == sequences[1]
    assert "alpha0 alpha1" in text

    # Nothing of it in messages, events or the session's sequences.
    assert page["total"] == 4
    assert [m["role"] for m in page["data"]] == ["user", "agent", "user", "agent"]
    events = await list_events(api, sid)
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert set(sequences) <= {e["sequence"] for e in events}
    assert all("summar" not in e["type"] for e in events)
    assert text not in str(events)
    assert text not in str(page)

    # Rebuilt when missing.
    async with database.write() as db:
        conn = await db.core()
        await conn.execute(
            delete(models.ComposerSummary).where(
                models.ComposerSummary.session_id == uuid_of(sid)
            )
        )
    await post_message(api, sid, words("gamma"))
    await wait_idle(api, sid)
    rebuilt = await summaries(database, sid)
    assert rebuilt
    assert rebuilt[-1][1] > last

    # Deleting the session deletes its summaries.
    assert (await api.delete(f"/v1/sessions/{sid}")).status_code == 204
    assert await summaries(database, sid) == []


async def test_a_short_history_is_not_summarized(
    api: httpx.AsyncClient, database: Database
) -> None:
    response = await api.post("/v1/sessions", json={"title": "short"})
    sid = response.json()["id"]
    await post_message(api, sid, "hello there")
    await wait_idle(api, sid)
    await post_message(api, sid, "and again")
    await wait_idle(api, sid)
    assert await summaries(database, sid) == []
