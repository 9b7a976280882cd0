"""The fan-out bus: one interface, three implementations.

* `MemoryBus` (SQLite, one process): everything is delivered in memory.
* `PgBus` (PostgreSQL, app/live/pg_bus.py): NOTIFY and LISTEN.
* `NatsBus` (`BUS_URL`, app/live/nats_bus.py): per-session NATS subjects.

This module holds the interface and what the two cross-process buses share: the
compact JSON encoding of items, the joining of deltas and the packing of payloads.

Every way a process delivers its own items in memory as it commits or publishes them,
in the order it does so. On PostgreSQL the NOTIFY carries them to the other processes;
each payload starts with its process's origin, and a process skips its own when they
come back. (Waiting for them would put a round trip to PostgreSQL, and a turn of the
busy event loop, between a delta and its local subscribers.)

Wake-ups carry `(session_id, sequence)` only: the database is the source of truth, so a
missed wake-up can delay a subscriber but never lose anything.
"""

import logging
import uuid
from collections.abc import Callable
from typing import Any

import orjson

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
        Wakeup(s, q, s in outbox.quiet, outbox.firsts.get(s), outbox.written(s))
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
        items = committed_items(outbox)
        for item in items:
            self.sink(item)
        for session_id in outbox.kicks:
            self.sink(Kick(session_id))
        self.send_committed(items)

    def send_committed(self, items: list[BusItem]) -> None:
        """A bus that carries commits to the other processes itself (not with the
        COMMIT) sends `items` to them."""

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


# ---- the NOTIFY encoding: compact JSON, known only to the PostgreSQL bus ---------------


def encode(item: BusItem) -> dict[str, Any]:
    if isinstance(item, Wakeup):
        wakeup: dict[str, Any] = {
            "k": "w",
            "s": item.session_id.hex,
            "q": item.sequence,
        }
        if item.quiet:
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


def decode_payload(payload: str | bytes) -> list[BusItem] | None:
    """The items of one payload of either cross-process bus (an item, or `{"items":
    [...]}`); None for one that is malformed."""
    try:
        data: dict[str, Any] = orjson.loads(payload)
        batch = data.get("items")
        return [decode(data)] if batch is None else [decode(i) for i in batch]
    except (
        orjson.JSONDecodeError,
        AttributeError,
        KeyError,
        TypeError,
        ValueError,
    ):
        return None


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
