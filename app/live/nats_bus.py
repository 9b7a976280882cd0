"""The NATS bus (`BUS_URL=nats://host:4222`): for processes on one PostgreSQL that
should not carry their live traffic through it.

PostgreSQL stays the store and the only source of replay (a stream resumes from its
cursor in the database, as with the PostgreSQL bus). What crosses processes goes over
NATS instead of NOTIFY: live items (deltas, parts, ends of steps, runner controls) and,
once their transaction has committed, wake-ups, deletions and key changes. No write
transaction issues NOTIFY, so writers do not queue on the lock NOTIFY takes at commit
(the `notify` row of the benchmark measures it).

Subjects, and who hears them:
* `evermirror.s.<session>`: the session's live items and its wake-ups, in the order this
  process publishes them (a step's deltas before its checkpoint's wake-up). A process
  subscribes to it while it has a stream of the session (`watch`), so a token costs
  only the processes whose clients watch it; the others keep no live projection of the
  session, and a stream opened there mid-turn asks the runner for its parts again.
* `evermirror.c.<session>`: a copy of the session's wake-ups and its deletion, for every
  process (caches, the runner's cancel watch, `?wait=true`). A process takes a session's
  wake-ups from here until its subscription to the session's own subject is confirmed
  (a flush), and from that subject after, so they stay behind the step's deltas.
* `evermirror.all`: items of no session (key changes, resyncs, republish requests).
NATS does not echo a process's own messages back to it (`no_echo`), which it has
delivered in memory already.

Wake-ups leave after COMMIT, not with it: a process that dies between the two never
sends them, and a process cut off from NATS misses what was sent meanwhile. Both end
the same way as a lost LISTEN connection: when the connection comes back every local
subscriber re-reads from its cursor (`Resync`), and a COMMIT whose outcome is unknown
makes every process re-read. A stream that stays open on another process without a
later checkpoint of its session waits for its next one or its cycle
(`SSE_CYCLE_SECONDS`).
"""

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from app.live.bus import (
    Bus,
    decode_payload,
    enqueue,
    packed,
)
from app.live.items import BusItem, Deleted, Resync, Wakeup

log = logging.getLogger("app.live.bus")

PREFIX = "evermirror"
# How long start-up tries to reach NATS before it refuses to serve.
CONNECT_SECONDS = 5.0


class BusUnavailable(RuntimeError):
    """NATS could not be reached at start-up."""


ALL = f"{PREFIX}.all"


def live_subject(session_id: uuid.UUID) -> str:
    return f"{PREFIX}.s.{session_id.hex}"


def committed_subject(session_id: uuid.UUID) -> str:
    return f"{PREFIX}.c.{session_id.hex}"


@dataclass(eq=False)
class Watch:
    """A session this process watches: its live subject's subscription, once made, and
    while it delivers the session's wake-ups, the newest one it delivered and the newest
    committed copy skipped for it (see `_leave`)."""

    sub: Subscription | None = None
    delivered: int = 0
    skipped: int = 0


class NatsBus(Bus):
    """Live items and committed wake-ups over NATS. `publish` and `after_commit`
    deliver here at once and queue the item; a sender task publishes what queued,
    joining each run of a part's deltas, several items to a message per session."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self._url = url
        self._nc: NatsClient | None = None
        self._pending: list[BusItem] = []
        self._queued = asyncio.Event()
        self._sending: asyncio.Task[None] | None = None
        self._last_error: BaseException | None = None
        # Subscriptions to the live subject of the sessions this process watches, and
        # the sessions whose subscription is confirmed (their wake-ups come from it).
        self._watched: dict[uuid.UUID, Watch] = {}
        self._confirmed: dict[uuid.UUID, Watch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Until the first connection: failures are said once, in the refusal.
        self._connected_once = False

    @property
    def where(self) -> str:
        """The server, without credentials, for log lines."""
        return self._url.rsplit("@", 1)[-1]

    async def start(self) -> None:
        try:
            self._nc = await asyncio.wait_for(
                nats.connect(
                    servers=[self._url],
                    name="evermirror",
                    no_echo=True,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    connect_timeout=2,
                    error_cb=self._error,
                    disconnected_cb=self._disconnected,
                    reconnected_cb=self._reconnected,
                ),
                CONNECT_SECONDS,
            )
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            reason = self._last_error or exc
            raise BusUnavailable(
                f"BUS_URL: cannot reach NATS at {self.where} within "
                f"{CONNECT_SECONDS:.0f} s ({reason or type(reason).__name__})"
            ) from exc
        self._connected_once = True
        await self._nc.subscribe(f"{PREFIX}.c.>", cb=self._on_message)
        await self._nc.subscribe(ALL, cb=self._on_message)
        await self._nc.flush()
        self.on_listening(True)
        self._sending = asyncio.create_task(self._send_loop(), name="nats-bus-sender")
        log.info("bus: NATS at %s", self.where)

    async def stop(self) -> None:
        if self._sending is not None:
            self._sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sending
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await self._nc.close()

    # ---- the connection's life ----------------------------------------------------

    async def _error(self, exc: Exception) -> None:
        # Reconnects are the client's: one line per failure, not a traceback.
        self._last_error = exc
        if self._connected_once:
            log.warning("NATS bus: %s", exc or type(exc).__name__)

    async def _disconnected(self) -> None:
        # Items other processes send from now until the connection is back never
        # reach this one.
        self.on_listening(False)

    async def _reconnected(self) -> None:
        log.info("NATS bus reconnected to %s", self.where)
        self.on_listening(True)
        # What was sent meanwhile is in the database: every local subscriber re-reads
        # from its own cursor.
        self.sink(Resync())

    # ---- sending ------------------------------------------------------------------

    def send_committed(self, items: list[BusItem]) -> None:
        for item in items:
            self._queue(item)

    def commit_unknown(self) -> None:
        # If it did commit, nobody heard of it: every process re-reads.
        self.sink(Resync())
        self._queue(Resync())

    def publish(self, item: BusItem) -> None:
        self.sink(item)
        self._queue(item)

    def _queue(self, item: BusItem) -> None:
        if enqueue(self._pending, item):
            self._queued.set()

    async def _send_loop(self) -> None:
        while True:
            await self._queued.wait()
            self._queued.clear()
            batch, self._pending = self._pending, []
            try:
                await self._send(batch)
            except Exception as exc:
                # Dropped: live items are ephemeral, and a process that missed a
                # wake-up re-reads when its connection comes back.
                log.warning(
                    "NATS bus publish failed, %d items dropped: %s", len(batch), exc
                )

    async def _send(self, batch: list[BusItem]) -> None:
        nc = self._nc
        assert nc is not None
        by_session: dict[uuid.UUID | None, list[BusItem]] = {}
        for item in batch:
            by_session.setdefault(getattr(item, "session_id", None), []).append(item)
        for session_id, items in by_session.items():
            if session_id is None:
                await self._publish(ALL, items)
                continue
            live: list[BusItem] = [i for i in items if not isinstance(i, Deleted)]
            if live:
                await self._publish(live_subject(session_id), live)
            # After the live subject: a process that watches the session hears the
            # wake-up there, behind the deltas, before this copy.
            committed: list[BusItem] = [
                i for i in items if isinstance(i, Wakeup | Deleted)
            ]
            if committed:
                await self._publish(committed_subject(session_id), committed)

    async def _publish(self, subject: str, items: list[BusItem]) -> None:
        assert self._nc is not None
        for payload in packed(items, '{"from":"nats",'):
            await self._nc.publish(subject, payload.encode())

    # ---- watching -----------------------------------------------------------------

    selective = True

    def watch(self, session_id: uuid.UUID) -> None:
        if session_id in self._watched:
            return
        watch = self._watched[session_id] = Watch()
        self._spawn(self._subscribe(session_id, watch))

    def unwatch(self, session_id: uuid.UUID) -> None:
        # Live items still in flight on the session's subject are dropped (nobody here
        # streams it); a subscription still being made is undone by its own task.
        watch = self._watched.pop(session_id, None)
        if watch is not None and watch.sub is not None:
            self._spawn(self._leave(session_id, watch))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _subscribe(self, session_id: uuid.UUID, watch: Watch) -> None:
        nc = self._nc
        if nc is None or nc.is_closed:
            return
        try:
            sub = await nc.subscribe(live_subject(session_id), cb=self._on_live)
            if self._watched.get(session_id) is not watch:
                # Unwatched meanwhile.
                await sub.unsubscribe()
                return
            watch.sub = sub
            # Once the server has the subscription, every later wake-up of the session
            # comes on its subject too: take them from there, behind the deltas.
            await nc.flush()
        except Exception as exc:
            # Not watched over NATS: live items of the session miss this process, and
            # its streams ask the runner for the parts (wake-ups still come).
            log.warning("NATS bus: cannot subscribe to a session: %s", exc)
            return
        if self._watched.get(session_id) is watch:
            self._confirmed[session_id] = watch

    async def _leave(self, session_id: uuid.UUID, watch: Watch) -> None:
        """Stop hearing the session's subject. Its wake-ups keep coming from it until
        the server has dropped the subscription (a flush); a wake-up sent after that
        reaches this process only as a committed copy, which may have arrived, and been
        skipped, before the flush: the newest such one is delivered then."""
        assert watch.sub is not None
        try:
            await watch.sub.unsubscribe()
            if self._nc is not None:
                await self._nc.flush()
        except Exception as exc:
            log.warning("NATS bus: cannot unsubscribe from a session: %s", exc)
        finally:
            if self._confirmed.get(session_id) is watch:
                del self._confirmed[session_id]
                if watch.skipped > watch.delivered:
                    self.sink(Wakeup(session_id, watch.skipped, False, None))

    # ---- receiving ----------------------------------------------------------------

    async def _on_message(self, msg: Msg) -> None:
        """The committed copies and the items of no session: a wake-up of a session
        whose own subject delivers its wake-ups here comes on that subject."""
        confirmed = self._confirmed
        for item in _items(msg):
            if type(item) is Wakeup:
                watch = confirmed.get(item.session_id)
                if watch is not None:
                    watch.skipped = max(watch.skipped, item.sequence)
                    continue
            self.sink(item)

    async def _on_live(self, msg: Msg) -> None:
        """A watched session's subject: its live items, and its wake-ups once the
        subscription is confirmed (until then they come from the committed copy)."""
        confirmed = self._confirmed
        for item in _items(msg):
            if type(item) is Wakeup:
                watch = confirmed.get(item.session_id)
                if watch is None:
                    continue
                watch.delivered = max(watch.delivered, item.sequence)
            self.sink(item)

    @property
    def healthy(self) -> bool:
        return self._nc is not None and self._nc.is_connected


def _items(msg: Msg) -> list[BusItem]:
    items = decode_payload(msg.data)
    if items is None:
        log.warning("dropping malformed bus message on %s", msg.subject)
        return []
    return items
