"""The fan-out bus: one interface, two implementations.

* `MemoryBus` (SQLite, one process): everything is delivered in memory.
* `PgBus` (PostgreSQL): `NOTIFY` inside the checkpoint transaction, so PostgreSQL itself
  delivers the wake-up exactly when (and only if) the transaction commits; live payloads
  (deltas, runner controls) are sent with `pg_notify` from a small connection; each
  process holds one `LISTEN` connection and fans out in memory to its local subscribers.

Either way a process delivers its own items in memory as it commits or publishes them,
in the order it does so. On PostgreSQL the NOTIFY carries them to the other processes;
each payload starts with its process's origin, and a process skips its own when they
come back. (Waiting for them would put a round trip to PostgreSQL, and a turn of the
busy event loop, between a delta and its local subscribers.)

Wake-ups carry `(session_id, sequence)` only: the database is the source of truth, so a
missed wake-up can delay a subscriber but never lose anything.
"""

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

import asyncpg
import orjson
from sqlalchemy.engine import make_url

from app.backend import Backend
from app.db.outbox import Outbox
from app.db.writes import Write
from app.ids import format_id, uuid7
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
from app.wire import utf16_len

log = logging.getLogger("app.live.bus")

CHANNEL = "evermirror"
# PostgreSQL refuses NOTIFY payloads of 8000 bytes or more; leave room for the envelope.
MAX_NOTIFY_BYTES = 7000
# How long the PostgreSQL bus waits for more live items before it sends what it has.
COALESCE_SECONDS = 0.005
# Live items the sender may fall behind by before new ones stay in this process.
MAX_PENDING = 10_000
# The longest text two joined deltas may have (a longer one is sent as it is).
JOIN_LIMIT = 4096

Sink = Callable[[BusItem], None]


def committed_items(outbox: Outbox) -> list[BusItem]:
    """What every process hears of a committed transaction: its wake-ups, deletions and
    key changes (its kicks are for the local runner only)."""
    items: list[BusItem] = [
        Wakeup(s, q, s in outbox.input_only, outbox.firsts.get(s))
        for s, q in outbox.wakeups.items()
    ]
    items += [Deleted(s) for s in outbox.deleted]
    if outbox.keys_changed:
        items.append(KeysChanged())
    return items


class Bus:
    """Interface shared by both implementations. Every item that reaches this process is
    handed to `sink` (the dispatcher), in the order the bus delivered it."""

    def __init__(self) -> None:
        self.sink: Sink = lambda item: None
        # Told whether this process hears every wake-up (True) or may miss some (False).
        self.on_listening: Callable[[bool], None] = lambda listening: None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def before_commit(self, db: Write) -> None:
        """Called inside a write transaction, just before COMMIT."""

    def after_commit(self, outbox: Outbox) -> None:
        """Called once a write transaction committed, with its outbox: its wake-ups,
        deletions and key changes reach this process's own subscribers at once, and the
        sessions whose turn it started are handed to the local runner (`kicks`)."""
        for item in committed_items(outbox):
            self.sink(item)
        for session_id in outbox.kicks:
            self.sink(Kick(session_id))

    def commit_unknown(self) -> None:
        """Called when a COMMIT failed without an answer: it may have committed."""

    def publish(self, item: BusItem) -> None:
        """Send a live item (part, delta, end of a step, a republish request) to every
        process, this one first: its own subscribers have it when this returns; the
        other processes get it shortly after, without the publisher waiting."""
        raise NotImplementedError

    # A bus whose live items reach only the processes that watch their session
    # (`watch`); the others keep no live projection of it.
    selective = False

    def watch(self, session_id: uuid.UUID) -> None:
        """This process has a stream of the session: its live items must reach it."""

    def unwatch(self, session_id: uuid.UUID) -> None:
        """The last local stream of the session ended."""

    @property
    def healthy(self) -> bool:
        return True


class MemoryBus(Bus):
    async def start(self) -> None:
        self.on_listening(True)

    def publish(self, item: BusItem) -> None:
        self.sink(item)


def _asyncpg_dsn(url: str) -> str:
    return (
        make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    )


# ---- the NOTIFY encoding: compact JSON, known only to the PostgreSQL bus ---------------


def encode(item: BusItem) -> dict[str, Any]:
    if isinstance(item, Wakeup):
        wakeup: dict[str, Any] = {
            "k": "w",
            "s": item.session_id.hex,
            "q": item.sequence,
        }
        if item.input_only:
            wakeup["i"] = 1
        if item.first is not None:
            wakeup["f"] = item.first
        return wakeup
    if isinstance(item, TextDelta):
        return {
            "k": "d",
            "s": item.session_id.hex,
            "m": item.message_id.hex,
            "r": item.revision,
            "turn": item.turn_id,
            "pid": item.part_id,
            "o": item.offset,
            "t": item.text,
            "ev": item.event_type,
            "eid": item.event_id,
            "ts": item.ts,
            **({"tc": item.tool_call_id} if item.tool_call_id is not None else {}),
        }
    if isinstance(item, ModelWarning):
        return {
            "k": "warn",
            "s": item.session_id.hex,
            "m": item.message_id.hex if item.message_id is not None else None,
            "turn": item.turn_id,
            "eid": item.event_id,
            "ts": item.ts,
            "data": item.data,
        }
    if isinstance(item, PartStarted):
        return {
            "k": "p",
            "s": item.session_id.hex,
            "m": item.message_id.hex,
            "r": item.revision,
            "turn": item.turn_id,
            "part": item.part,
        }
    if isinstance(item, StepEnded):
        return {"k": "x", "s": item.session_id.hex, "m": item.message_id.hex}
    if isinstance(item, Deleted):
        return {"k": "del", "s": item.session_id.hex}
    if isinstance(item, RepublishParts):
        return {"k": "rp", "m": item.message_id.hex}
    if isinstance(item, Kick):
        return {"k": "kick", "s": item.session_id.hex}
    if isinstance(item, KeysChanged):
        return {"k": "keys"}
    return {"k": "resync"}


def decode(data: dict[str, Any]) -> BusItem:
    kind = data["k"]
    if kind == "w":
        first = data.get("f")
        return Wakeup(
            uuid.UUID(hex=data["s"]),
            int(data["q"]),
            "i" in data,
            None if first is None else int(first),
        )
    if kind == "d":
        return TextDelta(
            uuid.UUID(hex=data["s"]),
            uuid.UUID(hex=data["m"]),
            data["r"],
            data["turn"],
            data["pid"],
            data["o"],
            data["t"],
            data["ev"],
            data["eid"],
            data["ts"],
            data.get("tc"),
        )
    if kind == "warn":
        return ModelWarning(
            uuid.UUID(hex=data["s"]),
            uuid.UUID(hex=data["m"]) if data["m"] else None,
            data["turn"],
            data["eid"],
            data["ts"],
            data["data"],
        )
    if kind == "p":
        return PartStarted(
            uuid.UUID(hex=data["s"]),
            uuid.UUID(hex=data["m"]),
            data["r"],
            data["turn"],
            data["part"],
        )
    if kind == "x":
        return StepEnded(uuid.UUID(hex=data["s"]), uuid.UUID(hex=data["m"]))
    if kind == "del":
        return Deleted(uuid.UUID(hex=data["s"]))
    if kind == "rp":
        return RepublishParts(uuid.UUID(hex=data["m"]))
    if kind == "kick":
        return Kick(uuid.UUID(hex=data["s"]))
    if kind == "keys":
        return KeysChanged()
    return Resync()


def split_payload(item: BusItem) -> list[bytes]:
    """Encode an item for NOTIFY; a delta too large for one payload is split into
    several deltas whose offsets continue one another."""
    encoded = orjson.dumps(encode(item))
    if len(encoded) <= MAX_NOTIFY_BYTES or not isinstance(item, TextDelta):
        return [encoded]
    chunks: list[bytes] = []
    # A character encodes to at most 6 bytes of JSON (a \uXXXX escape).
    step = max(1, (MAX_NOTIFY_BYTES - 1000) // 6)
    # Offsets count UTF-16 code units; the pieces are cut between code points.
    offset = item.offset
    for index, start in enumerate(range(0, len(item.text), step)):
        piece = encode(item)
        piece["t"] = text = item.text[start : start + step]
        piece["o"] = offset
        offset += utf16_len(text)
        if index:
            # Each piece is an event of its own on the upstream stream.
            piece["eid"] = format_id("event", uuid7())
        chunks.append(orjson.dumps(piece))
    return chunks


class PgBus(Bus):
    """Live items leave in batches: `publish` delivers an item here at once and queues
    it; a sender task waits `COALESCE_SECONDS` for more, joins each run of a part's
    deltas into one, packs the items into as few NOTIFY payloads as fit, and sends them
    in one round trip. A token streamed to another process costs a share of a NOTIFY,
    not one, and the model's reader never waits for PostgreSQL."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self._dsn = _asyncpg_dsn(url)
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
        await self._connect()
        self._supervisor = asyncio.create_task(
            self._supervise(), name="pg-bus-supervisor"
        )
        self._sending = asyncio.create_task(self._send_loop(), name="pg-bus-sender")

    async def _connect(self) -> None:
        listener = await asyncpg.connect(
            self._dsn, server_settings={"application_name": "evermirror-listen"}
        )
        await listener.add_listener(CHANNEL, self._on_notify)
        listener.add_termination_listener(self._on_terminated)
        self._listener = listener
        self.on_listening(True)

    def _on_terminated(self, _conn: object) -> None:
        # Wake-ups sent from now until the listener is back are never heard here.
        self.on_listening(False)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload.startswith(self._origin):
            # Ours: delivered here when it was committed or published.
            return
        try:
            data = orjson.loads(payload)
            batch = data.get("items")
            items = [decode(data)] if batch is None else [decode(i) for i in batch]
        except (
            orjson.JSONDecodeError,
            AttributeError,
            KeyError,
            TypeError,
            ValueError,
        ):
            log.warning("dropping malformed bus payload")
            return
        for item in items:
            self.sink(item)

    async def _supervise(self) -> None:
        """Reconnect the listener after PostgreSQL restarts; subscribers are told to resync."""
        while not self._stopping:
            await asyncio.sleep(0.5)
            listener = self._listener
            if listener is not None and not listener.is_closed():
                continue
            self.on_listening(False)
            try:
                await self._connect()
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
        if time.monotonic() < self._sender_retry_at:
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
        except (
            OSError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            # Raised by a connection that broke in the middle of an operation.
            asyncpg.InternalClientError,
        ) as exc:
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


def joined_delta(before: BusItem, after: TextDelta) -> TextDelta | None:
    """One delta for two that follow each other in one part, or None. The joined
    delta keeps the first one's event id and time: other processes' `/sse` clients
    see one `output.message.delta` event for the two."""
    if (
        type(before) is not TextDelta
        or before.message_id != after.message_id
        or before.part_id != after.part_id
        or before.revision != after.revision
        or before.event_type != after.event_type
        or before.tool_call_id != after.tool_call_id
        or before.offset + utf16_len(before.text) != after.offset
        or len(before.text) + len(after.text) > JOIN_LIMIT
    ):
        return None
    # Constructed directly: dataclasses.replace costs ten times as much, per token.
    return TextDelta(
        before.session_id,
        before.message_id,
        before.revision,
        before.turn_id,
        before.part_id,
        before.offset,
        before.text + after.text,
        before.event_type,
        before.event_id,
        before.ts,
        before.tool_call_id,
    )


def enqueue(pending: list[BusItem], item: BusItem) -> bool:
    """Queue `item` for the other processes: a text delta joins the one before it when
    it continues the same part; past MAX_PENDING (the sender far behind: the database
    or NATS slow to answer) it is dropped, as live items are ephemeral and the other
    processes converge on the next committed snapshot. True when the queue grew."""
    if len(pending) >= MAX_PENDING:
        return False
    if pending and isinstance(item, TextDelta):
        joined = joined_delta(pending[-1], item)
        if joined is not None:
            pending[-1] = joined
            return False
    pending.append(item)
    return True


def packed(items: list[BusItem], origin: str) -> list[str]:
    """NOTIFY payloads for `items`, in order: `{"from": ..., "items": [...]}`, as many
    items to a payload as fit in MAX_NOTIFY_BYTES (a delta too large for one is split
    into several)."""
    payloads: list[str] = []
    current: list[bytes] = []
    size = 0

    def close() -> None:
        nonlocal current, size
        if current:
            payloads.append(origin + '"items":[' + b",".join(current).decode() + "]}")
            current, size = [], 0

    for item in items:
        for encoded in split_payload(item):
            if size + len(encoded) + 1 > MAX_NOTIFY_BYTES:
                close()
            current.append(encoded)
            size += len(encoded) + 1
    close()
    return payloads


def create_bus(backend: Backend, database_url: str, bus_url: str | None = None) -> Bus:
    """Across processes on a shared database: over NATS when `bus_url` names a server,
    else LISTEN/NOTIFY; in memory for one process."""
    if backend.shared and bus_url:
        from app.live.nats_bus import NatsBus  # imported only where it is configured

        return NatsBus(bus_url)
    if backend.shared:
        return PgBus(database_url)
    return MemoryBus()
