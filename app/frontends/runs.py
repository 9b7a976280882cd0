"""A turn as a frontend protocol follows it: where its checkpoints begin in the
session's log, which turn runs now, and its Mutation stream from that point."""

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from app import wire
from app.db import models
from app.db.session import Database
from app.live.fanout import Fanout
from app.live.streams import StreamConfig, message_mutations
from app.sessions import service as sessions

# A frontend's stream ends with its turn; the connection cycle that spreads long-lived
# streams over processes is not needed for it, and would cut a reply short.
TURN_STREAM_CYCLE_SECONDS = 24 * 3600.0


async def thread_session(
    database: Database, *, organization_id: uuid.UUID, thread_id: str, create: bool
) -> uuid.UUID | None:
    """The session a frontend's chat or thread id names (see
    `sessions.service.session_for_chat`), in a unit of work of its own."""
    for attempt in range(2):
        try:
            async with database.write() as db:
                return await sessions.session_for_chat(
                    db,
                    organization_id=organization_id,
                    chat_id=thread_id,
                    create=create,
                )
        except IntegrityError:
            # Another request created the session for this id first: find it.
            if attempt:
                raise
    return None


async def turn_cursor(
    database: Database, session_id: uuid.UUID, turn_id: uuid.UUID
) -> int:
    """The Mutation stream cursor just before the turn's first checkpoint (the one
    that started it): a stream opened there replays every message of the turn."""
    async with database.read() as db:
        first: int | None = await db.scalar(
            select(func.min(models.Event.sequence)).where(
                models.Event.session_id == session_id,
                models.Event.type == "turn.started",
                models.Event.turn_id == turn_id,
            )
        )
    return max(0, first - 1) if first is not None else 0


async def recent_messages(
    database: Database, session_id: uuid.UUID, *, before: int | None, limit: int
) -> list[dict[str, Any]]:
    """The newest visible messages (before the message sequence `before`, if given),
    oldest first: each its stored snapshot with its `client_message_id`."""
    stmt = select(models.Message.snapshot, models.Message.client_message_id).where(
        models.Message.session_id == session_id,
        models.Message.visibility == "visible",
    )
    if before is not None:
        stmt = stmt.where(models.Message.sequence < before)
    async with database.read() as db:
        rows = (
            await db.execute(stmt.order_by(models.Message.sequence.desc()).limit(limit))
        ).all()
    out = []
    for snapshot, client_message_id in reversed(rows):
        message: dict[str, Any] = wire.loads(snapshot)
        message["client_message_id"] = client_message_id
        out.append(message)
    return out


async def first_message_of_turn(
    database: Database, session_id: uuid.UUID, turn_id: uuid.UUID
) -> int | None:
    """The sequence of the turn's first message (the one that started it)."""
    async with database.read() as db:
        first: int | None = await db.scalar(
            select(func.min(models.Message.sequence)).where(
                models.Message.session_id == session_id,
                models.Message.turn_id == turn_id,
            )
        )
    return first


async def running_turn(database: Database, session_id: uuid.UUID) -> uuid.UUID | None:
    async with database.read() as db:
        turn: uuid.UUID | None = await db.scalar(
            select(models.Session.active_turn_id).where(models.Session.id == session_id)
        )
    return turn


def turn_mutations(
    *,
    database: Database,
    fanout: Fanout,
    session_id: uuid.UUID,
    after: int,
    retry_ms: int,
    keepalive: bytes,
    release: Callable[[], None],
    key_hash: str | None,
) -> AsyncIterator[bytes]:
    """The session's Mutation stream from `after`, for a frontend to project."""
    return message_mutations(
        database=database,
        fanout=fanout,
        session_id=session_id,
        after=after,
        include_internal=False,
        config=StreamConfig(retry_ms, TURN_STREAM_CYCLE_SECONDS, keepalive),
        release=release,
        key_hash=key_hash,
    )
