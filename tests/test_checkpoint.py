"""The checkpoint writer: every durable change is one transaction that bumps the revision,
re-renders the snapshot and appends upstream events with dense sequences."""

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiosqlite
import orjson
import pytest
from sqlalchemy import select

from app.db import models
from app.db.rows import LockedSession, MessageRow
from app.db.session import Database
from app.db.writes import Write
from app.journal import checkpoint
from app.journal.actions import action_part, append_actions
from app.journal.events import EventSpec
from app.journal.parts import CheckpointError, ToolTransitionError
from app.journal.sessions import lock_session
from app.journal.tool_calls import tool_transition
from tests.support.database import new_session_row
from tests.support.in_process import Running


def database(running: Running) -> Database:
    db: Database = running.app.state.app.database
    return db


async def events(db_handle: Database, session_id: uuid.UUID) -> list[tuple[int, str]]:
    async with db_handle.read() as db:
        rows = await db.execute(
            select(models.Event.sequence, models.Event.type)
            .where(models.Event.session_id == session_id)
            .order_by(models.Event.sequence)
        )
        return [(r[0], r[1]) for r in rows]


async def snapshot(db_handle: Database, message_id: uuid.UUID) -> dict[str, Any]:
    async with db_handle.read() as db:
        row = await db.get(models.Message, message_id)
        assert row is not None
        value: dict[str, Any] = orjson.loads(row.snapshot)
        return value


@asynccontextmanager
async def locked(
    db_handle: Database, session_id: uuid.UUID, message_id: uuid.UUID
) -> AsyncIterator[tuple[Write, LockedSession, MessageRow]]:
    """A write unit of work holding the session's lock and the message, as the runner
    does for each checkpoint."""
    async with db_handle.write() as db:
        session = await lock_session(db, session_id)
        assert session is not None
        message = await checkpoint.get_message_for_update(db, message_id)
        yield db, session, message


async def test_agent_message_lifecycle_bumps_revision_and_appends_events(
    running: Running,
) -> None:
    handle = database(running)
    sid = await new_session_row(handle)
    turn = uuid.uuid4()
    async with handle.write() as db:
        session = await lock_session(db, sid)
        assert session is not None
        opened = await checkpoint.open_agent_message(db, session, turn_id=turn)
        assert opened.message is not None
        mid = opened.message.id
    first = await snapshot(handle, mid)
    assert (first["revision"], first["state"], first["content"]) == (1, "streaming", [])

    async with locked(handle, sid, mid) as (db, session, message):
        parts: list[dict[str, Any]] = [
            {"type": "text", "text": "calling"},
            {"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {}},
            {"type": "provider_opaque", "provider": "x", "content": {"k": 1}},
        ]
        await checkpoint.commit_step(db, session, message, step_id="s1", parts=parts)
    step = await snapshot(handle, mid)
    assert step["revision"] == 2
    assert [p["type"] for p in step["content"]] == ["text", "tool_call"]
    assert {p["step_id"] for p in step["content"]} == {"s1"}
    assert [p["part_id"] for p in step["content"]] == [
        "agent-text:1",
        "agent-tool_call:2",
    ]

    interaction = {"interaction_id": "i1", "kind": "approval", "status": "approved"}
    async with locked(handle, sid, mid) as (db, session, message):
        await tool_transition(
            db,
            session,
            message,
            tool_call_id="c1",
            status="running",
            interaction=interaction,
        )
    running_snap = await snapshot(handle, mid)
    tool = running_snap["content"][1]
    assert (tool["part_id"], tool["status"]) == ("agent-tool_call:2", "running")
    assert running_snap["content"][-1]["type"] == "interaction"

    async with locked(handle, sid, mid) as (db, session, message):
        await tool_transition(
            db,
            session,
            message,
            tool_call_id="c1",
            status="completed",
            result={"answer": 42},
            interaction={**interaction, "status": "resolved"},
        )
        await checkpoint.close_message(
            db, session, message, error=("stopped", "Stopped")
        )
    final = await snapshot(handle, mid)
    types = [p["type"] for p in final["content"]]
    assert types == ["text", "tool_call", "interaction", "tool_result", "error"]
    assert final["content"][1]["status"] == "completed"
    assert (
        final["content"][2]["status"] == "resolved"
    )  # updated in place, not duplicated
    assert (final["revision"], final["state"]) == (5, "done")
    # The hidden provider_opaque part keeps its position: sequences only increase.
    assert [p["sequence"] for p in final["content"]] == [1, 2, 4, 5, 6]

    log = await events(handle, sid)
    assert [s for s, _ in log] == list(range(1, len(log) + 1))
    assert [t for _, t in log] == [
        "output.message.started",
        "output.message.completed",
        "tool.started",
        "tool.completed",
        "output.message.completed",
    ]
    async with handle.read() as db:
        row = await db.get(models.Message, mid)
        assert row is not None
        # provider_opaque is kept for replay but never on the wire.
        assert any(p["type"] == "provider_opaque" for p in row.content)
        assert row.changed_sequence == log[-1][0]


async def test_closed_message_refuses_further_checkpoints(running: Running) -> None:
    handle = database(running)
    sid = await new_session_row(handle)
    async with handle.write() as db:
        session = await lock_session(db, sid)
        assert session is not None
        opened = await checkpoint.open_agent_message(db, session, turn_id=uuid.uuid4())
        assert opened.message is not None
        await checkpoint.close_message(db, session, opened.message)
        mid = opened.message.id
    before = await events(handle, sid)
    try:
        async with locked(handle, sid, mid) as (db, session, message):
            await checkpoint.commit_step(db, session, message, step_id="s", parts=[])
    except CheckpointError:
        pass
    else:
        raise AssertionError("a closed message accepted a step")
    assert await events(handle, sid) == before


async def test_action_joins_streaming_message_or_stands_alone(running: Running) -> None:
    handle = database(running)
    sid = await new_session_row(handle)
    turn = uuid.uuid4()
    changed = EventSpec("session.model.changed", {"model_id": "model_" + "1" * 32})
    async with handle.write() as db:
        session = await lock_session(db, sid)
        assert session is not None
        standalone = await append_actions(
            db,
            session,
            turn_id=turn,
            parts=[action_part("model_changed", "Model changed", {})],
            events=[changed],
        )
        opened = await checkpoint.open_agent_message(db, session, turn_id=turn)
        joined = await append_actions(
            db,
            session,
            turn_id=turn,
            parts=[action_part("approval_mode_changed", "Mode", {})],
        )
    assert standalone.message is not None
    assert opened.message is not None
    assert joined.message is not None
    alone = await snapshot(handle, standalone.message.id)
    assert alone["state"] == "done"
    assert [p["type"] for p in alone["content"]] == ["action"]
    assert joined.message.id == opened.message.id
    shared = await snapshot(handle, opened.message.id)
    assert [p["action_type"] for p in shared["content"]] == ["approval_mode_changed"]
    assert shared["revision"] == opened.message.revision + 1
    assert shared["state"] == "streaming"
    log = await events(handle, sid)
    assert [t for _, t in log][:2] == [
        "session.model.changed",
        "output.message.completed",
    ]
    assert alone["sequence"] == 2  # the sequence of the event that created it


# ---- the tool life cycle (app/journal/lifecycle.py) -------------------------------------


async def message_with_tool(handle: Database, sid: uuid.UUID) -> uuid.UUID:
    """A streaming agent message whose committed step holds tool call `c1`, ready."""
    async with handle.write() as db:
        session = await lock_session(db, sid)
        assert session is not None
        opened = await checkpoint.open_agent_message(db, session, turn_id=uuid.uuid4())
        assert opened.message is not None
        tool = {"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {}}
        await checkpoint.commit_step(
            db, session, opened.message, step_id="s1", parts=[tool]
        )
        return opened.message.id


async def move(handle: Database, sid: uuid.UUID, mid: uuid.UUID, status: str) -> None:
    async with locked(handle, sid, mid) as (db, session, message):
        await tool_transition(
            db,
            session,
            message,
            tool_call_id="c1",
            status=status,
            result={"ok": True} if status == "completed" else None,
            error="no" if status == "failed" else None,
        )


ALLOWED_PATHS = [
    (["running", "completed"], ["tool.started", "tool.completed"]),
    (["running", "failed"], ["tool.started", "tool.completed"]),
    (
        ["awaiting_approval", "running", "completed"],
        ["output.message.completed", "tool.started", "tool.completed"],
    ),
    (["awaiting_approval", "failed"], ["output.message.completed", "tool.completed"]),
    (["awaiting_client", "completed"], ["tool.call_requested", "tool.completed"]),
    (["awaiting_client", "failed"], ["tool.call_requested", "tool.completed"]),
    (["failed"], ["tool.completed"]),
]

FORBIDDEN = [
    ([], "completed"),
    ([], "input_streaming"),
    ([], "ready"),
    (["running"], "awaiting_client"),
    (["running"], "running"),
    (["running", "completed"], "running"),
    (["running", "completed"], "failed"),
    (["awaiting_client"], "running"),
    (["awaiting_approval"], "completed"),
    (["awaiting_approval"], "awaiting_client"),
    (["failed"], "completed"),
]


async def test_each_allowed_tool_transition_is_one_checkpoint(running: Running) -> None:
    handle = database(running)
    for path, types in ALLOWED_PATHS:
        sid = await new_session_row(handle)
        mid = await message_with_tool(handle, sid)
        start = len(await events(handle, sid))
        revision = (await snapshot(handle, mid))["revision"]
        for status in path:
            await move(handle, sid, mid, status)
            revision += 1
            snap = await snapshot(handle, mid)
            assert snap["revision"] == revision, path
            call = next(p for p in snap["content"] if p["type"] == "tool_call")
            assert (call["part_id"], call["status"]) == ("agent-tool_call:1", status)
        assert [t for _, t in (await events(handle, sid))[start:]] == types, path
        results = [p for p in snap["content"] if p["type"] == "tool_result"]
        assert len(results) == 1, path


async def test_an_impossible_tool_transition_raises_and_writes_nothing(
    running: Running,
) -> None:
    handle = database(running)
    for path, target in FORBIDDEN:
        sid = await new_session_row(handle)
        mid = await message_with_tool(handle, sid)
        for status in path:
            await move(handle, sid, mid, status)
        before = (await events(handle, sid), await snapshot(handle, mid))
        with pytest.raises(ToolTransitionError):
            await move(handle, sid, mid, target)
        assert (await events(handle, sid), await snapshot(handle, mid)) == before, (
            path,
            target,
        )


async def test_a_step_commits_its_tools_ready_and_never_closes_over_one(
    running: Running,
) -> None:
    handle = database(running)
    sid = await new_session_row(handle)
    async with handle.write() as db:
        session = await lock_session(db, sid)
        assert session is not None
        opened = await checkpoint.open_agent_message(db, session, turn_id=uuid.uuid4())
        assert opened.message is not None
        mid = opened.message.id
    before = (await events(handle, sid), await snapshot(handle, mid))
    tool = {"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {}}
    for status, close in [
        ("running", False),
        ("awaiting_client", False),
        ("input_streaming", False),
        ("completed", False),
        ("ready", True),
    ]:
        with pytest.raises(ToolTransitionError):
            async with locked(handle, sid, mid) as (db, session, message):
                await checkpoint.commit_step(
                    db,
                    session,
                    message,
                    step_id="s1",
                    parts=[{**tool, "status": status}],
                    close=close,
                )
        assert (await events(handle, sid), await snapshot(handle, mid)) == before
    # Without a status, a tool call enters ready (an older part's "requested" too).
    async with locked(handle, sid, mid) as (db, session, message):
        await checkpoint.commit_step(
            db,
            session,
            message,
            step_id="s1",
            parts=[tool, {**tool, "id": "c2", "status": "requested"}],
        )
    snap = await snapshot(handle, mid)
    assert [p["status"] for p in snap["content"]] == ["ready", "ready"]


async def test_closing_a_message_fails_its_unfinished_tools(running: Running) -> None:
    handle = database(running)
    sid = await new_session_row(handle)
    mid = await message_with_tool(handle, sid)
    await move(handle, sid, mid, "awaiting_client")
    start = len(await events(handle, sid))
    async with locked(handle, sid, mid) as (db, session, message):
        await checkpoint.close_message(
            db, session, message, error=("interrupted", "Interrupted")
        )
    snap = await snapshot(handle, mid)
    assert snap["state"] == "done"
    assert [(p["type"], p.get("status")) for p in snap["content"]] == [
        ("tool_call", "failed"),
        ("tool_result", None),
        ("error", None),
    ]
    assert snap["content"][1]["error"] == "Interrupted"
    assert [t for _, t in (await events(handle, sid))[start:]] == [
        "tool.completed",
        "output.message.completed",
    ]


@pytest.mark.sqlite_only(reason="counts trips to aiosqlite's thread")
async def test_a_sqlite_checkpoint_takes_three_trips_to_the_connections_thread(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BEGIN with the session's lock, the message, session row and events together,
    and COMMIT: each trip to aiosqlite's thread costs ~22 µs of CPU, its statements
    ~1 each."""
    handle = database(running)
    sid = await new_session_row(handle)
    trips = 0
    execute: Any = aiosqlite.Connection._execute

    async def counted(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal trips
        trips += 1
        return await execute(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    async with handle.write() as db:
        session = await lock_session(db, sid)
        assert session is not None
        opened = await checkpoint.open_agent_message(db, session, turn_id=uuid.uuid4())
    assert trips == 3
    assert opened.message is not None
    assert (await snapshot(handle, opened.message.id))["state"] == "streaming"
    assert [t for _, t in await events(handle, sid)][-1] == "output.message.started"
