"""The two streams as async generators of encoded frames. They hold no database
connection while they wait: every read is a short unit of work of its own. They wait
on their subscription alone: heartbeats and the end of a connection cycle arrive in it
as markers from the fan-out's process timer."""

import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from sqlalchemy import bindparam, select

from app import wire
from app.db import models
from app.db.session import Database
from app.events import service as events_service
from app.ids import format_id
from app.live import frames
from app.live.fanout import (
    CYCLE,
    EVENT_MUTATION,
    FLUSH,
    GONE,
    HEARTBEAT,
    MUTATION_COLUMNS,
    RESYNC,
    REVOKED,
    SNAPSHOT,
    DeltaOut,
    EventMutationOut,
    EventOut,
    Fanout,
    Marker,
    MessageOut,
    Out,
    PartOut,
    StreamWriter,
    Subscription,
    WarningOut,
    checkpoint_order,
    message_frame,
    text_units,
)
from app.live.items import MODEL_RETRY

REPLAY_PAGE = 500

log = logging.getLogger("app.live.streams")


def _overflowed(session_id: uuid.UUID, limit: int) -> None:
    # Expected, and handled: the client resumes from its cursor. One INFO line.
    log.info(
        "dropped a slow consumer: it fell %d items behind; it resumes from its cursor",
        limit,
        extra={"session_id": format_id("session", session_id)},
    )


# The closes the server decides, and the `disconnecting` reason each stream gives for
# them before it ends.
CLOSE_REASONS: dict[Marker, str] = {
    CYCLE: "connection_cycle",
    GONE: "session_deleted",
    REVOKED: "unauthorized",
}


@dataclass
class StreamConfig:
    retry_ms: int
    cycle_seconds: float
    # The keep-alive comment sent on the fan-out's heartbeats; None sends none.
    keepalive: bytes | None = None


def _cycle_deadline(cycle_seconds: float) -> float:
    # ±20 % jitter, as upstream, so clients of one deploy do not reconnect in lockstep.
    return time.monotonic() + cycle_seconds * random.uniform(0.8, 1.2)


# A stream's starting position: one statement outside any transaction, no ORM session
# (a burst of connects waits for the pool holding as little as it can).
LAST_SEQUENCE = select(models.Session.last_sequence).where(
    models.Session.id == bindparam("session_id")
)


async def _last_sequence(database: Database, session_id: uuid.UUID) -> int:
    async with database.statements() as conn:
        last: int | None = await conn.scalar(LAST_SEQUENCE, {"session_id": session_id})
    return last or 0


# A batch goes out once it holds this much, even if more is queued.
BATCH_BYTES = 64 * 1024


class Batch:
    """The frames of the items a subscriber has queued, written with one `send` once
    its queue is empty: a stream that fell behind catches up in one write, not in one
    per frame."""

    __slots__ = ("frames", "size")

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.size = 0

    def add(self, frame: bytes) -> None:
        self.frames.append(frame)
        self.size += len(frame)

    def __bool__(self) -> bool:
        return bool(self.frames)

    def due(self, sub: Subscription) -> bool:
        """Whether to write what it holds now: nothing else is queued, or it is full."""
        return bool(self.frames) and (not sub.pending or self.size >= BATCH_BYTES)

    def take(self) -> bytes:
        frames = self.frames
        chunk = frames[0] if len(frames) == 1 else b"".join(frames)
        self.frames = []
        self.size = 0
        return chunk


@dataclass
class Position:
    """The last durable sequence a subscriber has been given (sent or filtered out)."""

    sequence: int


async def upstream_events(
    *,
    database: Database,
    fanout: Fanout,
    session_id: uuid.UUID,
    cursor: int | None,
    accept: Callable[[str], bool],
    config: StreamConfig,
    release: Callable[[], None],
    key_hash: str | None = None,
    writer: StreamWriter | None = None,
) -> AsyncIterator[bytes]:
    """Upstream's `/sse`: `connected`, replay after the cursor, then the live tail.
    Revoking `key_hash` (the key it was opened with) ends it. Through `writer` (its
    response's) it writes live deltas straight from the fan-out's pass."""
    sub = fanout.subscribe(session_id, key_hash)

    def direct(item: Out) -> Out | None:
        if type(item) is not DeltaOut or writer is None or writer.send is None:
            return item
        if not accept(item.delta.event_type):
            return None
        return None if writer.write_now(item.sse_frame) else FLUSH

    try:
        # The starting position is fixed before `connected` goes out: a client that acts
        # on `connected` (posts a message) must see everything that follows.
        if cursor is None:
            position = Position(await _last_sequence(database, session_id))
        else:
            position = Position(cursor)
        yield frames.connected(config.retry_ms)
        if cursor is not None:
            async for chunk in _replay_events(
                database, session_id, position, accept, config
            ):
                yield chunk
        sub.deadline = _cycle_deadline(config.cycle_seconds)
        batch = Batch()
        while True:
            if batch.due(sub):
                yield batch.take()
            item = await sub.next(direct)
            if item is None:
                if sub.overflowed:
                    _overflowed(session_id, sub.limit)
                    batch.add(frames.disconnecting("error", config.retry_ms))
                if batch:
                    yield batch.take()
                return
            # Deltas first: nearly every item of a streaming turn is one.
            if type(item) is DeltaOut:
                if accept(item.delta.event_type):
                    batch.add(item.sse_frame)
            elif isinstance(item, WarningOut):
                if accept(MODEL_RETRY):
                    batch.add(item.sse_frame)
            elif isinstance(item, EventOut):
                if item.sequence <= position.sequence:
                    continue
                if item.sequence > position.sequence + 1:
                    if batch:
                        yield batch.take()
                    async for chunk in _replay_events(
                        database,
                        session_id,
                        position,
                        accept,
                        config,
                        upto=item.sequence - 1,
                    ):
                        yield chunk
                position.sequence = item.sequence
                if accept(item.type):
                    batch.add(item.frame)
            elif item is FLUSH:
                # The response finishes the write `direct` began.
                yield b""
            elif item is HEARTBEAT:
                if config.keepalive is not None:
                    batch.add(config.keepalive)
            elif item is RESYNC:
                if batch:
                    yield batch.take()
                async for chunk in _replay_events(
                    database, session_id, position, accept, config
                ):
                    yield chunk
            elif isinstance(item, Marker):
                batch.add(frames.disconnecting(CLOSE_REASONS[item], config.retry_ms))
                yield batch.take()
                return
    finally:
        fanout.unsubscribe(sub)
        release()


async def _replay_events(
    database: Database,
    session_id: uuid.UUID,
    position: Position,
    accept: Callable[[str], bool],
    config: StreamConfig,
    upto: int | None = None,
) -> AsyncIterator[bytes]:
    """Durable events after `position` (up to `upto`), in pages, each page its own
    short read; advances `position` past every event read, sent or filtered out."""
    while True:
        async with database.read() as db:
            rows = await events_service.event_rows(
                db, session_id, after=position.sequence, upto=upto, limit=REPLAY_PAGE
            )
        for sequence, event_id, event_type, body in rows:
            position.sequence = sequence
            if accept(event_type):
                yield frames.durable_event(event_id, event_type, body, config.retry_ms)
        if len(rows) < REPLAY_PAGE:
            return


def _delta_mutation(item: DeltaOut, sent: dict[str, int]) -> bytes | None:
    """The Mutation frame of a live delta for a client that has `sent[part_id]` UTF-16
    code units of its part: trimmed to what the client lacks, None when it lacks nothing
    (or was never sent the part). Records what the client will then have."""
    delta = item.delta
    known = sent.get(delta.part_id)
    if known is None or item.end <= known:
        return None
    sent[delta.part_id] = item.end
    if delta.offset < known:
        return frames.delta_mutation(
            delta, known, wire.utf16_tail(delta.text, known - delta.offset)
        )
    return item.mutation_frame


async def message_mutations(
    *,
    database: Database,
    fanout: Fanout,
    session_id: uuid.UUID,
    after: int | None,
    include_internal: bool,
    config: StreamConfig,
    release: Callable[[], None],
    key_hash: str | None = None,
    writer: StreamWriter | None = None,
) -> AsyncIterator[bytes]:
    """The Mutation stream: `message` snapshots with cursor ids, `part`/`delta` of the
    live projection, `reset` when the cursor cannot be honoured, and `disconnecting`
    before every close the server decides, as on `/sse`. Revoking `key_hash` ends it.
    Through `writer` (its response's) it writes live deltas straight from the
    fan-out's pass."""
    sub = fanout.subscribe(session_id, key_hash)
    # UTF-16 code units of each live part this client has been sent, to trim overlaps.
    sent: dict[str, int] = {}

    def direct(item: Out) -> Out | None:
        if type(item) is not DeltaOut or writer is None or writer.send is None:
            return item
        frame = _delta_mutation(item, sent)
        if frame is None:
            return None
        return None if writer.write_now(frame) else FLUSH

    try:
        # First, before any read: the reconnection time, and the sign that the stream
        # is subscribed (whatever commits from now on reaches it).
        yield frames.retry(config.retry_ms)
        last = await _last_sequence(database, session_id)
        if after is not None and after > last:
            yield frames.reset("cursor_ahead")
            after = None
        cursor = last
        if after is not None:
            async for chunk in _changed_messages(
                database, session_id, after, last, include_internal
            ):
                yield chunk
        for projection, parts in fanout.live_parts(session_id):
            for part in parts:
                sent[part["part_id"]] = text_units(part)
                yield frames.part_mutation(
                    session_id, projection.message_id, projection.revision, part
                )
        sub.deadline = _cycle_deadline(config.cycle_seconds)
        batch = Batch()
        while True:
            if batch.due(sub):
                yield batch.take()
            item = await sub.next(direct)
            if item is None:
                if sub.overflowed:
                    _overflowed(session_id, sub.limit)
                    batch.add(frames.reset("slow_consumer"))
                    batch.add(frames.disconnecting("error", config.retry_ms))
                if batch:
                    yield batch.take()
                return
            # Deltas first: nearly every item of a streaming turn is one.
            if type(item) is DeltaOut:
                frame = _delta_mutation(item, sent)
                if frame is not None:
                    batch.add(frame)
            elif isinstance(item, EventOut):
                if item.sequence > cursor + 1:
                    if batch:
                        yield batch.take()
                    async for chunk in _changed_messages(
                        database,
                        session_id,
                        cursor,
                        item.sequence - 1,
                        include_internal,
                    ):
                        yield chunk
                cursor = max(cursor, item.sequence)
            elif isinstance(item, EventMutationOut):
                # As for snapshots: a replay already sent what committed up to `last`.
                if after is None or item.sequence > last:
                    batch.add(item.frame)
            elif isinstance(item, MessageOut):
                # Replayed snapshots already cover what committed up to `last`; without
                # a cursor nothing was replayed, so every checkpoint is sent.
                if after is not None and item.sequence <= last:
                    continue
                if include_internal or item.visible:
                    batch.add(item.frame)
            elif isinstance(item, PartOut):
                sent[item.part_id] = item.text_length
                batch.add(item.frame)
            elif isinstance(item, WarningOut):
                batch.add(item.mutation_frame)
            elif item is FLUSH:
                # The response finishes the write `direct` began.
                yield b""
            elif item is HEARTBEAT:
                if config.keepalive is not None:
                    batch.add(config.keepalive)
            elif item is RESYNC:
                if batch:
                    yield batch.take()
                async for chunk in _changed_messages(
                    database, session_id, cursor, None, include_internal
                ):
                    yield chunk
                cursor = max(cursor, await _last_sequence(database, session_id))
            elif isinstance(item, Marker):
                batch.add(frames.disconnecting(CLOSE_REASONS[item], config.retry_ms))
                yield batch.take()
                return
    finally:
        fanout.unsubscribe(sub)
        release()


async def _changed_messages(
    database: Database,
    session_id: uuid.UUID,
    after: int,
    upto: int | None,
    include_internal: bool,
) -> AsyncIterator[bytes]:
    """What changed in (after, upto], in sequence order: the latest snapshot of each
    message changed (not its history), and the `turn` and `session` Mutations of the
    events between."""
    async with database.read() as db:
        stmt = select(*MUTATION_COLUMNS).where(
            models.Message.session_id == session_id,
            models.Message.changed_sequence > after,
        )
        events = select(
            models.Event.sequence, models.Event.type, models.Event.body
        ).where(
            models.Event.session_id == session_id,
            models.Event.sequence > after,
            models.Event.type.in_(frames.EVENT_MUTATIONS),
        )
        if upto is not None:
            stmt = stmt.where(models.Message.changed_sequence <= upto)
            events = events.where(models.Event.sequence <= upto)
        if not include_internal:
            stmt = stmt.where(models.Message.visibility == "visible")
        rows = (await db.execute(stmt.order_by(models.Message.changed_sequence))).all()
        event_rows = (await db.execute(events.order_by(models.Event.sequence))).all()
    changes: list[tuple[int, int, bytes]] = [
        (row.changed_sequence, SNAPSHOT, message_frame(session_id, row)) for row in rows
    ]
    for sequence, event_type, body in event_rows:
        mutation = frames.event_mutation(session_id, event_type, body)
        if mutation is not None:
            changes.append((sequence, EVENT_MUTATION, mutation))
    for chunk in checkpoint_order(changes):
        yield chunk
