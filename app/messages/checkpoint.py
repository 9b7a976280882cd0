"""The checkpoint writer: every durable change to a message is one transaction that
updates its snapshot, bumps its revision and appends the upstream events describing it.

Functions here run inside the caller's write unit of work (they never commit) and expect
the session row to be locked first with `sessions.service.lock_session`. Each records a wake-up in the
unit of work's outbox, which is published to the bus only as the transaction commits.
"""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app import wire
from app.db import models
from app.db.outbox import WriteSession
from app.db.types import utcnow
from app.events.service import EventSpec, add_events, allocate_sequences
from app.ids import format_id, uuid7
from app.messages import render


class CheckpointError(Exception):
    """A checkpoint that would break a message invariant (closed message, unknown part)."""


@dataclass
class Checkpoint:
    message: models.Message | None
    events: list[models.Event]


def note_wakeup(db: AsyncSession, session_id: uuid.UUID, sequence: int) -> None:
    assert isinstance(db, WriteSession), "checkpoints run in a write unit of work"
    db.outbox.wake(session_id, sequence)


async def get_message_for_update(
    db: AsyncSession, message_id: uuid.UUID
) -> models.Message:
    message = await db.get(models.Message, message_id, populate_existing=True)
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


def _count(session: models.Session, visibility: str) -> None:
    if visibility == "internal":
        session.internal_message_count += 1
    else:
        session.visible_message_count += 1


async def _commit(
    db: AsyncSession,
    session: models.Session,
    message: models.Message | None,
    specs: list[EventSpec],
    *,
    first: int | None = None,
) -> Checkpoint:
    """Allocate sequences (unless the caller did), render the message, append events."""
    if first is None:
        first = await allocate_sequences(db, session.id, len(specs))
    last = first + len(specs) - 1
    session.last_sequence = last
    if message is not None:
        message.changed_sequence = last
        render.render(message)
    events = add_events(db, session.id, first, specs)
    note_wakeup(db, session.id, last)
    return Checkpoint(message=message, events=events)


def _touch(message: models.Message) -> None:
    if message.state != "streaming":
        raise CheckpointError(f"message {format_id('message', message.id)} is closed")
    message.revision += 1
    message.updated_at = utcnow()


async def append_user_message(
    db: AsyncSession,
    session: models.Session,
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
    message_id = uuid.uuid4()
    specs = [
        EventSpec("input.message", {}, turn_id=turn_id, input_message_id=message_id)
    ]
    if starting:
        assert turn_id is not None
        ids = {
            "input_message_id": format_id("message", message_id),
            "turn_id": format_id("turn", turn_id),
        }
        text = " ".join(
            p.get("text", "") for p in content if p.get("type") == "text"
        ).strip()
        specs.append(
            EventSpec(
                "session.activated",
                dict(ids),
                turn_id=turn_id,
                input_message_id=message_id,
            )
        )
        specs.append(
            EventSpec(
                "turn.started",
                {**ids, "input_content": text} if text else dict(ids),
                turn_id=turn_id,
                input_message_id=message_id,
            )
        )
    first = await allocate_sequences(db, session.id, len(specs))
    message = models.Message(
        id=message_id,
        session_id=session.id,
        sequence=first,
        role="user",
        state="done",
        visibility=visibility,
        revision=1,
        turn_id=turn_id,
        client_message_id=client_message_id,
        content=number_parts("user", [], content),
        extra=extra,
        snapshot="",
        changed_sequence=first,
        created_at=now,
        updated_at=now,
    )
    render.render(message)
    specs[0] = EventSpec(
        "input.message",
        {"message": render.message_wire(message)},
        turn_id=turn_id,
        input_message_id=message_id,
    )
    db.add(message)
    _count(session, visibility)
    if starting:
        session.active_turn_id = turn_id
        session.status = "active"
        session.cancel_requested_at = None
        session.started_at = session.started_at or now
    return await _commit(db, session, message, specs, first=first), turn_id


async def open_agent_message(
    db: AsyncSession,
    session: models.Session,
    *,
    turn_id: uuid.UUID,
    model: str | None = None,
    iteration: int | None = None,
    phase: str | None = None,
) -> Checkpoint:
    """Open a streaming agent message (`output.message.started`), revision 1, no parts."""
    now = utcnow()
    message_id = uuid.uuid4()
    first = await allocate_sequences(db, session.id, 1)
    message = models.Message(
        id=message_id,
        session_id=session.id,
        sequence=first,
        role="agent",
        state="streaming",
        visibility="visible",
        revision=1,
        turn_id=turn_id,
        client_message_id=None,
        content=[],
        extra={"phase": phase} if phase else {},
        snapshot="",
        changed_sequence=first,
        created_at=now,
        updated_at=now,
    )
    db.add(message)
    _count(session, "visible")
    data: dict[str, Any] = {
        "message_id": format_id("message", message_id),
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
        message,
        [EventSpec("output.message.started", data, turn_id=turn_id)],
        first=first,
    )


def _completed(message: models.Message, **extra: Any) -> EventSpec:
    data = {
        "message": render.message_wire(message),
        **{k: v for k, v in extra.items() if v is not None},
    }
    return EventSpec("output.message.completed", data, turn_id=message.turn_id)


async def commit_step(
    db: AsyncSession,
    session: models.Session,
    message: models.Message,
    *,
    step_id: str,
    parts: Sequence[dict[str, Any]],
    phase: str | None = None,
    phase_source: str | None = None,
    close: bool = False,
    usage: dict[str, Any] | None = None,
) -> Checkpoint:
    """Commit a completed model Step: its complete parts at once, each carrying `step_id`.
    With `close`, the same checkpoint closes the message (`state: done`)."""
    _touch(message)
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
    render.render(message)
    return await _commit(db, session, message, [_completed(message, usage=usage)])


def _find_part(message: models.Message, **match: Any) -> tuple[int, dict[str, Any]]:
    for index, part in enumerate(message.content):
        if all(part.get(k) == v for k, v in match.items()):
            return index, part
    raise CheckpointError(
        f"no part matching {match} in message {format_id('message', message.id)}"
    )


async def tool_transition(
    db: AsyncSession,
    session: models.Session,
    message: models.Message,
    *,
    tool_call_id: str,
    status: str,
    result: Any = None,
    error: str | None = None,
    duration_ms: int | None = None,
    interaction: dict[str, Any] | None = None,
) -> Checkpoint:
    """Move a tool through `running` -> `completed|failed`, updating its existing
    tool_call part. Completion appends the matching tool_result part. A related
    interaction part (created or updated by `interaction_id`) commits in the same
    checkpoint."""
    _touch(message)
    content = [dict(p) for p in message.content]
    index, part = _find_part(message, type="tool_call", id=tool_call_id)
    content[index] = {**part, "status": status}
    step_id = part.get("step_id")
    new_parts: list[dict[str, Any]] = []
    if status in ("completed", "failed"):
        tool_result: dict[str, Any] = {
            "type": "tool_result",
            "tool_call_id": tool_call_id,
        }
        if result is not None:
            tool_result["result"] = result
        if error is not None:
            tool_result["error"] = error
        new_parts.append(tool_result)
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
    tool_call = {
        "id": tool_call_id,
        "name": part["name"],
        "arguments": part.get("arguments"),
    }
    if status == "running":
        spec = EventSpec(
            "tool.started", {"tool_call": tool_call}, turn_id=message.turn_id
        )
    else:
        data: dict[str, Any] = {
            "tool_call_id": tool_call_id,
            "tool_name": part["name"],
            # Upstream's ToolCompleted: status "success"|"error", result as content parts.
            "status": "success" if status == "completed" else "error",
            "success": status == "completed",
        }
        if result is not None:
            text = result if isinstance(result, str) else wire.dumps(result).decode()
            data["result"] = [{"type": "text", "text": text}]
        if error is not None:
            data["error"] = error
        if duration_ms is not None:
            data["duration_ms"] = duration_ms
        spec = EventSpec("tool.completed", data, turn_id=message.turn_id)
    return await _commit(db, session, message, [spec])


async def append_action(
    db: AsyncSession,
    session: models.Session,
    *,
    turn_id: uuid.UUID | None,
    action: str,
    data: dict[str, Any] | None = None,
    event: EventSpec | None = None,
) -> Checkpoint:
    """The seed's Action ownership rule: append to the turn's streaming agent message when
    there is one; otherwise store a standalone agent message holding just the Action."""
    part: dict[str, Any] = {"type": "action", "action": action}
    if data is not None:
        part["data"] = data
    specs = [event] if event is not None else []
    streaming = None
    if turn_id is not None:
        streaming = await db.scalar(
            select(models.Message).where(
                models.Message.session_id == session.id,
                models.Message.turn_id == turn_id,
                models.Message.state == "streaming",
            )
        )
    if streaming is not None:
        _touch(streaming)
        streaming.content = [
            *streaming.content,
            *number_parts("agent", streaming.content, [part]),
        ]
        render.render(streaming)
        return await _commit(db, session, streaming, [*specs, _completed(streaming)])
    now = utcnow()
    first = await allocate_sequences(db, session.id, len(specs) + 1)
    message = models.Message(
        id=uuid.uuid4(),
        session_id=session.id,
        sequence=first + len(specs),
        role="agent",
        state="done",
        visibility="visible",
        revision=1,
        turn_id=turn_id,
        client_message_id=None,
        content=number_parts("agent", [], [part]),
        extra={},
        snapshot="",
        changed_sequence=first,
        created_at=now,
        updated_at=now,
    )
    render.render(message)
    db.add(message)
    _count(session, "visible")
    return await _commit(
        db, session, message, [*specs, _completed(message)], first=first
    )


async def close_message(
    db: AsyncSession,
    session: models.Session,
    message: models.Message,
    *,
    error: tuple[str, str] | None = None,
    then: Sequence[EventSpec] = (),
) -> Checkpoint:
    """Close a streaming message (`state: done`); with `error` = (code, text), append an
    error part first: how an interrupted or failed message is persisted. Events in
    `then` (turn outcome, session.idled) are appended in the same checkpoint."""
    _touch(message)
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
    render.render(message)
    spec = _completed(message, error_code=error[0] if error else None)
    return await _commit(db, session, message, [spec, *then])


async def finish_turn(
    db: AsyncSession,
    session: models.Session,
    *,
    turn_id: uuid.UUID,
    outcome: EventSpec,
) -> Checkpoint:
    """End the session's running turn with its outcome event, then `session.idled`."""
    now = utcnow()
    idled = EventSpec(
        "session.idled", {"turn_id": format_id("turn", turn_id)}, turn_id=turn_id
    )
    session.active_turn_id = None
    session.cancel_requested_at = None
    session.status = "idle"
    session.finished_at = now
    return await _commit(db, session, None, [outcome, idled])


async def streaming_messages(
    db: AsyncSession, session_id: uuid.UUID | None = None
) -> list[models.Message]:
    stmt = select(models.Message).where(models.Message.state == "streaming")
    if session_id is not None:
        stmt = stmt.where(models.Message.session_id == session_id)
    return list((await db.scalars(stmt.order_by(models.Message.sequence))).all())
