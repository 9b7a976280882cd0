"""Checkpoints of a tool call's life cycle: each allowed transition of its part (with
its result once it ran, and the interaction an approval adds), and the move of
client-side calls to `awaiting_client` that makes the session wait for their results.
"""

from collections.abc import Sequence
from typing import Any

from app.db.rows import LockedSession, MessageRow
from app.db.types import utcnow
from app.db.writes import Write
from app.journal import checkpoint, lifecycle, render
from app.journal.checkpoint import Checkpoint
from app.journal.events import EventSpec
from app.journal.parts import (
    CheckpointError,
    check_transition,
    find_part,
    number_parts,
    tool_call,
    tool_completed,
    tool_result,
)


async def tool_transition(
    db: Write,
    session: LockedSession,
    message: MessageRow,
    *,
    tool_call_id: str,
    status: str,
    result: Any = None,
    error: str | None = None,
    duration_ms: int | None = None,
    interaction: dict[str, Any] | None = None,
    event_data: dict[str, Any] | None = None,
    then: Sequence[EventSpec] = (),
) -> Checkpoint:
    """Move one tool along its life cycle (app/journal/lifecycle.py), updating its
    existing tool_call part; a move the life cycle does not allow raises
    ToolTransitionError and writes nothing. `completed`/`failed` append the matching
    tool_result part. A related interaction part (created or updated by
    `interaction_id`) commits in the same checkpoint. `event_data` joins the data of
    the transition's event; events in `then` follow it in the same checkpoint."""
    now = utcnow()
    index, part = find_part(message, type="tool_call", id=tool_call_id)
    check_transition(part, status)
    checkpoint.touch(message, now)
    content = [dict(p) for p in message.content]
    content[index] = {**part, "status": status}
    step_id = part.get("step_id")
    new_parts: list[dict[str, Any]] = []
    if status in lifecycle.TERMINAL:
        new_parts.append(tool_result(tool_call_id, result, error))
    if interaction is not None:
        try:
            i_index, existing = find_part(
                message,
                type="interaction",
                interaction_id=interaction["interaction_id"],
            )
            content[i_index] = {**existing, **interaction, "type": "interaction"}
        except CheckpointError:
            new_parts.append(
                {**interaction, "type": "interaction", "tool_call_id": tool_call_id}
            )
    message.content = [
        *content,
        *number_parts("agent", content, new_parts, step_id),
    ]
    if status == lifecycle.RUNNING:
        spec = EventSpec(
            "tool.started",
            {"tool_call": tool_call(part), **(event_data or {})},
            turn_id=message.turn_id,
        )
    elif status == lifecycle.AWAITING_CLIENT:
        spec = _call_requested(message, [part], event_data)
    elif status == lifecycle.AWAITING_APPROVAL:
        spec = checkpoint.completed(message)
    else:
        spec = tool_completed(
            message,
            part,
            status,
            result=result,
            error=error,
            duration_ms=duration_ms,
            extra=event_data,
        )
    if spec.type != "output.message.completed":
        render.render(message)
    return await checkpoint.commit(db, session, now, message, [spec, *then])


def _call_requested(
    message: MessageRow,
    parts: Sequence[dict[str, Any]],
    extra: dict[str, Any] | None = None,
) -> EventSpec:
    """`tool.call_requested`: upstream's `tool_calls` batch, and `tool_call` (the
    first of them) for clients that read one call an event."""
    calls = [tool_call(p) for p in parts]
    return EventSpec(
        "tool.call_requested",
        {"tool_call": calls[0], "tool_calls": calls, **(extra or {})},
        turn_id=message.turn_id,
    )


async def request_client_tools(
    db: Write,
    session: LockedSession,
    message: MessageRow,
    *,
    tool_call_ids: Sequence[str],
) -> Checkpoint:
    """Hand tool calls to the client, in one checkpoint: each part moves to
    `awaiting_client`, one `tool.call_requested` event per call, and the session
    status becomes `waitingfortoolresults`. The turn stays the session's."""
    if not tool_call_ids:
        raise CheckpointError("no tool calls to hand to the client")
    now = utcnow()
    found = [find_part(message, type="tool_call", id=i) for i in tool_call_ids]
    for _, part in found:
        check_transition(part, lifecycle.AWAITING_CLIENT)
    checkpoint.touch(message, now)
    content = [dict(p) for p in message.content]
    for index, part in found:
        content[index] = {**part, "status": lifecycle.AWAITING_CLIENT}
    message.content = content
    render.render(message)
    session.status = "waitingfortoolresults"
    specs = [_call_requested(message, [part]) for _, part in found]
    return await checkpoint.commit(db, session, now, message, specs)
