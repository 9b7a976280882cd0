"""A turn as a frontend protocol follows it: where its checkpoints begin in the
session's log, which turn runs now, and its Mutation stream from that point."""

import uuid
from collections.abc import AsyncIterator, Callable

from sqlalchemy import func, select

from app.db import models
from app.db.session import Database
from app.live.fanout import Fanout
from app.live.streams import StreamConfig, message_mutations

# A frontend's stream ends with its turn; the connection cycle that spreads long-lived
# streams over processes is not needed for it, and would cut a reply short.
TURN_STREAM_CYCLE_SECONDS = 24 * 3600.0


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
