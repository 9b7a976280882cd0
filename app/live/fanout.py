"""Local fan-out: one ordered channel per session with subscribers in this process, and
the in-memory projection of every streaming message this process has heard of.

Bus items arrive via `deliver` (synchronously, in bus order). A wake-up makes the
session's channel read the new durable events and changed message snapshots once, for
all its subscribers; live items (parts, deltas) queue behind it, so every subscriber
sees a checkpoint before the deltas that extend it. Frames are encoded once per item
and the same bytes go to every subscriber.
"""

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from app.db import models
from app.db.session import Database
from app.events import service as events_service

log = logging.getLogger("app.live.fanout")

Item = dict[str, Any]


def event_item(sequence: int, event_id: uuid.UUID, event_type: str, body: str) -> Item:
    """A durable event as it travels to subscribers."""
    return {"k": "e", "q": sequence, "id": event_id, "type": event_type, "body": body}


@dataclass(eq=False)
class Subscription:
    """One local subscriber: a bounded queue. A subscriber that falls behind by more than
    its queue size is marked overflowed; its stream ends and the client resumes from its
    cursor, so a slow reader never slows the producer or other subscribers."""

    session_id: uuid.UUID
    queue: asyncio.Queue[Item]
    overflowed: bool = False

    def offer(self, item: Item) -> None:
        if self.overflowed:
            return
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.overflowed = True


@dataclass
class Projection:
    """The live, uncommitted parts of one streaming message, extending `revision`."""

    session_id: uuid.UUID
    message_id: uuid.UUID
    revision: int
    turn_id: str | None = None
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(eq=False)
class Channel:
    session_id: uuid.UUID
    subscribers: set[Subscription] = field(default_factory=set)
    inbox: asyncio.Queue[Item] = field(default_factory=asyncio.Queue)
    last: int | None = None
    task: asyncio.Task[None] | None = None


class Fanout:
    def __init__(self, database: Database, queue_size: int) -> None:
        self.database = database
        self.queue_size = queue_size
        self.channels: dict[uuid.UUID, Channel] = {}
        self.projections: dict[uuid.UUID, Projection] = {}
        self.watchers: dict[uuid.UUID, set[asyncio.Event]] = {}
        self.control_handlers: list[Callable[[Item], None]] = []
        self.resync_requests: list[Callable[[uuid.UUID], None]] = []

    # ---- bus side ------------------------------------------------------------------

    def deliver(self, item: Item) -> None:
        kind = item.get("k")
        if kind == "c":
            for handler in self.control_handlers:
                handler(item)
            return
        if kind == "resync":
            for channel in self.channels.values():
                channel.inbox.put_nowait(item)
            for events in self.watchers.values():
                for event in events:
                    event.set()
            return
        session_id = uuid.UUID(hex=item["s"])
        if kind == "w":
            for event in self.watchers.get(session_id, ()):
                event.set()
        elif kind in ("p", "d", "x"):
            projected = self._project(item)
            if projected is None:
                return
            item = projected
        target = self.channels.get(session_id)
        if target is not None:
            target.inbox.put_nowait(item)

    def _project(self, item: Item) -> Item | None:
        """Apply a live item to the projection. Returns the item to pass on (a delta
        trimmed of text the projection already has), or None to drop it."""
        message_id = uuid.UUID(hex=item["m"])
        if item["k"] == "x":
            self.projections.pop(message_id, None)
            return item
        projection = self.projections.get(message_id)
        if projection is None or item["r"] > projection.revision:
            projection = Projection(
                uuid.UUID(hex=item["s"]), message_id, item["r"], item.get("turn")
            )
            self.projections[message_id] = projection
        elif item["r"] < projection.revision:
            return None
        if item["k"] == "p":
            projection.parts[item["part"]["part_id"]] = dict(item["part"])
            return item
        part = projection.parts.get(item["pid"])
        known = len(part.get("text", "")) if part is not None else -1
        if part is None or item["o"] > known:
            # We missed the start of this part (this process joined mid-stream): ask the
            # runner to republish its parts, and pass nothing on until then.
            for request in self.resync_requests:
                request(message_id)
            return None
        if item["o"] < known:
            overlap = known - item["o"]
            if overlap >= len(item["t"]):
                return None
            item = {**item, "t": item["t"][overlap:], "o": known}
        part["text"] = part.get("text", "") + item["t"]
        item["acc"] = part["text"]
        return item

    def live_parts(
        self, session_id: uuid.UUID
    ) -> list[tuple[Projection, list[dict[str, Any]]]]:
        return [
            (p, [dict(part) for part in p.parts.values()])
            for p in self.projections.values()
            if p.session_id == session_id
        ]

    # ---- subscriber side -----------------------------------------------------------

    def subscribe(self, session_id: uuid.UUID) -> Subscription:
        sub = Subscription(session_id, asyncio.Queue(maxsize=self.queue_size))
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
        channel = self.channels.get(sub.session_id)
        if channel is None:
            return
        channel.subscribers.discard(sub)
        if not channel.subscribers:
            del self.channels[sub.session_id]
            if channel.task is not None:
                channel.task.cancel()

    def watch(self, session_id: uuid.UUID) -> asyncio.Event:
        event = asyncio.Event()
        self.watchers.setdefault(session_id, set()).add(event)
        return event

    def unwatch(self, session_id: uuid.UUID, event: asyncio.Event) -> None:
        events = self.watchers.get(session_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self.watchers[session_id]

    def count(self, session_id: uuid.UUID | None = None) -> int:
        if session_id is None:
            return sum(len(c.subscribers) for c in self.channels.values())
        channel = self.channels.get(session_id)
        return len(channel.subscribers) if channel is not None else 0

    async def close(self) -> None:
        for channel in list(self.channels.values()):
            if channel.task is not None:
                channel.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await channel.task
        self.channels.clear()

    async def _pump(self, channel: Channel) -> None:
        while True:
            item = await channel.inbox.get()
            if item["k"] == "w":
                try:
                    items = await self._read_checkpoints(channel, int(item["q"]))
                except Exception as exc:
                    # The database is unreachable: subscribers re-read from their own
                    # cursors once it is back.
                    log.warning(
                        "fan-out read for session %s failed: %s",
                        channel.session_id,
                        exc,
                    )
                    items = [{"k": "resync"}]
            else:
                items = [item]
            for out in items:
                for sub in tuple(channel.subscribers):
                    sub.offer(out)

    async def _read_checkpoints(self, channel: Channel, upto: int) -> list[Item]:
        """Read what committed in (channel.last, upto], once for every subscriber."""
        async with self.database.read() as db:
            if channel.last is None:
                # First wake-up since the channel opened: subscribers replayed up to their
                # own cursors, and they fill any gap below this item themselves.
                channel.last = upto - 1
            if upto <= channel.last:
                return []
            events = await events_service.event_rows(
                db, channel.session_id, after=channel.last, upto=upto
            )
            messages = (
                await db.execute(
                    select(
                        models.Message.changed_sequence,
                        models.Message.visibility,
                        models.Message.snapshot,
                    )
                    .where(
                        models.Message.session_id == channel.session_id,
                        models.Message.changed_sequence > channel.last,
                        models.Message.changed_sequence <= upto,
                    )
                    .order_by(models.Message.changed_sequence)
                )
            ).all()
        channel.last = max(channel.last, events[-1][0] if events else upto)
        by_sequence: dict[int, list[Item]] = {}
        for changed, visibility, snapshot in messages:
            by_sequence.setdefault(changed, []).append(
                {"k": "m", "q": changed, "vis": visibility, "snap": snapshot}
            )
        out: list[Item] = []
        for sequence, event_id, event_type, body in events:
            out.append(event_item(sequence, event_id, event_type, body))
            out.extend(by_sequence.pop(sequence, ()))
        return out
