"""The write unit of work on the driver connection: the session row carries the newest
input, a message changed behind a writer's back is refused, connections the server
closed are replaced without a ping, and the migration that adds `last_input_sequence`
fills it in for existing sessions."""

import asyncio
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import create_async_engine

from app.db import models
from app.db.migrate import upgrade
from app.db.rows import StaleMessage
from app.db.session import Database
from app.ids import DEFAULT_ORG_ID, uuid7
from app.journal import checkpoint
from app.journal.sessions import lock_session
from tests.support.api import create_session, list_events, post_message
from tests.support.database import new_session_row
from tests.support.in_process import Running
from tests.support.waits import wait_idle


def database(running: Running) -> Database:
    db: Database = running.app.state.app.database
    return db


async def test_the_session_row_carries_the_newest_input(running: Running) -> None:
    handle = database(running)
    sid = await new_session_row(handle)
    async with handle.write() as db:
        session = await lock_session(db, sid)
        assert session is not None
        assert session.last_input_sequence == 0
        written, _ = await checkpoint.append_user_message(
            db,
            session,
            content=[{"type": "text", "text": "first"}],
            visibility="visible",
            extra={},
            client_message_id=None,
            start_turn=False,
        )
        await checkpoint.open_agent_message(db, session, turn_id=uuid7())
    assert written.message is not None
    async with handle.write() as db:
        locked = await lock_session(db, sid)
    assert locked is not None
    # The agent message came later; the newest input is still the user message.
    assert locked.last_sequence == 2
    assert locked.last_input_sequence == written.message.sequence == 1
    assert (locked.visible_message_count, locked.internal_message_count) == (2, 0)


async def test_a_message_changed_since_it_was_read_is_refused(running: Running) -> None:
    handle = database(running)
    sid = await new_session_row(handle)
    async with handle.write() as db:
        session = await lock_session(db, sid)
        assert session is not None
        opened = await checkpoint.open_agent_message(db, session, turn_id=uuid7())
    assert opened.message is not None
    mid = opened.message.id
    async with handle.write() as db:
        stale = await checkpoint.get_message_for_update(db, mid)
    async with handle.write() as db:
        session = await lock_session(db, sid)
        assert session is not None
        fresh = await checkpoint.get_message_for_update(db, mid)
        await checkpoint.commit_step(
            db, session, fresh, step_id="s1", parts=[{"type": "text", "text": "a"}]
        )

    async def rows() -> tuple[list[int], int]:
        async with handle.read() as db:
            events = list(
                await db.scalars(
                    select(models.Event.sequence).where(models.Event.session_id == sid)
                )
            )
            revision = await db.scalar(
                select(models.Message.revision).where(models.Message.id == mid)
            )
        assert revision is not None
        return events, revision

    async def commit_stale() -> None:
        async with handle.write() as db:
            session = await lock_session(db, sid)
            assert session is not None
            await checkpoint.commit_step(
                db, session, stale, step_id="s2", parts=[{"type": "text", "text": "b"}]
            )

    before = await rows()
    with pytest.raises(StaleMessage):
        await commit_stale()
    # Nothing of the refused checkpoint was written, the session row included.
    assert await rows() == before == ([1, 2], 2)
    async with handle.write() as db:
        locked = await lock_session(db, sid)
    assert locked is not None
    assert locked.last_sequence == 2


@pytest.mark.postgres_only
async def test_connections_the_server_closed_are_replaced_at_checkout(
    running: Running,
) -> None:
    """No pre-ping: a pooled connection whose server end went away (a restart, an
    administrator) is dropped at checkout and the request still succeeds."""
    handle = database(running)
    client = running.client
    sid = await create_session(client, "terminated")
    await post_message(client, sid, "warm the pool")
    await wait_idle(client, sid)
    pooled = handle.writer.pool.checkedin()  # type: ignore[attr-defined]
    assert pooled >= 1
    async with handle.writer.connect() as conn:
        terminated = await conn.scalar(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = 'evermirror' AND pid <> pg_backend_pid()"
                " AND datname = current_database()"
            )
        )
    assert terminated is not None
    assert terminated >= pooled - 1
    await asyncio.sleep(0.2)  # asyncpg sees the closed sockets
    for index in range(3):
        response = await client.post(
            f"/v1/sessions/{sid}/messages",
            json={"message": {"content": [{"type": "text", "text": f"after {index}"}]}},
        )
        assert response.status_code == 201, response.text
    await wait_idle(client, sid)
    log = await list_events(client, sid)
    assert [e["sequence"] for e in log] == list(range(1, len(log) + 1))


def test_the_migration_fills_in_the_newest_input(tmp_path: Path) -> None:
    """Sessions that existed before `last_input_sequence` get the sequence of their
    newest user message (portable SQL: the SQLite lane is enough to run it)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0001")
    busy, empty = uuid.uuid4(), uuid.uuid4()
    now = "2026-12-01 10:00:00.000000"
    session_sql = text(
        "INSERT INTO sessions (id, organization_id, status, tags, attributes,"
        " last_sequence, visible_message_count, internal_message_count, created_at,"
        " updated_at, last_activity_at)"
        " VALUES (:id, :org, 'idle', '[]', '{}', 4, 3, 0, :now, :now, :now)"
    )
    message_sql = text(
        "INSERT INTO messages (id, session_id, sequence, role, state, visibility,"
        " revision, content, extra, snapshot, changed_sequence, created_at, updated_at)"
        " VALUES (:id, :sid, :seq, :role, 'done', 'visible', 1, '[]', '{}', '{}',"
        " :seq, :now, :now)"
    )

    async def seed() -> None:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                for sid in (busy, empty):
                    org = DEFAULT_ORG_ID.hex
                    await conn.execute(
                        session_sql, {"id": sid.hex, "org": org, "now": now}
                    )
                for seq, role in ((1, "user"), (3, "user"), (4, "agent")):
                    await conn.execute(
                        message_sql,
                        {
                            "id": uuid.uuid4().hex,
                            "sid": busy.hex,
                            "seq": seq,
                            "role": role,
                            "now": now,
                        },
                    )
        finally:
            await engine.dispose()

    async def newest_inputs() -> dict[str, int]:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(
                    text("SELECT id, last_input_sequence FROM sessions")
                )
                return {r[0]: r[1] for r in rows}
        finally:
            await engine.dispose()

    asyncio.run(seed())
    upgrade(url)
    assert asyncio.run(newest_inputs()) == {busy.hex: 3, empty.hex: 0}
