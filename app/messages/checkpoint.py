"""The checkpoint writer: every durable change to a message is one transaction that
updates its snapshot, bumps its revision and appends the upstream events describing it.

Functions here run inside the caller's write unit of work (they never commit) on a
session row the caller locked first with `sessions.service.lock_session`. Holding the
lock, the next sequences are the session's `last_sequence + 1 ...`: each checkpoint
renders its message and events and writes them with the session row in one statement
(`Write.save_checkpoint`), then records a wake-up in the unit of work's outbox, which is
published to the bus only as the transaction commits.
"""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app import wire
from app.db.types import utcnow
from app.db.writes import EventRow, LockedSession, MessageRow, Write
from app.events.service import EventSpec, render_event_rows
from app.ids import format_id, uuid7
from app.messages import render
from app.messages.schemas import ActionType
from app.tools import lifecycle


class CheckpointError(Exception):
    """A checkpoint that would break a message invariant (closed message, unknown part)."""


class ToolTransitionError(CheckpointError):
    """A tool state change the life cycle does not allow (app/tools/lifecycle.py)."""


@dataclass
class Checkpoint:
    message: MessageRow | None
    events: list[EventRow]


async def get_message_for_update(db: Write, message_id: uuid.UUID) -> MessageRow:
    message = await db.message(message_id)
    if message is None:
        raise CheckpointError(f"message {message_id} does not exist")
    return message


def part_id(role: str, part_type: str, sequence: int) -> str:
    return f"{role}-{part_type}:{sequence}"


def number_parts(
    role: str,
    existing: Sequence[dict[str, Any]],
    parts: Sequence[dict[str, Any]],
    step_id: str | None = None,
) -> list[dict[str, Any]]:
    """Give new parts their stable identity: the next sequences, a part_id and a step_id.
    Parts that arrive with a part_id (announced by the live projection) keep it."""
    taken = {p["part_id"] for p in existing}
    numbered = []
    for offset, part in enumerate(parts, start=len(existing) + 1):
        part = dict(part)
        part.setdefault("part_id", part_id(role, part["type"], offset))
        if part["part_id"] in taken:
            raise CheckpointError(f"duplicate part_id {part['part_id']}")
        taken.add(part["part_id"])
        part["sequence"] = offset
        if step_id is not None:
            part["step_id"] = step_id
        numbered.append(part)
    return numbered


def _count(session: LockedSession, visibility: str) -> None:
    if visibility == "internal":
        session.internal_message_count += 1
    else:
        session.visible_message_count += 1


def _new_message(
    session: LockedSession,
    now: datetime,
    *,
    sequence: int,
    role: str,
    state: str,
    visibility: str,
    turn_id: uuid.UUID | None,
    content: list[dict[str, Any]],
    extra: dict[str, Any],
    client_message_id: str | None = None,
) -> MessageRow:
    return MessageRow(
        id=uuid.uuid4(),
        session_id=session.id,
        sequence=sequence,
        role=role,
        state=state,
        visibility=visibility,
        revision=1,
        turn_id=turn_id,
        client_message_id=client_message_id,
        content=content,
        extra=extra,
        snapshot="",
        changed_sequence=sequence,
        created_at=now,
        updated_at=now,
    )


async def _commit(
    db: Write,
    session: LockedSession,
    now: datetime,
    message: MessageRow | None,
    specs: Sequence[EventSpec],
    *,
    inserted: bool = False,
    started: bool = False,
    finished: bool = False,
    input_only: bool = False,
) -> Checkpoint:
    """Number the events after the session's last sequence and write the checkpoint.
    The message, if any, is already rendered."""
    first = session.last_sequence + 1
    session.last_sequence += len(specs)
    events = render_event_rows(session.id, first, specs, now)
    if message is not None:
        message.changed_sequence = session.last_sequence
    await db.save_checkpoint(
        session,
        now,
        message=message,
        inserted=inserted,
        events=events,
        started=started,
        finished=finished,
    )
    db.outbox.wake(session.id, session.last_sequence, input_only=input_only)
    return Checkpoint(message=message, events=events)


def _touch(message: MessageRow, now: datetime) -> None:
    if message.state != "streaming":
        raise CheckpointError(f"message {format_id('message', message.id)} is closed")
    message.revision += 1
    message.updated_at = now


def _turn_opening(
    turn_id: uuid.UUID, message: MessageRow
) -> tuple[EventSpec, EventSpec]:
    """`session.activated` and `turn.started` for a turn that answers `message`."""
    ids = {
        "input_message_id": format_id("message", message.id),
        "turn_id": format_id("turn", turn_id),
    }
    text = " ".join(
        p.get("text", "") for p in message.content if p.get("type") == "text"
    ).strip()
    return (
        EventSpec(
            "session.activated", dict(ids), turn_id=turn_id, input_message_id=message.id
        ),
        EventSpec(
            "turn.started",
            {**ids, "input_content": text} if text else dict(ids),
            turn_id=turn_id,
            input_message_id=message.id,
        ),
    )


async def append_user_message(
    db: Write,
    session: LockedSession,
    *,
    content: Sequence[dict[str, Any]],
    visibility: str,
    extra: dict[str, Any],
    client_message_id: str | None,
    start_turn: bool,
) -> tuple[Checkpoint, uuid.UUID | None]:
    """Store a user message. If no turn runs and `start_turn`, open one in the same
    checkpoint (`input.message` -> `session.activated` -> `turn.started`); if a turn
    runs, the message joins it. Returns the checkpoint and the turn it belongs to."""
    now = utcnow()
    turn_id = session.active_turn_id
    starting = turn_id is None and start_turn
    if starting:
        turn_id = uuid7()
    message = _new_message(
        session,
        now,
        sequence=session.last_sequence + 1,
        role="user",
        state="done",
        visibility=visibility,
        turn_id=turn_id,
        content=number_parts("user", [], content),
        extra=extra,
        client_message_id=client_message_id,
    )
    specs = [
        EventSpec(
            "input.message",
            {"message": render.render(message)},
            turn_id=turn_id,
            input_message_id=message.id,
        )
    ]
    _count(session, visibility)
    session.last_input_sequence = message.sequence
    if starting:
        assert turn_id is not None
        specs.extend(_turn_opening(turn_id, message))
        session.active_turn_id = turn_id
        session.status = "active"
        session.cancel_requested = False
    checkpoint = await _commit(
        db,
        session,
        now,
        message,
        specs,
        inserted=True,
        started=starting,
        input_only=True,
    )
    return checkpoint, turn_id


async def open_agent_message(
    db: Write,
    session: LockedSession,
    *,
    turn_id: uuid.UUID,
    model: str | None = None,
    iteration: int | None = None,
    phase: str | None = None,
) -> Checkpoint:
    """Open a streaming agent message (`output.message.started`), revision 1, no parts."""
    now = utcnow()
    message = _new_message(
        session,
        now,
        sequence=session.last_sequence + 1,
        role="agent",
        state="streaming",
        visibility="visible",
        turn_id=turn_id,
        content=[],
        extra={"phase": phase} if phase else {},
    )
    render.render(message)
    _count(session, "visible")
    data: dict[str, Any] = {
        "message_id": format_id("message", message.id),
        "turn_id": format_id("turn", turn_id),
    }
    if iteration is not None:
        data["iteration"] = iteration
    if model is not None:
        data["model"] = model
    if phase is not None:
        data["phase"] = phase
    return await _commit(
        db,
        session,
        now,
        message,
        [EventSpec("output.message.started", data, turn_id=turn_id)],
        inserted=True,
    )


def _completed(message: MessageRow, **extra: Any) -> EventSpec:
    """Render the message and the `output.message.completed` event that carries it."""
    data = {
        "message": render.render(message),
        **{k: v for k, v in extra.items() if v is not None},
    }
    return EventSpec("output.message.completed", data, turn_id=message.turn_id)


async def commit_step(
    db: Write,
    session: LockedSession,
    message: MessageRow,
    *,
    step_id: str,
    parts: Sequence[dict[str, Any]],
    phase: str | None = None,
    phase_source: str | None = None,
    close: bool = False,
    usage: dict[str, Any] | None = None,
    then: Sequence[EventSpec] = (),
) -> Checkpoint:
    """Commit a completed model Step: its complete parts at once, each carrying `step_id`.
    With `close`, the same checkpoint closes the message (`state: done`). Events in
    `then` follow in the same checkpoint."""
    now = utcnow()
    _touch(message, now)
    parts = [_entering(part) for part in parts]
    if close and any(
        p["type"] == "tool_call" and p["status"] not in lifecycle.TERMINAL
        for p in parts
    ):
        raise ToolTransitionError("a step with unfinished tool calls cannot close")
    message.content = [
        *message.content,
        *number_parts("agent", message.content, parts, step_id),
    ]
    if phase is not None:
        message.extra = {
            **message.extra,
            "phase": phase,
            "phase_source": phase_source or "derived",
        }
    if close:
        message.state = "done"
    spec = _completed(message, usage=usage)
    return await _commit(db, session, now, message, [spec, *then])


def _entering(part: dict[str, Any]) -> dict[str, Any]:
    """A tool call enters a committed step `ready` (or `failed`, when it cannot run at
    all, as with arguments that are not JSON); it is never committed while its input
    streams."""
    if part.get("type") != "tool_call":
        return part
    status = part.get("status") or lifecycle.READY
    if lifecycle.current(status) not in (lifecycle.READY, lifecycle.FAILED):
        raise ToolTransitionError(
            f"tool call {part.get('id')} cannot be committed as {status!r}: a step "
            "commits its tool calls ready (or failed)"
        )
    return {**part, "status": lifecycle.current(status)}


def _tool_call(part: dict[str, Any]) -> dict[str, Any]:
    return {"id": part["id"], "name": part["name"], "arguments": part.get("arguments")}


def _check_transition(part: dict[str, Any], status: str) -> None:
    if not lifecycle.allowed(part.get("status"), status):
        raise ToolTransitionError(
            f"tool call {part['id']} cannot go from "
            f"{lifecycle.current(part.get('status'))!r} to {status!r}"
        )


def _tool_result(tool_call_id: str, result: Any, error: str | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "tool_result", "tool_call_id": tool_call_id}
    if result is not None:
        part["result"] = result
    if error is not None:
        part["error"] = error
    return part


def _tool_completed(
    message: MessageRow,
    part: dict[str, Any],
    status: str,
    *,
    result: Any = None,
    error: str | None = None,
    duration_ms: int | None = None,
    extra: dict[str, Any] | None = None,
) -> EventSpec:
    data: dict[str, Any] = {
        "tool_call_id": part["id"],
        "tool_name": part["name"],
        # Upstream's ToolCompleted: status "success"|"error", result as content parts.
        "status": "success" if status == lifecycle.COMPLETED else "error",
        "success": status == lifecycle.COMPLETED,
    }
    if result is not None:
        text = result if isinstance(result, str) else wire.dumps(result).decode()
        data["result"] = [{"type": "text", "text": text}]
    if error is not None:
        data["error"] = error
    if duration_ms is not None:
        data["duration_ms"] = duration_ms
    data.update(extra or {})
    return EventSpec("tool.completed", data, turn_id=message.turn_id)


def _find_part(message: MessageRow, **match: Any) -> tuple[int, dict[str, Any]]:
    for index, part in enumerate(message.content):
        if all(part.get(k) == v for k, v in match.items()):
            return index, part
    raise CheckpointError(
        f"no part matching {match} in message {format_id('message', message.id)}"
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
    """Move one tool along its life cycle (app/tools/lifecycle.py), updating its
    existing tool_call part; a move the life cycle does not allow raises
    ToolTransitionError and writes nothing. `completed`/`failed` append the matching
    tool_result part. A related interaction part (created or updated by
    `interaction_id`) commits in the same checkpoint. `event_data` joins the data of
    the transition's event; events in `then` follow it in the same checkpoint."""
    now = utcnow()
    index, part = _find_part(message, type="tool_call", id=tool_call_id)
    _check_transition(part, status)
    _touch(message, now)
    content = [dict(p) for p in message.content]
    content[index] = {**part, "status": status}
    step_id = part.get("step_id")
    new_parts: list[dict[str, Any]] = []
    if status in lifecycle.TERMINAL:
        new_parts.append(_tool_result(tool_call_id, result, error))
    if interaction is not None:
        try:
            i_index, existing = _find_part(
                message,
                type="interaction",
                interaction_id=interaction["interaction_id"],
            )
            content[i_index] = {**existing, **interaction, "type": "interaction"}
        except CheckpointError:
            new_parts.append(
                {**interaction, "type": "interaction", "tool_call_id": tool_call_id}
            )
    message.content = [*content, *number_parts("agent", content, new_parts, step_id)]
    if status == lifecycle.RUNNING:
        spec = EventSpec(
            "tool.started",
            {"tool_call": _tool_call(part), **(event_data or {})},
            turn_id=message.turn_id,
        )
    elif status == lifecycle.AWAITING_CLIENT:
        spec = _call_requested(message, [part], event_data)
    elif status == lifecycle.AWAITING_APPROVAL:
        spec = _completed(message)
    else:
        spec = _tool_completed(
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
    return await _commit(db, session, now, message, [spec, *then])


def _call_requested(
    message: MessageRow,
    parts: Sequence[dict[str, Any]],
    extra: dict[str, Any] | None = None,
) -> EventSpec:
    """`tool.call_requested`: upstream's `tool_calls` batch, and `tool_call` (the
    first of them) for clients that read one call an event."""
    calls = [_tool_call(p) for p in parts]
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
    found = [_find_part(message, type="tool_call", id=i) for i in tool_call_ids]
    for _, part in found:
        _check_transition(part, lifecycle.AWAITING_CLIENT)
    _touch(message, now)
    content = [dict(p) for p in message.content]
    for index, part in found:
        content[index] = {**part, "status": lifecycle.AWAITING_CLIENT}
    message.content = content
    render.render(message)
    session.status = "waitingfortoolresults"
    specs = [_call_requested(message, [part]) for _, part in found]
    return await _commit(db, session, now, message, specs)


def action_part(
    action_type: ActionType,
    title: str,
    data: dict[str, Any],
    *,
    state: str = "completed",
) -> dict[str, Any]:
    """The seed's `action` part: what changed (`action_type`, `data`), for whom to
    read (`title`), and whether it is done (`state`: running|completed|failed)."""
    return {
        "type": "action",
        "action_id": format_id("action", uuid7()),
        "action_type": action_type,
        "state": state,
        "title": title,
        "data": data,
    }


async def append_actions(
    db: Write,
    session: LockedSession,
    *,
    turn_id: uuid.UUID | None,
    parts: Sequence[dict[str, Any]],
    events: Sequence[EventSpec] = (),
) -> Checkpoint:
    """The seed's Action ownership rule, in one checkpoint: the action parts join the
    turn's streaming agent message when there is one (its revision + 1); otherwise
    they are a standalone agent message holding just them. `events` go first."""
    if not parts:
        raise CheckpointError("no action to append")
    now = utcnow()
    streaming = None
    if turn_id is not None:
        streaming = next(
            (
                m
                for m in await db.streaming_messages(session.id)
                if m.turn_id == turn_id
            ),
            None,
        )
    if streaming is not None:
        _touch(streaming, now)
        streaming.content = [
            *streaming.content,
            *number_parts("agent", streaming.content, parts),
        ]
        return await _commit(
            db, session, now, streaming, [*events, _completed(streaming)]
        )
    message = _new_message(
        session,
        now,
        sequence=session.last_sequence + 1 + len(events),
        role="agent",
        state="done",
        visibility="visible",
        turn_id=turn_id,
        content=number_parts("agent", [], parts),
        extra={},
    )
    _count(session, "visible")
    spec = _completed(message)
    return await _commit(db, session, now, message, [*events, spec], inserted=True)


async def append_events(
    db: Write, session: LockedSession, events: Sequence[EventSpec]
) -> Checkpoint:
    """Durable events of the session that change no message (a title update)."""
    return await _commit(db, session, utcnow(), None, events)


async def close_message(
    db: Write,
    session: LockedSession,
    message: MessageRow,
    *,
    error: tuple[str, str] | None = None,
    then: Sequence[EventSpec] = (),
    partial: Sequence[dict[str, Any]] = (),
    step_id: str | None = None,
) -> Checkpoint:
    """Close a streaming message (`state: done`); with `error` = (code, text), append an
    error part first: how an interrupted or failed message is persisted. `partial` is
    what the unfinished step `step_id` streamed before it was cut off (a cancel, a
    model failure): its parts are kept, ahead of the error part, at the same revision.
    Events in `then` (turn outcome, session.idled) are appended in the same
    checkpoint."""
    now = utcnow()
    _touch(message, now)
    _cancel_pending_interactions(
        message,
        now,
        "runtime_interrupted"
        if error is not None and error[0] == "interrupted"
        else "turn_stopped",
    )
    failed = _fail_unfinished_tools(
        message, error[1] if error else "The turn ended before the tool completed"
    )
    if partial:
        message.content = [
            *message.content,
            *number_parts("agent", message.content, partial, step_id),
        ]
    if error is not None:
        code, text = error
        message.content = [
            *message.content,
            *number_parts(
                "agent",
                message.content,
                [{"type": "error", "code": code, "message": text}],
            ),
        ]
    message.state = "done"
    spec = _completed(message, error_code=error[0] if error else None)
    return await _commit(db, session, now, message, [*failed, spec, *then])


def _cancel_pending_interactions(
    message: MessageRow, now: datetime, reason: str
) -> None:
    """A message closes with no interaction pending: each is `cancelled` with the
    seed's `cancel_reason` (`turn_stopped`, or `runtime_interrupted` by recovery)."""
    message.content = [
        {
            **part,
            "status": "cancelled",
            "cancel_reason": reason,
            "resolved_at": wire.timestamp(now),
        }
        if part.get("type") == "interaction" and part.get("status") == "pending"
        else part
        for part in message.content
    ]


def _fail_unfinished_tools(message: MessageRow, reason: str) -> list[EventSpec]:
    """A message closes with every tool finished: one still ready, awaiting approval or
    a client, or running, fails with `reason` (its tool_result carries it). Returns
    their `tool.completed` events."""
    content = [dict(p) for p in message.content]
    specs: list[EventSpec] = []
    for index, part in enumerate(message.content):
        if part.get("type") != "tool_call" or (
            lifecycle.current(part.get("status")) in lifecycle.TERMINAL
        ):
            continue
        content[index] = {**part, "status": lifecycle.FAILED}
        step_id = part.get("step_id")
        content.extend(
            number_parts(
                "agent", content, [_tool_result(part["id"], None, reason)], step_id
            )
        )
        specs.append(_tool_completed(message, part, lifecycle.FAILED, error=reason))
    message.content = content
    return specs


async def finish_turn(
    db: Write,
    session: LockedSession,
    *,
    turn_id: uuid.UUID,
    outcome: EventSpec,
    answer_next: MessageRow | None = None,
) -> Checkpoint:
    """End the session's running turn with its outcome event, then `session.idled`.
    With `answer_next` (a user message the turn did not answer), a new turn for it
    starts in the same checkpoint: `session.activated`, `turn.started`."""
    idled = EventSpec(
        "session.idled", {"turn_id": format_id("turn", turn_id)}, turn_id=turn_id
    )
    specs = [outcome, idled]
    session.active_turn_id = None
    session.cancel_requested = False
    session.status = "idle"
    if answer_next is not None:
        next_turn = uuid7()
        specs.extend(_turn_opening(next_turn, answer_next))
        session.active_turn_id = next_turn
        session.status = "active"
    return await _commit(db, session, utcnow(), None, specs, finished=True)


async def streaming_messages(db: Write, session_id: uuid.UUID) -> list[MessageRow]:
    return await db.streaming_messages(session_id)
