"""Actions in the conversation: a change of what the turn runs with (model, approval
mode, system prompt, tools), as an `action` part of the streaming agent message or of
a message of its own."""

import uuid
from collections.abc import Sequence
from typing import Any

from app.db.rows import LockedSession
from app.db.types import utcnow
from app.db.writes import Write
from app.ids import format_id, uuid7
from app.journal import checkpoint
from app.journal.checkpoint import Checkpoint
from app.journal.events import EventSpec
from app.journal.parts import CheckpointError, number_parts
from app.schemas import ActionType


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
        checkpoint.touch(streaming, now)
        streaming.content = [
            *streaming.content,
            *number_parts("agent", streaming.content, parts),
        ]
        return await checkpoint.commit(
            db, session, now, streaming, [*events, checkpoint.completed(streaming)]
        )
    message = checkpoint.new_message(
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
    checkpoint.count(session, "visible")
    spec = checkpoint.completed(message)
    return await checkpoint.commit(
        db, session, now, message, [*events, spec], inserted=True
    )
