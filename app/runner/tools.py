"""Tools of a running turn: a built-in tool runs between two checkpoints (`running`,
then its outcome); one that requires approval first waits, holding the turn, for the
decision; client-side tools make the turn wait durably for their results."""

import asyncio
import contextlib
import copy
import time
from typing import Any

from app.db.rows import LockedSession, MessageRow
from app.db.writes import Write
from app.ids import format_id, uuid7
from app.journal import lifecycle
from app.journal.tool_calls import request_client_tools, tool_transition
from app.runner import queries
from app.runner.builtin_tools import run_tool as run_builtin
from app.runner.drivers.base import ModelError, ToolCall
from app.runner.fence import TurnCancelled, WriteUnit
from app.runner.progress import TurnProgress
from app.runner.runtime import Runtime


def tool_write(
    turn: TurnProgress, tool_call_id: str, status: str, **outcome: Any
) -> WriteUnit:
    """One tool call's move to `status` (with its result or error, once it ran)."""

    async def write(db: Write, session: LockedSession) -> MessageRow | None:
        assert turn.message is not None
        message = copy.copy(turn.message)
        await tool_transition(
            db, session, message, tool_call_id=tool_call_id, status=status, **outcome
        )
        return message

    return write


def client_request_write(turn: TurnProgress, tool_call_ids: list[str]) -> WriteUnit:
    """Client-side tools: their parts move to `awaiting_client`, the calls are
    `tool.call_requested` events and the session waits for tool results, in one
    checkpoint."""

    async def write(db: Write, session: LockedSession) -> MessageRow | None:
        assert turn.message is not None
        message = copy.copy(turn.message)
        await request_client_tools(db, session, message, tool_call_ids=tool_call_ids)
        return message

    return write


async def run_tool(
    rt: Runtime, turn: TurnProgress, call: ToolCall, *, started: bool = False
) -> dict[str, Any]:
    """Run one tool call between its two checkpoints (`running`, unless an approval
    `started` it, then its outcome); returns the result for the model."""
    if not started:
        turn.message = await rt.fence.checkpoint(
            turn.session_id,
            turn.turn_id,
            tool_write(turn, call.id, lifecycle.RUNNING),
            turn=turn,
        )
    began = time.monotonic()
    try:
        result, error, status = (
            await run_builtin(call.name, call.arguments),
            None,
            lifecycle.COMPLETED,
        )
    except ModelError as exc:
        result, error, status = None, str(exc), lifecycle.FAILED
    turn.message = await rt.fence.checkpoint(
        turn.session_id,
        turn.turn_id,
        tool_write(
            turn,
            call.id,
            status,
            result=result,
            error=error,
            duration_ms=int((time.monotonic() - began) * 1000),
        ),
        turn=turn,
    )
    return {"tool_call_id": call.id, "result": result, "error": error}


async def run_approved(
    rt: Runtime, turn: TurnProgress, call: ToolCall, watch: asyncio.Event
) -> dict[str, Any]:
    """A tool that requires approval: it moves to `awaiting_approval` with a pending
    `interaction` part (one checkpoint), and the runner waits, holding the turn,
    until `POST .../interactions/{id}` decides (it commits the interaction and the
    tool's move to `running` or `failed` together) or the turn is cancelled. The
    wait is not durable: recovery cancels the interaction (`runtime_interrupted`)."""
    interaction = {
        "interaction_id": format_id("interaction", uuid7()),
        "interaction_type": "approval",
        "kind": "approval",
        "status": "pending",
        "prompt": f"Run {call.name}?",
        "request": {
            "tool_call": {"id": call.id, "name": call.name, "arguments": call.arguments}
        },
    }
    turn.message = await rt.fence.checkpoint(
        turn.session_id,
        turn.turn_id,
        tool_write(turn, call.id, lifecycle.AWAITING_APPROVAL, interaction=interaction),
        turn=turn,
    )
    assert turn.message is not None
    message_id = turn.message.id
    await _await_decision(rt, turn, call, watch)

    # The decision wrote the message: go on from what it stored.
    async def read() -> MessageRow:
        return await queries.read_message(rt.database, message_id)

    stored = await rt.fence.retrying(read)
    part = next(
        p for p in stored.content if p["type"] == "tool_call" and p["id"] == call.id
    )
    turn.message = stored
    if part["status"] == lifecycle.RUNNING:
        return await run_tool(rt, turn, call, started=True)
    denied = next(
        (
            p
            for p in stored.content
            if p["type"] == "tool_result" and p.get("tool_call_id") == call.id
        ),
        {},
    )
    return {"tool_call_id": call.id, "result": None, "error": denied.get("error")}


async def _await_decision(
    rt: Runtime, turn: TurnProgress, call: ToolCall, watch: asyncio.Event
) -> None:
    """Return once the tool call left `awaiting_approval`; TurnCancelled if a cancel
    was requested first."""
    assert turn.message is not None
    message_id = turn.message.id

    async def watched() -> tuple[bool, int | None]:
        return await rt.reads.turn_watch(turn.session_id, message_id)

    async def status() -> str | None:
        return await queries.tool_status(rt.database, message_id, call.id)

    while True:
        watch.clear()
        cancelled, _ = await rt.fence.retrying(watched)
        if cancelled:
            raise TurnCancelled
        if await rt.fence.retrying(status) != lifecycle.AWAITING_APPROVAL:
            return
        # Every checkpoint of the session but the runner's own wakes `watch` (the
        # decision's too, on any process); the timeout is a fallback.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watch.wait(), 1.0)
