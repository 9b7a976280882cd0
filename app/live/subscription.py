"""One local subscriber of a session's channel."""

import asyncio
import time
import uuid
from collections.abc import Callable

from app.live.outputs import DeltaOut, Deltas, Marker, Out, PartOut

# What a durable-only subscription does not take.
LIVE = frozenset({DeltaOut, Deltas, PartOut})


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
        "durable_only",
        "key_hash",
        "limit",
        "next_heartbeat",
        "overflowed",
        "pending",
        "session_id",
        "started_at",
        "waiter",
    )

    def __init__(
        self,
        session_id: uuid.UUID,
        limit: int,
        heartbeat_seconds: float,
        key_hash: str | None = None,
        durable_only: bool = False,
    ) -> None:
        self.session_id = session_id
        # The key the stream was opened with (None: open mode).
        self.key_hash = key_hash
        # Takes no live parts or deltas: a waiter for a turn's end, which would wake
        # for every token of the reply only to skip it.
        self.durable_only = durable_only
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
        # The durable sequence its stream had given the client up to when it went live
        # (None while it starts): where the channel's first read begins, so that one
        # read covers what each subscriber would otherwise read for itself.
        self.started_at: int | None = None

    def offer(self, item: Out) -> None:
        if self.overflowed or self.closed:
            return
        if self.durable_only and type(item) in LIVE:
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
