"""The PostgreSQL bus: `NOTIFY` inside the checkpoint transaction, so PostgreSQL itself
delivers the wake-up exactly when (and only if) the transaction commits; live payloads
(deltas, runner controls) are sent with `pg_notify` from a small connection; each process
holds one `LISTEN` connection and fans out in memory to its local subscribers.

A process alone on its database sends no NOTIFY at all. Every listening process holds a
shared advisory lock (`LISTENERS`) on its listener connection, and says hello on the
channel when that connection opens; each counts the other holders every
`ALONE_CHECK_SECONDS`. While none holds it, checkpoints commit without NOTIFY (NOTIFY
takes a database-wide lock at commit: the `notify` row of the benchmark measures what
that costs writers) and live items stay in the process. Any payload of another process
(a hello first) ends that at once. A process that starts beside others may have missed
what they committed between its hello and their hearing it: its streams re-read from
their cursors `HELLO_RESYNC_SECONDS` after the hello.
"""

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import Collection

import asyncpg
import orjson
from sqlalchemy.engine import make_url

from app.db.engine import PG_UNAVAILABLE
from app.db.writes import Write
from app.live.bus import (
    CHANNEL,
    COALESCE_SECONDS,
    Bus,
    committed_items,
    decode_payload,
    encode,
    enqueue,
    packed,
)
from app.live.items import BusItem, Resync

log = logging.getLogger("app.live.bus")

# What a statement of the bus's own connections raises when it fails: the server or
# the connection gone (among them asyncpg's InternalClientError, from a connection
# PostgreSQL terminated while it sat idle) or the statement refused. The listener's
# supervisor and the publisher log it and carry on over a new connection.
BUS_ERRORS = (*PG_UNAVAILABLE, asyncpg.PostgresError)

# The shared advisory lock every listening process holds (two int4 keys: "evmr",
# "lstn"), counted in pg_locks, which every role may read.
LISTENERS = (0x65766D72, 0x6C73746E)
COUNT_LISTENERS = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND classid = $1 AND objid = $2 AND objsubid = 2"
)
ALONE_CHECK_SECONDS = 2.0
HELLO_RESYNC_SECONDS = 0.5
HELLO = '"k":"hello"}'


def _asyncpg_dsn(url: str) -> str:
    return (
        make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    )


class PgBus(Bus):
    """Live items leave in batches: `publish` delivers an item here at once and queues
    it; a sender task waits `COALESCE_SECONDS` for more, joins each run of a part's
    deltas into one, packs the items into as few NOTIFY payloads as fit, and sends them
    in one round trip. A token streamed to another process costs a share of a NOTIFY,
    not one, and the model's reader never waits for PostgreSQL."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self._dsn = _asyncpg_dsn(url)
        # No other process listens on this database: nothing to NOTIFY (see above).
        self.alone = False
        self._foreign_at = 0.0
        self._listener: asyncpg.Connection | None = None
        self._sender: asyncpg.Connection | None = None
        # Live items waiting for the sender task, in publish order.
        self._pending: list[BusItem] = []
        self._queued = asyncio.Event()
        # The sessions of the live items queued or being sent, and of those being
        # sent, with the event set when that send ended (see before_commit).
        self._unsent: set[uuid.UUID | None] = set()
        self._in_flight: set[uuid.UUID | None] = set()
        self._sent = asyncio.Event()
        self._sending: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False
        # While PostgreSQL refuses the notify connection, live items are dropped without
        # a connection attempt (and a warning) for every one of them.
        self._sender_retry_at = 0.0
        # Every payload this process sends starts with its origin (a fresh random
        # token per process: workers are started, not forked, so each draws its own).
        self._origin = '{"from":"' + secrets.token_hex(8) + '",'

    def _payload(self, encoded: bytes) -> str:
        """An encoded item (a JSON object) as this process's NOTIFY payload."""
        return self._origin + encoded[1:].decode()

    async def start(self) -> None:
        await self._listen()
        self._supervisor = asyncio.create_task(
            self._supervise(), name="pg-bus-supervisor"
        )
        self._sending = asyncio.create_task(self._send_loop(), name="pg-bus-sender")

    async def _connect(self) -> None:
        listener = await asyncpg.connect(
            self._dsn, server_settings={"application_name": "evermirror-listen"}
        )
        await listener.execute("SELECT pg_advisory_lock_shared($1, $2)", *LISTENERS)
        await listener.add_listener(CHANNEL, self._on_notify)
        listener.add_termination_listener(self._on_terminated)
        self._listener = listener
        self.on_listening(True)
        await listener.execute(
            "SELECT pg_notify($1, $2)", CHANNEL, self._origin + HELLO
        )

    async def _listen(self) -> None:
        """Listen and say hello. Another process that thought itself alone NOTIFYs
        from the moment it hears the hello; what it committed before that, this
        process's streams read again a moment later."""
        await self._connect()
        await self._count_others()
        if not self.alone:
            asyncio.get_running_loop().call_later(
                HELLO_RESYNC_SECONDS, lambda: self.sink(Resync())
            )

    async def _count_others(self) -> None:
        """Whether another process listens on this database (see above)."""
        listener = self._listener
        if listener is None or listener.is_closed():
            return
        asked_at = time.monotonic()
        try:
            listeners = await listener.fetchval(COUNT_LISTENERS, *LISTENERS)
        except BUS_ERRORS as exc:
            log.warning("bus: cannot count the listening processes: %s", exc)
            self._set_alone(False)
            return
        # A payload of another process heard meanwhile outweighs a count taken before
        # it started listening.
        self._set_alone(listeners <= 1 and self._foreign_at < asked_at)

    def _set_alone(self, alone: bool) -> None:
        if alone != self.alone:
            log.info(
                "bus: %s",
                "no other process listens on this database, NOTIFY off"
                if alone
                else "other processes listen on this database, NOTIFY on",
            )
        self.alone = alone

    def _on_terminated(self, _conn: object) -> None:
        # Wake-ups sent from now until the listener is back are never heard here, nor
        # the hello of a process that starts meanwhile.
        self.on_listening(False)
        self._set_alone(False)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload.startswith(self._origin):
            # Ours: delivered here when it was committed or published.
            return
        self._foreign_at = time.monotonic()
        if self.alone:
            self._set_alone(False)
        if payload.endswith(HELLO):
            return
        items = decode_payload(payload)
        if items is None:
            log.warning("dropping malformed bus payload")
            return
        for item in items:
            self.sink(item)

    async def _supervise(self) -> None:
        """Reconnect the listener after PostgreSQL restarts; subscribers are told to resync."""
        counted_at = time.monotonic()
        while not self._stopping:
            await asyncio.sleep(0.5)
            listener = self._listener
            if listener is not None and not listener.is_closed():
                if time.monotonic() - counted_at >= ALONE_CHECK_SECONDS:
                    counted_at = time.monotonic()
                    await self._count_others()
                continue
            self.on_listening(False)
            try:
                await self._listen()
            except Exception as exc:
                # Whatever the failure, try again: a supervisor that dies leaves this
                # process deaf to the bus until it restarts.
                log.warning("bus listener reconnect failed: %s", exc)
                continue
            log.info("bus listener reconnected")
            # Anything published while we were deaf is in the database: wake every
            # local subscriber so it re-reads from its cursor.
            self.sink(Resync())

    async def stop(self) -> None:
        self._stopping = True
        for task in (self._supervisor, self._sending):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for conn in (self._listener, self._sender):
            if conn is not None and not conn.is_closed():
                with contextlib.suppress(Exception):
                    await conn.close()

    async def before_commit(self, db: Write) -> None:
        if self.alone:
            return
        woken = db.outbox.wakeups
        if woken and not self._unsent.isdisjoint(woken):
            await self._ahead_of(db, woken.keys())
        # NOTIFY is transactional: delivered at COMMIT, discarded on ROLLBACK.
        for item in committed_items(db.outbox):
            db.notify(CHANNEL, self._payload(orjson.dumps(encode(item))))

    def commit_unknown(self) -> None:
        # If it did commit, its NOTIFY reached the other processes but this one skips
        # it: every local subscriber re-reads from its own cursor instead.
        self.sink(Resync())

    def publish(self, item: BusItem) -> None:
        self.sink(item)
        if self.alone or time.monotonic() < self._sender_retry_at:
            return
        self._unsent.add(_session_of(item))
        if enqueue(self._pending, item):
            self._queued.set()

    async def _send_loop(self) -> None:
        while True:
            await self._queued.wait()
            # A few milliseconds for more: a streaming turn's next deltas, the other
            # turns' (bounded added latency, for other processes only).
            await asyncio.sleep(COALESCE_SECONDS)
            self._queued.clear()
            await self._send_pending()

    async def _ahead_of(self, db: Write, woken: Collection[uuid.UUID]) -> None:
        """Live items of the sessions a commit wakes reach the other processes before
        its wake-ups (a step's deltas ahead of the step's checkpoint): those still
        queued go as NOTIFYs of the same transaction, ahead of its own, and a batch
        already being sent is waited for. No lock that writers share, and no round
        trip of their own. (If the transaction rolls back, they are not sent: live
        items are ephemeral, and subscribers converge on the next snapshot.)"""
        while not self._in_flight.isdisjoint(woken):
            await self._sent.wait()
        ours = [i for i in self._pending if _session_of(i) in woken]
        if ours:
            self._pending = [i for i in self._pending if _session_of(i) not in woken]
            for payload in packed(ours, self._origin):
                db.notify(CHANNEL, payload)
        self._unsent = {_session_of(i) for i in self._pending} | self._in_flight

    async def _send_pending(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        self._in_flight = {_session_of(i) for i in batch}
        self._sent = asyncio.Event()
        try:
            await self._send(packed(batch, self._origin))
        finally:
            self._in_flight = set()
            self._sent.set()
            self._unsent = {_session_of(i) for i in self._pending}

    async def _send(self, payloads: list[str]) -> None:
        try:
            if self._sender is None or self._sender.is_closed():
                self._sender = await asyncpg.connect(
                    self._dsn,
                    server_settings={"application_name": "evermirror-notify"},
                )
            await self._sender.executemany(
                "SELECT pg_notify($1, $2)", [(CHANNEL, p) for p in payloads]
            )
        except BUS_ERRORS as exc:
            # Live items are ephemeral: while PostgreSQL is unreachable they are
            # dropped, and subscribers converge on the next committed snapshot.
            log.warning("bus publish failed, live items dropped for 0.5 s: %s", exc)
            self._sender_retry_at = time.monotonic() + 0.5
            self._pending.clear()
            if self._sender is not None and not self._sender.is_closed():
                self._sender.terminate()
            self._sender = None

    @property
    def healthy(self) -> bool:
        return self._listener is not None and not self._listener.is_closed()


def _session_of(item: BusItem) -> uuid.UUID | None:
    session_id: uuid.UUID | None = getattr(item, "session_id", None)
    return session_id
