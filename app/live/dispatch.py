"""Routes every bus item that reaches this process to what needs it: the hot-read cache
(wake-ups and deletions invalidate), the fan-out (what stream subscribers need), the
key resolver (key changes) and the turn runner's inbox (kicks, republish requests, and
wake-ups of the sessions it runs, which is how a cancel sent to any process reaches
it)."""

import contextlib
import time
import uuid
from datetime import datetime
from typing import Protocol

from app.auth import KeyResolver
from app.live.bus import Bus
from app.live.cache import PageCache
from app.live.fanout import Fanout
from app.live.items import (
    BusItem,
    Deleted,
    KeysChanged,
    Kick,
    ModelWarning,
    PartStarted,
    RepublishParts,
    Resync,
    StepEnded,
    TextDelta,
    Wakeup,
)
from app.metrics import Metrics

# One text delta in this many has its bus lag measured.
LAG_SAMPLE = 32
# A process that missed the start of a live part asks its runner at most this often.
REPUBLISH_INTERVAL_SECONDS = 1.0


class RunnerInbox(Protocol):
    def deliver(self, item: Wakeup | Kick | RepublishParts | Resync) -> None: ...

    def streams(self, message_id: uuid.UUID) -> bool:
        """Whether a step of this process streams the message."""
        ...


class Dispatcher:
    def __init__(
        self,
        bus: Bus,
        cache: PageCache,
        fanout: Fanout,
        runner: RunnerInbox,
        keys: KeyResolver,
    ) -> None:
        self.bus = bus
        self.cache = cache
        self.fanout = fanout
        self.runner = runner
        self.keys = keys
        self._asked: dict[uuid.UUID, float] = {}
        # Set by the application when metrics are on.
        self.metrics: Metrics | None = None
        self._deltas = 0
        bus.sink = self.deliver
        bus.on_listening = self.listening
        fanout.on_missed_part = self.ask_republish
        fanout.on_watch = bus.watch
        fanout.on_unwatch = self.unwatch
        keys.on_revoked = fanout.revoke
        keys.streaming = fanout.key_hashes

    def _count(self, metrics: Metrics, item: BusItem) -> float | None:
        """Every item by kind; the lag of one delta in LAG_SAMPLE (their `ts` is the
        publisher's clock, to the millisecond: parsing each would cost more than the
        delivery). Returns the sampled delta's publication time."""
        published = None
        if type(item) is TextDelta:
            self._deltas += 1
            if self._deltas % LAG_SAMPLE == 0:
                with contextlib.suppress(ValueError):
                    published = datetime.fromisoformat(item.ts).timestamp()
        metrics.bus_item(type(item).__name__, published)
        return published

    def listening(self, heard: bool) -> None:
        """Whether this process hears every bus item: while it may miss some, neither
        cached pages nor cached keys are trusted."""
        self.cache.connected(heard)
        self.keys.listening(heard)

    def deliver(self, item: BusItem) -> None:
        metrics = self.metrics
        published = None if metrics is None else self._count(metrics, item)
        if isinstance(item, TextDelta | PartStarted | StepEnded | ModelWarning):
            self.fanout.deliver(item)
            if published is not None and metrics is not None:
                metrics.fanout_lag.observe((), max(0.0, time.time() - published))
        elif isinstance(item, Wakeup):
            self.cache.committed(item.session_id, item.sequence)
            self.fanout.deliver(item)
            self.runner.deliver(item)
        elif isinstance(item, Deleted):
            self.cache.deleted(item.session_id)
            self.fanout.deliver(item)
        elif isinstance(item, KeysChanged):
            self.keys.changed()
        elif isinstance(item, Resync):
            self.fanout.deliver(item)
            self.runner.deliver(item)
            self.keys.changed()
        else:
            self.runner.deliver(item)

    def unwatch(self, session_id: uuid.UUID) -> None:
        self.bus.unwatch(session_id)
        if self.bus.selective:
            # The ends of its steps run elsewhere will not reach this process.
            self.fanout.forget(session_id, keep=self.runner.streams)

    def ask_republish(self, message_id: uuid.UUID) -> None:
        now = time.monotonic()
        if now - self._asked.get(message_id, 0.0) < REPUBLISH_INTERVAL_SECONDS:
            return
        self._asked[message_id] = now
        if len(self._asked) > 10_000:
            self._asked.clear()
        self.bus.publish(RepublishParts(message_id))
