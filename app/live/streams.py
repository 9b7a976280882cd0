"""The two streams as async generators of encoded frames. They hold no database
connection while they wait: every read is a short unit of work of its own. They wait
on their subscription alone: heartbeats and the end of a connection cycle arrive in it
as markers from the fan-out's process timer."""

import logging
import random
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

from sqlalchemy import bindparam, select

from app import wire
from app.db import models
from app.db.session import Database
from app.ids import format_id
from app.journal.events import event_rows
from app.live import frames
from app.live.fanout import Fanout, text_units
from app.live.items import MODEL_RETRY
from app.live.outputs import (
    CYCLE,
    FLUSH,
    GONE,
    HEARTBEAT,
    RESYNC,
    REVOKED,
    DeltaOut,
    Deltas,
    EventMutationOut,
    EventOut,
    Marker,
    MessageOut,
    Out,
    PartOut,
    WarningOut,
)
from app.live.replay import (
    EVENT_MUTATION,
    MUTATION_COLUMNS,
    SNAPSHOT,
    checkpoint_order,
    message_frame,
)
from app.live.subscription import Subscription
from app.live.writer import StreamWriter

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


class UpstreamView:
    """Upstream's `/sse` as one client sees it: `connected`, replay after the cursor,
    then durable events in sequence and the live deltas its filter accepts."""

    def __init__(
        self,
        database: Database,
        session_id: uuid.UUID,
        cursor: int | None,
        accept: Callable[[str], bool],
        config: StreamConfig,
    ) -> None:
        self.database = database
        self.session_id = session_id
        self.cursor = cursor
        self.accept = accept
        self.config = config
        self.position = Position(0)

    async def start(self) -> AsyncIterator[bytes]:
        # The starting position is fixed before `connected` goes out: a client that
        # acts on `connected` (posts a message) must see everything that follows.
        if self.cursor is None:
            self.position.sequence = await _last_sequence(
                self.database, self.session_id
            )
        else:
            self.position.sequence = self.cursor
        yield frames.connected(self.config.retry_ms)
        if self.cursor is not None:
            async for chunk in self.replay():
                yield chunk

    @property
    def sequence(self) -> int:
        """The durable sequence the client has been given up to."""
        return self.position.sequence

    def delta_frame(self, item: DeltaOut) -> bytes | None:
        return item.sse_frame if self.accept(item.delta.event_type) else None

    def overflow_frames(self) -> tuple[bytes, ...]:
        return (frames.disconnecting("error", self.config.retry_ms),)

    def catch_up(self, item: Out) -> AsyncIterator[bytes] | None:
        if item is RESYNC:
            return self.replay()
        if isinstance(item, EventOut) and item.sequence > self.position.sequence + 1:
            return self.replay(upto=item.sequence - 1)
        return None

    def frame(self, item: Out) -> bytes | None:
        if isinstance(item, EventOut):
            if item.sequence <= self.position.sequence:
                return None
            self.position.sequence = item.sequence
            return item.frame if self.accept(item.type) else None
        if isinstance(item, WarningOut):
            return item.sse_frame if self.accept(MODEL_RETRY) else None
        return None

    def replay(self, upto: int | None = None) -> AsyncIterator[bytes]:
        return _replay_events(
            self.database,
            self.session_id,
            self.position,
            self.accept,
            self.config,
            upto,
        )


class MutationView:
    """The Mutation stream as one client sees it: `message` snapshots changed after
    its cursor, the live parts, then snapshots, `turn`/`session` Mutations and deltas
    trimmed to what it lacks."""

    def __init__(
        self,
        database: Database,
        fanout: Fanout,
        session_id: uuid.UUID,
        after: int | None,
        include_internal: bool,
        config: StreamConfig,
    ) -> None:
        self.database = database
        self.fanout = fanout
        self.session_id = session_id
        self.after = after
        self.include_internal = include_internal
        self.config = config
        # The newest durable sequence the stream has seen.
        self.cursor = 0
        # The sequence up to which the stream's own reads (its replay, a resync, a
        # catch-up) sent every snapshot and Mutation: the fan-out's for a sequence up
        # to it, queued behind such a read, would send them again.
        self.covered = 0
        # UTF-16 code units of each live part this client has been sent, to trim
        # overlaps.
        self.sent: dict[str, int] = {}

    async def start(self) -> AsyncIterator[bytes]:
        # The live parts as they stand at subscription, taken before any read: each
        # builds on a revision of its message that committed before it was published,
        # so the replay read next covers it, and everything published after it is
        # queued behind it. (Taken after the replay, a part could run ahead of a
        # checkpoint still queued, and a frontend would see the step's text before the
        # tool result it follows.)
        live = self.fanout.live_parts(self.session_id)
        # First, before any read: the reconnection time, and the sign that the stream
        # is subscribed (whatever commits from now on reaches it).
        yield frames.retry(self.config.retry_ms)
        last = self.cursor = await _last_sequence(self.database, self.session_id)
        if self.after is not None and self.after > last:
            yield frames.reset("cursor_ahead")
            self.after = None
        # The revision of each message the replay sent.
        replayed: dict[uuid.UUID, int] = {}
        if self.after is not None:
            async for chunk in self.changed(self.after, last, replayed):
                yield chunk
            # (Without a cursor nothing is replayed, nothing covered: every checkpoint
            # is sent, as one that committed after the stream subscribed but before it
            # read `last` is one the client may lack.)
            self.covered = last
        for projection, parts in live:
            if replayed.get(projection.message_id, 0) > projection.revision:
                continue  # a later checkpoint of the message replaced them
            for part in parts:
                self.sent[part["part_id"]] = text_units(part)
                yield frames.part_mutation(
                    self.session_id, projection.message_id, projection.revision, part
                )

    @property
    def sequence(self) -> int:
        """The durable sequence the client has been given up to."""
        return self.cursor

    def delta_frame(self, item: DeltaOut) -> bytes | None:
        return _delta_mutation(item, self.sent)

    def overflow_frames(self) -> tuple[bytes, ...]:
        return (
            frames.reset("slow_consumer"),
            frames.disconnecting("error", self.config.retry_ms),
        )

    def catch_up(self, item: Out) -> AsyncIterator[bytes] | None:
        if item is RESYNC:
            return self.resync()
        if isinstance(item, EventOut) and item.sequence > self.cursor + 1:
            return self.catch_up_to(item.sequence - 1)
        return None

    def frame(self, item: Out) -> bytes | None:
        if isinstance(item, EventOut):
            self.cursor = max(self.cursor, item.sequence)
            return None
        if isinstance(item, EventMutationOut):
            return item.frame if item.sequence > self.covered else None
        if isinstance(item, MessageOut):
            if item.sequence <= self.covered:
                return None
            return item.frame if self.include_internal or item.visible else None
        if isinstance(item, PartOut):
            self.sent[item.part_id] = item.text_length
            return item.frame
        if isinstance(item, WarningOut):
            return item.mutation_frame
        return None

    def changed(
        self,
        after: int,
        upto: int | None,
        revisions: dict[uuid.UUID, int] | None = None,
    ) -> AsyncIterator[bytes]:
        return _changed_messages(
            self.database,
            self.session_id,
            after,
            upto,
            self.include_internal,
            revisions,
        )

    async def catch_up_to(self, upto: int) -> AsyncIterator[bytes]:
        async for chunk in self.changed(self.cursor, upto):
            yield chunk
        self.covered = max(self.covered, upto)

    async def resync(self) -> AsyncIterator[bytes]:
        # Read first: whatever committed up to it is in the read that follows.
        committed = await _last_sequence(self.database, self.session_id)
        async for chunk in self.changed(self.cursor, None):
            yield chunk
        self.covered = max(self.covered, committed)
        self.cursor = max(self.cursor, committed)


View = UpstreamView | MutationView


async def _stream(
    view: View,
    fanout: Fanout,
    release: Callable[[], None],
    key_hash: str | None,
    writer: StreamWriter | None,
) -> AsyncGenerator[bytes, None]:
    """The loop both streams share: subscribe, let the view start, then write what the
    subscription receives through the view, batched, until the server closes the
    connection (a marker) or the client falls too far behind. Through `writer` (its
    response's) live deltas go straight out from the fan-out's pass."""
    session_id, config = view.session_id, view.config
    sub = fanout.subscribe(session_id, key_hash)
    delta_frame = view.delta_frame

    def direct(item: Out) -> Out | None:
        if writer is None or writer.send is None:
            return item
        if type(item) is DeltaOut:
            frame = delta_frame(item)
        elif type(item) is Deltas:
            frame = _joined(delta_frame, item.items)
        else:
            return item
        if frame is None:
            return None
        return None if writer.write_now(frame) else FLUSH

    try:
        async for chunk in view.start():
            yield chunk
        sub.started_at = view.sequence
        sub.deadline = _cycle_deadline(config.cycle_seconds)
        batch = Batch()
        while True:
            if batch.due(sub):
                yield batch.take()
            item = await sub.next(direct)
            if item is None:
                if sub.overflowed:
                    _overflowed(session_id, sub.limit)
                    for closing in view.overflow_frames():
                        batch.add(closing)
                if batch:
                    yield batch.take()
                return
            # Deltas first: nearly every item of a streaming turn is one.
            if type(item) is DeltaOut:
                frame = delta_frame(item)
                if frame is not None:
                    batch.add(frame)
            elif type(item) is Deltas:
                frame = _joined(delta_frame, item.items)
                if frame is not None:
                    batch.add(frame)
            elif item is FLUSH:
                # The response finishes the write `direct` began.
                yield b""
            elif item is HEARTBEAT:
                if config.keepalive is not None:
                    batch.add(config.keepalive)
            elif isinstance(item, Marker) and item is not RESYNC:
                batch.add(frames.disconnecting(CLOSE_REASONS[item], config.retry_ms))
                yield batch.take()
                return
            else:
                replay = view.catch_up(item)
                if replay is not None:
                    if batch:
                        yield batch.take()
                    async for chunk in replay:
                        yield chunk
                frame = view.frame(item)
                if frame is not None:
                    batch.add(frame)
    finally:
        fanout.unsubscribe(sub)
        release()


def upstream_events(
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
) -> AsyncGenerator[bytes, None]:
    """Upstream's `/sse`: `connected`, replay after the cursor, then the live tail.
    Revoking `key_hash` (the key it was opened with) ends it."""
    view = UpstreamView(database, session_id, cursor, accept, config)
    return _stream(view, fanout, release, key_hash, writer)


def message_mutations(
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
) -> AsyncGenerator[bytes, None]:
    """The Mutation stream: `message` snapshots with cursor ids, `part`/`delta` of the
    live projection, `reset` when the cursor cannot be honoured, and `disconnecting`
    before every close the server decides, as on `/sse`. Revoking `key_hash` ends it."""
    view = MutationView(database, fanout, session_id, after, include_internal, config)
    return _stream(view, fanout, release, key_hash, writer)


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
            rows = await event_rows(
                db, session_id, after=position.sequence, upto=upto, limit=REPLAY_PAGE
            )
        for sequence, event_id, event_type, body in rows:
            position.sequence = sequence
            if accept(event_type):
                yield frames.durable_event(event_id, event_type, body, config.retry_ms)
        if len(rows) < REPLAY_PAGE:
            return


def _joined(
    delta_frame: Callable[[DeltaOut], bytes | None], items: list[DeltaOut]
) -> bytes | None:
    """The frames of consecutive deltas as one chunk (None: none for this client)."""
    frames = [frame for item in items if (frame := delta_frame(item)) is not None]
    return b"".join(frames) if frames else None


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


async def _changed_messages(
    database: Database,
    session_id: uuid.UUID,
    after: int,
    upto: int | None,
    include_internal: bool,
    revisions: dict[uuid.UUID, int] | None = None,
) -> AsyncIterator[bytes]:
    """What changed in (after, upto], in sequence order: the latest snapshot of each
    message changed (not its history), and the `turn` and `session` Mutations of the
    events between. `revisions` is given each message's revision sent."""
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
    if revisions is not None:
        revisions.update((row.id, row.revision) for row in rows)
    for sequence, event_type, body in event_rows:
        mutation = frames.event_mutation(session_id, event_type, body)
        if mutation is not None:
            changes.append((sequence, EVENT_MUTATION, mutation))
    for chunk in checkpoint_order(changes):
        yield chunk
