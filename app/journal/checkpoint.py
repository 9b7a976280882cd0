"""The checkpoint writer: every durable change to a message is one transaction that
updates its snapshot, bumps its revision and appends the upstream events describing it.

Functions here run inside the caller's write unit of work (they never commit) on a
session row the caller locked first with `journal.sessions.lock_session`. Holding the
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
from app.db.rows import EventRow, LockedSession, MessageRow
from app.db.types import utcnow
from app.db.writes import Write
from app.ids import format_id, uuid4, uuid7
from app.journal import lifecycle, render
from app.journal.events import EventSpec, render_event_rows
from app.journal.parts import (
    CheckpointError,
    ToolTransitionError,
    entering,
    number_parts,
    tool_completed,
    tool_result,
)


@dataclass
class Checkpoint:
    message: MessageRow | None
    events: list[EventRow]


async def get_message_for_update(db: Write, message_id: uuid.UUID) -> MessageRow:
    message = await db.message(message_id)
    if message is None:
        raise CheckpointError(f"message {message_id} does not exist")
    return message


def count(session: LockedSession, visibility: str) -> None:
    if visibility == "internal":
        session.internal_message_count += 1
    else:
        session.visible_message_count += 1


def new_message(
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
        id=uuid4(),
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


async def commit(
    db: Write,
    session: LockedSession,
    now: datetime,
    message: MessageRow | None,
    specs: Sequence[EventSpec],
    *,
    inserted: bool = False,
    started: bool = False,
    finished: bool = False,
    quiet: bool = False,
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
    db.outbox.wake(session.id, session.last_sequence, quiet=quiet, first=first)
    db.outbox.wrote(session.id, events, message)
    return Checkpoint(message=message, events=events)


def touch(message: MessageRow, now: datetime) -> None:
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
    message = new_message(
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
    count(session, visibility)
    session.last_input_sequence = message.sequence
    if starting:
        assert turn_id is not None
        specs.extend(_turn_opening(turn_id, message))
        session.active_turn_id = turn_id
        session.status = "active"
        session.cancel_requested = False
    checkpoint = await commit(
        db,
        session,
        now,
        message,
        specs,
        inserted=True,
        started=starting,
        quiet=True,
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
    message = new_message(
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
    count(session, "visible")
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
    return await commit(
        db,
        session,
        now,
        message,
        [EventSpec("output.message.started", data, turn_id=turn_id)],
        inserted=True,
    )


def completed(message: MessageRow, **extra: Any) -> EventSpec:
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
    finished: bool = False,
) -> Checkpoint:
    """Commit a completed model Step: its complete parts at once, each carrying `step_id`.
    With `close`, the same checkpoint closes the message (`state: done`). Events in
    `then` follow in the same checkpoint; `finished` when they end the turn (see
    `ending_turn`)."""
    now = utcnow()
    touch(message, now)
    parts = [entering(part) for part in parts]
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
    spec = completed(message, usage=usage)
    return await commit(db, session, now, message, [spec, *then], finished=finished)


async def append_events(
    db: Write, session: LockedSession, events: Sequence[EventSpec]
) -> Checkpoint:
    """Durable events of the session that change no message (a title update)."""
    return await commit(db, session, utcnow(), None, events)


async def close_message(
    db: Write,
    session: LockedSession,
    message: MessageRow,
    *,
    error: tuple[str, str] | None = None,
    then: Sequence[EventSpec] = (),
    partial: Sequence[dict[str, Any]] = (),
    step_id: str | None = None,
    finished: bool = False,
) -> Checkpoint:
    """Close a streaming message (`state: done`); with `error` = (code, text), append an
    error part first: how an interrupted or failed message is persisted. `partial` is
    what the unfinished step `step_id` streamed before it was cut off (a cancel, a
    model failure): its parts are kept, ahead of the error part, at the same revision.
    Events in `then` (turn outcome, session.idled) are appended in the same
    checkpoint; `finished` when they end the turn (see `ending_turn`)."""
    now = utcnow()
    touch(message, now)
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
    spec = completed(message, error_code=error[0] if error else None)
    return await commit(
        db, session, now, message, [*failed, spec, *then], finished=finished
    )


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
                "agent", content, [tool_result(part["id"], None, reason)], step_id
            )
        )
        specs.append(tool_completed(message, part, lifecycle.FAILED, error=reason))
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
    """End the session's running turn in a checkpoint of its own (see `ending_turn`)."""
    specs = ending_turn(
        session, turn_id=turn_id, outcome=outcome, answer_next=answer_next
    )
    return await commit(db, session, utcnow(), None, specs, finished=True)


def ending_turn(
    session: LockedSession,
    *,
    turn_id: uuid.UUID,
    outcome: EventSpec,
    answer_next: MessageRow | None = None,
) -> list[EventSpec]:
    """The events that end the session's running turn: its outcome, then
    `session.idled`; the session is left as they leave it. With `answer_next` (a user
    message the turn did not answer), a new turn for it starts in the same checkpoint:
    `session.activated`, `turn.started`. They join the checkpoint that closes the
    turn's last message (`finished`), or make one of their own (`finish_turn`)."""
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
    return specs


async def streaming_messages(db: Write, session_id: uuid.UUID) -> list[MessageRow]:
    return await db.streaming_messages(session_id)
