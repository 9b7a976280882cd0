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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app import wire
from app.db.reads import Reads
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
from app.live.outputs import (
    CYCLE,
    GONE,
    HEARTBEAT,
    RESYNC,
    REVOKED,
    DeltaOut,
    Deltas,
    Out,
    PartOut,
    WarningOut,
)
from app.live.replay import checkpoint_outs
from app.live.subscription import Subscription
from app.live.writer import StreamWriter
from app.telemetry import logs

log = logging.getLogger("app.live.fanout")


class Text:
    """A part's text as its deltas arrive: appended in O(1), joined on demand. A
    prefix of it stays what it was: `upto(n)` is the text after the first n appends."""

    __slots__ = ("pieces",)

    def __init__(self) -> None:
        self.pieces: list[str] = []

    def append(self, piece: str) -> int:
        self.pieces.append(piece)
        return len(self.pieces)

    def upto(self, count: int) -> str:
        return "".join(self.pieces[:count])

    def value(self) -> str:
        return "".join(self.pieces)


@dataclass
class Projection:
    """The live, uncommitted parts of one streaming message, extending `revision`."""

    session_id: uuid.UUID
    message_id: uuid.UUID
    revision: int
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The UTF-16 length of each part's text, kept per delta (not measured again).
    units: dict[str, int] = field(default_factory=dict)
    # The text each part's deltas added since it was last joined into the part: one
    # append per delta, whatever the length of the text so far.
    chunks: dict[str, Text] = field(default_factory=dict)

    def joined(self) -> list[dict[str, Any]]:
        """The parts, each with its whole text so far (copies)."""
        parts = []
        for part_id, part in self.parts.items():
            part = dict(part)
            text = self.chunks.get(part_id)
            if text is not None:
                key = text_key(part)
                part[key] = part.get(key, "") + text.value()
            parts.append(part)
        return parts


def text_key(part: dict[str, Any]) -> str:
    """The field of a live part that deltas extend: a tool call's streamed input, or
    the text of a text or reasoning part."""
    return "input_text" if part.get("type") == "tool_call" else "text"


def text_units(part: dict[str, Any]) -> int:
    """The UTF-16 length of a live part's text (a tool call's: its input so far); 0
    for a part without, or with the committed, structured form of a reasoning text."""
    text = part.get(text_key(part))
    return wire.utf16_len(text) if isinstance(text, str) else 0


# A pass that took longer (about a hundred streams' writes) makes the next one wait
# for the publisher's next deltas: one more turn of the loop, for one write less each.
SLOW_PASS_SECONDS = 0.001


@dataclass(eq=False)
class Channel:
    session_id: uuid.UUID
    subscribers: set[Subscription] = field(default_factory=set)
    inbox: asyncio.Queue[Wakeup | Out] = field(default_factory=asyncio.Queue)
    last: int | None = None
    task: asyncio.Task[None] | None = None
    # Whether the pump is handling an item (a wake-up's read may be in progress).
    busy: bool = False
    # Live items for the subscribers, offered in one pass (`pass_soon`).
    live: list[Out] = field(default_factory=list)
    # How long the last pass took (seconds).
    last_pass: float = 0.0

    def offer(self, item: Out) -> None:
        for sub in tuple(self.subscribers):
            sub.offer(item)

    def pass_soon(self) -> None:
        """Offer the live items on the loop's next turn: the publisher (the model's
        reader) goes on at once, and writing to a thousand sockets is not its wait.
        A channel whose passes take a while (a thousand streams: a thousand socket
        writes, nearly all of the time in the kernel, whether a pass carries one delta
        or five) waits one turn more, until everything ready now has run, the publisher
        too: the deltas it has by then (a model's chunks read together, or those that
        fell due while the last pass wrote) go to each subscriber in one write."""
        loop = asyncio.get_running_loop()
        if self.last_pass < SLOW_PASS_SECONDS:
            loop.call_soon(self.flush)
        else:
            loop.call_soon(loop.call_soon, self.flush)

    def flush(self) -> None:
        items, self.live = self.live, []
        if not items:
            return
        started = time.perf_counter()
        if len(items) > 1:
            items = _runs_of_deltas(items)
        for item in items:
            self.offer(item)
        self.last_pass = time.perf_counter() - started


def _runs_of_deltas(items: list[Out]) -> list[Out]:
    """`items` with each run of consecutive deltas as one `Deltas`."""
    grouped: list[Out] = []
    run: list[DeltaOut] = []
    for item in items:
        if type(item) is DeltaOut:
            run.append(item)
            continue
        if run:
            grouped.append(run[0] if len(run) == 1 else Deltas(run))
            run = []
        grouped.append(item)
    if run:
        grouped.append(run[0] if len(run) == 1 else Deltas(run))
    return grouped


class Fanout:
    def __init__(
        self,
        reads: Reads,
        queue_size: int,
        *,
        retry_ms: int = 100,
        heartbeat_seconds: float = 30.0,
        send_timeout_seconds: float = 30.0,
        on_missed_part: Callable[[uuid.UUID], None] = lambda message_id: None,
    ) -> None:
        self.reads = reads
        self.queue_size = queue_size
        self.retry_ms = retry_ms
        self.heartbeat_seconds = heartbeat_seconds
        self.send_timeout_seconds = send_timeout_seconds
        self.on_missed_part = on_missed_part
        # Told when a session gets its first local stream and when its last one ends:
        # a bus that carries live items only to the processes that watch a session
        # subscribes to it then.
        self.on_watch: Callable[[uuid.UUID], None] = lambda session_id: None
        self.on_unwatch: Callable[[uuid.UUID], None] = lambda session_id: None
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
            # Every streaming message is projected (a stream that opens later starts
            # from its live parts); its frames are made only for a session with
            # streams here.
            encode = item.session_id in self.channels
            out = self._project(item, encode)
            if out is not None:
                self._to_channel(item.session_id, out)
        elif isinstance(item, Wakeup):
            self._to_channel(item.session_id, item)
        elif isinstance(item, Resync):
            for channel in self.channels.values():
                channel.flush()
                channel.inbox.put_nowait(RESYNC)
        elif isinstance(item, Deleted):
            gone = self.channels.get(item.session_id)
            if gone is not None:
                gone.flush()
                for sub in tuple(gone.subscribers):
                    sub.offer(GONE)

    def _to_channel(self, session_id: uuid.UUID, item: Wakeup | Out) -> None:
        channel = self.channels.get(session_id)
        if channel is None:
            return
        if channel.busy or not channel.inbox.empty() or isinstance(item, Wakeup):
            # Behind a wake-up's read: it goes out after what that read finds, and
            # after the live items before it.
            channel.flush()
            channel.inbox.put_nowait(item)
        else:
            # Nothing is ahead of it: to the subscribers without a hop through the
            # pump (nearly every live item of a streaming turn), in the channel's
            # next pass.
            channel.live.append(item)
            if len(channel.live) == 1:
                channel.pass_soon()

    def _project(
        self, item: PartStarted | TextDelta | StepEnded, encode: bool
    ) -> Out | None:
        """Apply a live item to the projection. Returns what subscribers get (a delta
        trimmed of text the projection already has), or None to drop it (or, unless
        `encode`, once it is applied)."""
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
            # The part as it stands now replaces what its deltas had added.
            projection.chunks.pop(part_id, None)
            units = projection.units[part_id] = text_units(part)
            if not encode:
                return None
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
        text = projection.chunks.get(item.part_id)
        if text is None:
            text = projection.chunks[item.part_id] = Text()
        count = text.append(delta.text)
        end = projection.units[item.part_id] = delta.offset + length
        if not encode:
            return None
        start = known_part.get(text_key(known_part), "")
        retry_ms = self.retry_ms

        def sse_frame() -> bytes:
            # Upstream's `accumulated`: the part's text up to and including this delta.
            accumulated = start + text.upto(count)
            return frames.delta_event(delta, accumulated, retry_ms)

        return DeltaOut(
            delta,
            sse_frame,
            frames.delta_mutation(delta, delta.offset, delta.text),
            end,
        )

    def live_parts(
        self, session_id: uuid.UUID
    ) -> list[tuple[Projection, list[dict[str, Any]]]]:
        return [
            (p, p.joined())
            for p in self.projections.values()
            if p.session_id == session_id
        ]

    # ---- subscriber side -----------------------------------------------------------

    def subscribe(
        self,
        session_id: uuid.UUID,
        key_hash: str | None = None,
        *,
        durable_only: bool = False,
    ) -> Subscription:
        sub = Subscription(
            session_id, self.queue_size, self.heartbeat_seconds, key_hash, durable_only
        )
        channel = self.channels.get(session_id)
        if channel is None:
            channel = Channel(session_id)
            self.channels[session_id] = channel
            channel.task = asyncio.create_task(
                self._pump(channel), name=f"fanout-{session_id.hex}"
            )
            self.on_watch(session_id)
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
            self.on_unwatch(sub.session_id)

    def forget(self, session_id: uuid.UUID, keep: Callable[[uuid.UUID], bool]) -> None:
        """Drop the live projections of a session whose live items stop reaching this
        process (the ends of their steps would not either), but those of the messages
        `keep` names (streamed here); a stream that opens on the session later asks
        the runner for its parts again (`on_missed_part`)."""
        for message_id, projection in tuple(self.projections.items()):
            if projection.session_id == session_id and not keep(message_id):
                del self.projections[message_id]

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

    async def _read_checkpoints(self, channel: Channel, wakeup: Wakeup) -> list[Out]:
        """Read what committed in (channel.last, wakeup.sequence], once for every
        subscriber."""
        upto = wakeup.sequence
        if channel.last is None:
            # First wake-up since the channel opened: read from where the subscribers
            # that went live began, so that none has a gap to read for itself (one
            # still starting fills its own), and at least the whole of the checkpoints
            # that woke it: a subscriber still starting may have read its position
            # after they committed, and without a cursor it is owed every one of their
            # Mutations (`session.activated` comes before a message's last sequence).
            # A subscriber that began later skips the events it has; without a cursor
            # it is sent the newest snapshot of a message changed since the earliest
            # began, as it is of one changed while it started.
            started = [
                sub.started_at
                for sub in channel.subscribers
                if sub.started_at is not None
            ]
            woke = upto if wakeup.first is None else wakeup.first
            channel.last = min([woke - 1, *started])
        if upto <= channel.last:
            return []
        if wakeup.rows is not None and wakeup.first == channel.last + 1:
            # This process wrote them, and they follow what the channel has: as
            # written is as stored.
            rows = wakeup.rows
        else:
            rows = await self.reads.checkpoints(
                channel.session_id, after=channel.last, upto=upto
            )
        channel.last, items = checkpoint_outs(
            channel.session_id,
            rows,
            after=channel.last,
            upto=upto,
            retry_ms=self.retry_ms,
        )
        return items

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
                    items = await self._read_checkpoints(channel, item)
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
