"""Local fan-out: one ordered channel per session with subscribers in this process, the
in-memory projection of every streaming message this process has heard of, and one
timer for every stream's heartbeats, connection cycling and stuck-send checks.

Bus items arrive via `deliver` (synchronously, in bus order). A wake-up makes the
session's channel read the new durable events and changed message snapshots once, for
all its subscribers; live items (parts, deltas) queue behind it, so every subscriber
sees a checkpoint before the deltas that extend it, and go straight to the subscribers
when nothing is ahead of them. Each frame is encoded once per item and the same bytes
go to every subscriber; a subscriber costs a bounded queue and one waiter, with no
task, timer or wrapper per item.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import select
from starlette.types import Send

from app import wire
from app.db import models
from app.db.session import Database
from app.events import service as events_service
from app.live import frames
from app.live.items import (
    Deleted,
    LiveItem,
    ModelWarning,
    PartStarted,
    Resync,
    StepEnded,
    TextDelta,
    Wakeup,
)
from app.ops import logs

log = logging.getLogger("app.live.fanout")


# ---- what subscribers receive ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventOut:
    """A durable event, encoded for upstream's stream."""

    sequence: int
    type: str
    frame: bytes


@dataclass(frozen=True, slots=True)
class MessageOut:
    """A committed message snapshot, encoded for the Mutation stream."""

    sequence: int
    visible: bool
    frame: bytes


@dataclass(frozen=True, slots=True)
class EventMutationOut:
    """The `turn` or `session` Mutation of a durable event, for the Mutation stream."""

    sequence: int
    frame: bytes


@dataclass(frozen=True, slots=True)
class PartOut:
    part_id: str
    # The UTF-16 length of the part's text so far: where its next delta starts.
    text_length: int
    frame: bytes


@dataclass(frozen=True, slots=True)
class DeltaOut:
    delta: TextDelta
    sse_frame: bytes
    mutation_frame: bytes
    # Where the delta's text ends in its part, in UTF-16 code units.
    end: int


@dataclass(frozen=True, slots=True)
class WarningOut:
    """A model retry notice, encoded for both streams."""

    sse_frame: bytes
    mutation_frame: bytes


class Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Marker({self.name})"


# Re-read from the database (the bus may have missed items, or the channel failed).
RESYNC = Marker("resync")
# The process timer: time for a keep-alive comment.
HEARTBEAT = Marker("heartbeat")
# The process timer: this stream's connection cycle is over.
CYCLE = Marker("cycle")
# The session was deleted.
GONE = Marker("gone")
# The key the stream was opened with was revoked.
REVOKED = Marker("revoked")
# A frame written from the fan-out's pass has to wait for the socket: the stream's task
# finishes that write before anything else (see Subscription.direct).
FLUSH = Marker("flush")

Out = (
    EventOut | EventMutationOut | MessageOut | PartOut | DeltaOut | WarningOut | Marker
)


class Subscription:
    """One local subscriber: a bounded queue and one waiter. A subscriber that falls
    behind by more than its queue size is marked overflowed; its stream ends and the
    client resumes from its cursor, so a slow reader never slows anyone else.

    While its stream waits with nothing queued, the stream may lend it `direct`: an
    item offered then is handed to it first, and what it writes to the client itself
    (a live delta, nearly every item of a streaming turn) goes out in the fan-out's
    own pass, without waking the stream's task. Nothing is queued ahead of it then, and
    the stream's task is not writing, so the order is the same."""

    __slots__ = (
        "closed",
        "deadline",
        "direct",
        "key_hash",
        "limit",
        "next_heartbeat",
        "overflowed",
        "pending",
        "session_id",
        "waiter",
    )

    def __init__(
        self,
        session_id: uuid.UUID,
        limit: int,
        heartbeat_seconds: float,
        key_hash: str | None = None,
    ) -> None:
        self.session_id = session_id
        # The key the stream was opened with (None: open mode).
        self.key_hash = key_hash
        self.limit = limit
        # A list, not a deque: an idle stream holds it, and an empty deque costs a
        # 0.7 KB block; queues are short, so popping the front is cheap.
        self.pending: list[Out] = []
        self.waiter: asyncio.Future[None] | None = None
        # Set only while the stream waits with nothing queued: takes an item, and
        # returns None once it wrote or dropped it, else what to queue (the item, or
        # FLUSH when its write waits for the socket).
        self.direct: Callable[[Out], Out | None] | None = None
        self.overflowed = False
        # The client went away, or its stream was stopped from outside.
        self.closed = False
        # When the process timer ends this connection cycle (monotonic); inf: never.
        self.deadline = float("inf")
        # When the process timer next offers this stream a heartbeat.
        self.next_heartbeat = time.monotonic() + heartbeat_seconds

    def offer(self, item: Out) -> None:
        if self.overflowed or self.closed:
            return
        direct = self.direct
        if direct is not None:
            queued = direct(item)
            if queued is None:
                return
            item = queued
        if len(self.pending) >= self.limit:
            self.overflowed = True
        else:
            self.pending.append(item)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def end(self, marker: "Marker") -> None:
        """End the stream with `marker` next, ahead of anything still queued."""
        if not self.closed:
            self.pending.insert(0, marker)
            self.closed = True
            self._wake()

    def _wake(self) -> None:
        # Woken, the stream writes what is queued first: nothing may pass it now.
        self.direct = None
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(
        self, direct: Callable[[Out], Out | None] | None = None
    ) -> Out | None:
        """The next item; None once the subscription overflowed or was closed (and what
        `end` queued was taken). `direct` takes the items offered while it waits."""
        while not self.pending:
            if self.overflowed or self.closed:
                return None
            self.waiter = asyncio.get_running_loop().create_future()
            self.direct = direct
            try:
                await self.waiter
            finally:
                self.waiter = None
                self.direct = None
        if self.overflowed:
            return None
        return self.pending.pop(0)


class StreamWriter:
    """One streaming response writing to its socket. Its stream may write a frame at
    once from outside the response's task (`write_now`); the process timer stops the
    response (by cancelling its task) when one write has waited longer than the send
    timeout."""

    __slots__ = ("send", "send_started", "stuck", "task", "unfinished")

    def __init__(self) -> None:
        # Both set by the response while it streams.
        self.task: asyncio.Task[Any] | None = None
        self.send: Send | None = None
        # Monotonic time the write in progress began; None between writes.
        self.send_started: float | None = None
        self.stuck = False
        # A write `write_now` began that waits for the socket (its coroutine and what
        # that waits on), or the exception it raised: the task finishes it first.
        self.unfinished: tuple[Generator[Any, None, None], Any] | Exception | None = (
            None
        )

    def write_now(self, chunk: bytes) -> bool:
        """Write `chunk` now, outside the response's task. False when the write has to
        wait for the socket, or failed: the task must `finish` it before any other."""
        assert self.send is not None
        write = self.send(
            {"type": "http.response.body", "body": chunk, "more_body": True}
        ).__await__()
        try:
            waiting = write.send(None)
        except StopIteration:
            return True
        except Exception as exc:
            self.unfinished = exc
            return False
        self.unfinished = (write, waiting)
        self.send_started = time.monotonic()
        return False

    async def finish(self) -> None:
        """Finish what `write_now` began (or raise what it raised)."""
        unfinished, self.unfinished = self.unfinished, None
        if isinstance(unfinished, Exception):
            raise unfinished
        if unfinished is not None:
            await _Resumed(*unfinished)
            self.send_started = None

    def abandon(self) -> None:
        """The response ends: nothing more is written, begun or not."""
        self.send = None
        unfinished, self.unfinished = self.unfinished, None
        if isinstance(unfinished, tuple):
            unfinished[0].close()


class _Resumed:
    """The rest of an await begun outside any task, driven as its task would: each
    future it waits on is handed to the awaiting task, which resumes it when done."""

    __slots__ = ("coro", "waiting")

    def __init__(self, coro: Generator[Any, None, None], waiting: Any) -> None:
        self.coro = coro
        self.waiting = waiting

    def __await__(self) -> Generator[Any, None, None]:
        coro, waiting = self.coro, self.waiting
        try:
            while True:
                yield waiting
                waiting = coro.send(None)
        except StopIteration:
            return
        except BaseException:
            coro.close()
            raise


@dataclass
class Projection:
    """The live, uncommitted parts of one streaming message, extending `revision`."""

    session_id: uuid.UUID
    message_id: uuid.UUID
    revision: int
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The UTF-16 length of each part's text, kept per delta (not measured again).
    units: dict[str, int] = field(default_factory=dict)


def text_key(part: dict[str, Any]) -> str:
    """The field of a live part that deltas extend: a tool call's streamed input, or
    the text of a text or reasoning part."""
    return "input_text" if part.get("type") == "tool_call" else "text"


def text_units(part: dict[str, Any]) -> int:
    """The UTF-16 length of a live part's text (a tool call's: its input so far); 0
    for a part without, or with the committed, structured form of a reasoning text."""
    text = part.get(text_key(part))
    return wire.utf16_len(text) if isinstance(text, str) else 0


@dataclass(eq=False)
class Channel:
    session_id: uuid.UUID
    subscribers: set[Subscription] = field(default_factory=set)
    inbox: asyncio.Queue[Wakeup | Out] = field(default_factory=asyncio.Queue)
    last: int | None = None
    task: asyncio.Task[None] | None = None
    # Whether the pump is handling an item (a wake-up's read may be in progress).
    busy: bool = False

    def offer(self, item: Out) -> None:
        for sub in tuple(self.subscribers):
            sub.offer(item)


class Fanout:
    def __init__(
        self,
        database: Database,
        queue_size: int,
        *,
        retry_ms: int = 100,
        heartbeat_seconds: float = 30.0,
        send_timeout_seconds: float = 30.0,
        on_missed_part: Callable[[uuid.UUID], None] = lambda message_id: None,
    ) -> None:
        self.database = database
        self.queue_size = queue_size
        self.retry_ms = retry_ms
        self.heartbeat_seconds = heartbeat_seconds
        self.send_timeout_seconds = send_timeout_seconds
        self.on_missed_part = on_missed_part
        self.channels: dict[uuid.UUID, Channel] = {}
        self.projections: dict[uuid.UUID, Projection] = {}
        self.writers: set[StreamWriter] = set()
        # Subscribers dropped for reading too slowly (a metric).
        self.dropped = 0
        # Streams `cycle_all` told (only while the process drains).
        self._cycled: set[Subscription] = set()
        self._timer: asyncio.Task[None] | None = None

    # ---- bus side ------------------------------------------------------------------

    def deliver(self, item: Wakeup | Deleted | Resync | LiveItem) -> None:
        if isinstance(item, ModelWarning):
            self._to_channel(
                item.session_id,
                WarningOut(
                    frames.warning_event(item, self.retry_ms),
                    frames.warning_mutation(item),
                ),
            )
        elif isinstance(item, TextDelta | PartStarted | StepEnded):
            out = self._project(item)
            if out is not None:
                self._to_channel(item.session_id, out)
        elif isinstance(item, Wakeup):
            self._to_channel(item.session_id, item)
        elif isinstance(item, Resync):
            for channel in self.channels.values():
                channel.inbox.put_nowait(RESYNC)
        elif isinstance(item, Deleted):
            gone = self.channels.get(item.session_id)
            if gone is not None:
                for sub in tuple(gone.subscribers):
                    sub.offer(GONE)

    def _to_channel(self, session_id: uuid.UUID, item: Wakeup | Out) -> None:
        channel = self.channels.get(session_id)
        if channel is None:
            return
        if channel.busy or not channel.inbox.empty() or isinstance(item, Wakeup):
            # Behind a wake-up's read: it goes out after what that read finds.
            channel.inbox.put_nowait(item)
        else:
            # Nothing is ahead of it: straight to the subscribers, without a hop
            # through the pump (nearly every live item of a streaming turn).
            channel.offer(item)

    def _project(self, item: PartStarted | TextDelta | StepEnded) -> Out | None:
        """Apply a live item to the projection. Returns what subscribers get (a delta
        trimmed of text the projection already has), or None to drop it."""
        if isinstance(item, StepEnded):
            self.projections.pop(item.message_id, None)
            return None
        projection = self.projections.get(item.message_id)
        if projection is None or item.revision > projection.revision:
            projection = Projection(item.session_id, item.message_id, item.revision)
            self.projections[item.message_id] = projection
        elif item.revision < projection.revision:
            return None
        if isinstance(item, PartStarted):
            part = dict(item.part)
            part_id = part["part_id"]
            projection.parts[part_id] = part
            units = projection.units[part_id] = text_units(part)
            return PartOut(
                part_id,
                units,
                frames.part_mutation(
                    item.session_id, item.message_id, item.revision, part
                ),
            )
        known_part = projection.parts.get(item.part_id)
        known = projection.units[item.part_id] if known_part is not None else -1
        if known_part is None or item.offset > known:
            # We missed the start of this part (this process joined mid-stream): ask
            # its runner to republish its parts, and pass nothing on until then.
            self.on_missed_part(item.message_id)
            return None
        delta = item
        length = wire.utf16_len(item.text)
        if item.offset < known:
            overlap = known - item.offset
            if overlap >= length:
                return None
            delta = _trimmed(item, known)
            length -= overlap
        key = text_key(known_part)
        known_part[key] = accumulated = known_part.get(key, "") + delta.text
        end = projection.units[item.part_id] = delta.offset + length
        return DeltaOut(
            delta,
            frames.delta_event(delta, accumulated, self.retry_ms),
            frames.delta_mutation(delta, delta.offset, delta.text),
            end,
        )

    def live_parts(
        self, session_id: uuid.UUID
    ) -> list[tuple[Projection, list[dict[str, Any]]]]:
        return [
            (p, [dict(part) for part in p.parts.values()])
            for p in self.projections.values()
            if p.session_id == session_id
        ]

    # ---- subscriber side -----------------------------------------------------------

    def subscribe(
        self, session_id: uuid.UUID, key_hash: str | None = None
    ) -> Subscription:
        sub = Subscription(
            session_id, self.queue_size, self.heartbeat_seconds, key_hash
        )
        channel = self.channels.get(session_id)
        if channel is None:
            channel = Channel(session_id)
            self.channels[session_id] = channel
            channel.task = asyncio.create_task(
                self._pump(channel), name=f"fanout-{session_id.hex}"
            )
        channel.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if sub.overflowed:
            self.dropped += 1
        channel = self.channels.get(sub.session_id)
        if channel is None:
            return
        channel.subscribers.discard(sub)
        if not channel.subscribers:
            del self.channels[sub.session_id]
            if channel.task is not None:
                channel.task.cancel()

    def key_hashes(self) -> set[str]:
        """The keys local streams were opened with."""
        return {
            sub.key_hash
            for channel in self.channels.values()
            for sub in channel.subscribers
            if sub.key_hash is not None
        }

    def revoke(self, key_hashes: set[str | None]) -> None:
        """End every local stream opened with one of these keys (None: in open mode)."""
        for channel in tuple(self.channels.values()):
            for sub in tuple(channel.subscribers):
                if sub.key_hash in key_hashes:
                    sub.end(REVOKED)

    def count(self, session_id: uuid.UUID | None = None) -> int:
        if session_id is None:
            return sum(len(c.subscribers) for c in self.channels.values())
        channel = self.channels.get(session_id)
        return len(channel.subscribers) if channel is not None else 0

    # ---- the process timer ---------------------------------------------------------

    def start(self) -> None:
        self._timer = asyncio.create_task(self._tick(), name="fanout-timer")

    async def _tick(self) -> None:
        """Heartbeats, connection cycles and stuck sends for every local stream, from
        one timer. Its resolution bounds how late a heartbeat or the end of a cycle
        comes, and how late a stuck client is dropped."""
        resolution = min(1.0, self.heartbeat_seconds / 5)
        while True:
            await asyncio.sleep(resolution)
            now = time.monotonic()
            for writer in tuple(self.writers):
                started = writer.send_started
                if started is not None and now - started > self.send_timeout_seconds:
                    # The client stopped reading: stop its stream where it waits.
                    writer.stuck = True
                    self.writers.discard(writer)
                    if writer.task is not None:
                        writer.task.cancel()
            for channel in tuple(self.channels.values()):
                for sub in tuple(channel.subscribers):
                    if now >= sub.deadline:
                        sub.deadline = float("inf")
                        sub.offer(CYCLE)
                    elif now >= sub.next_heartbeat:
                        sub.next_heartbeat = now + self.heartbeat_seconds
                        sub.offer(HEARTBEAT)

    def cycle_all(self) -> int:
        """End every local stream's connection cycle now, as the timer does at its
        deadline (`disconnecting` with the retry hint, on the streams that send one):
        the drain's way of moving clients to another process. Called again while the
        drain lasts, it tells only streams opened since. Returns how many it told."""
        told = 0
        for channel in tuple(self.channels.values()):
            for sub in tuple(channel.subscribers):
                if sub not in self._cycled:
                    self._cycled.add(sub)
                    sub.deadline = float("inf")
                    sub.offer(CYCLE)
                    told += 1
        return told

    async def close(self) -> None:
        tasks = [c.task for c in self.channels.values() if c.task is not None]
        if self._timer is not None:
            tasks.append(self._timer)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.channels.clear()

    # ---- per-session reads ---------------------------------------------------------

    async def _pump(self, channel: Channel) -> None:
        # Created inside the request of the channel's first stream: its log lines are
        # the session's, not that request's.
        logs.REQUEST_ID.set(None)
        while True:
            channel.busy = False
            item = await channel.inbox.get()
            channel.busy = True
            if isinstance(item, Wakeup):
                try:
                    items = await self._read_checkpoints(channel, item.sequence)
                except Exception as exc:
                    # The database is unreachable: subscribers re-read from their own
                    # cursors once it is back.
                    log.warning(
                        "fan-out read for session %s failed: %s",
                        channel.session_id,
                        exc,
                    )
                    items = [RESYNC]
            else:
                items = [item]
            for out in items:
                channel.offer(out)

    async def _read_checkpoints(self, channel: Channel, upto: int) -> list[Out]:
        """Read what committed in (channel.last, upto], once for every subscriber."""
        if channel.last is None:
            # First wake-up since the channel opened: subscribers replayed up to their
            # own cursors, and they fill any gap below this item themselves.
            channel.last = upto - 1
        if upto <= channel.last:
            return []
        async with self.database.read() as db:
            events = await events_service.event_rows(
                db, channel.session_id, after=channel.last, upto=upto
            )
            messages = (
                await db.execute(
                    select(*MUTATION_COLUMNS)
                    .where(
                        models.Message.session_id == channel.session_id,
                        models.Message.changed_sequence > channel.last,
                        models.Message.changed_sequence <= upto,
                    )
                    .order_by(models.Message.changed_sequence)
                )
            ).all()
        channel.last = max(channel.last, events[-1][0] if events else upto)
        changes: list[tuple[int, int, Out]] = []
        for sequence, event_id, event_type, body in events:
            changes.append(
                (
                    sequence,
                    EVENT,
                    EventOut(
                        sequence,
                        event_type,
                        frames.durable_event(event_id, event_type, body, self.retry_ms),
                    ),
                )
            )
            mutation = frames.event_mutation(channel.session_id, event_type, body)
            if mutation is not None:
                changes.append(
                    (sequence, EVENT_MUTATION, EventMutationOut(sequence, mutation))
                )
        changes.extend(
            (
                row.changed_sequence,
                SNAPSHOT,
                MessageOut(
                    row.changed_sequence,
                    row.visibility == "visible",
                    message_frame(channel.session_id, row),
                ),
            )
            for row in messages
        )
        return checkpoint_order(changes)


# The kinds of durable change, in the order they go out at one sequence.
EVENT, EVENT_MUTATION, SNAPSHOT = 0, 1, 2
T = TypeVar("T")


def checkpoint_order(changes: list[tuple[int, int, T]]) -> list[T]:
    """Durable changes (sequence, kind, value) in the order the streams send them.
    Events go out in sequence. A `message` snapshot carries its checkpoint's last
    sequence, so it follows the checkpoint's events. An event's `turn` or `session`
    Mutation waits for the snapshots of its checkpoint: a client that sees a turn end
    already has the message that ended it. (A checkpoint that changed no message lets
    its Mutations out at the next one's snapshots, or at the end.)"""
    changes.sort(key=lambda change: change[:2])
    out: list[T] = []
    deferred: list[T] = []
    for index, (sequence, kind, value) in enumerate(changes):
        if kind == EVENT_MUTATION:
            deferred.append(value)
            continue
        out.append(value)
        last_at_sequence = (
            index + 1 == len(changes) or changes[index + 1][0] != sequence
        )
        if kind == SNAPSHOT and last_at_sequence:
            out.extend(deferred)
            deferred.clear()
    out.extend(deferred)
    return out


# What a `message` Mutation is made of, as the fan-out and the replays read it.
MUTATION_COLUMNS = (
    models.Message.changed_sequence,
    models.Message.visibility,
    models.Message.snapshot,
    models.Message.id,
    models.Message.revision,
    models.Message.updated_at,
)


def message_frame(session_id: uuid.UUID, row: Any) -> bytes:
    """The `message` Mutation of a row of MUTATION_COLUMNS."""
    return frames.message_mutation(
        row.changed_sequence,
        row.snapshot,
        session_id=session_id,
        message_id=row.id,
        revision=row.revision,
        updated_at=row.updated_at,
    )


def _trimmed(delta: TextDelta, known: int) -> TextDelta:
    """The part of `delta` past the `known` UTF-16 code units of its part."""
    return TextDelta(
        delta.session_id,
        delta.message_id,
        delta.revision,
        delta.turn_id,
        delta.part_id,
        known,
        wire.utf16_tail(delta.text, known - delta.offset),
        delta.event_type,
        delta.event_id,
        delta.ts,
        delta.tool_call_id,
    )
