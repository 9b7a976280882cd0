"""SSE frame encoding. Each frame is encoded once per item and cached on it, so every
local subscriber is handed the same bytes."""

from typing import Any

from app import wire
from app.ids import format_id

Item = dict[str, Any]


def comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


def frame(
    event: str,
    data: bytes | str,
    *,
    event_id: str | None = None,
    retry_ms: int | None = None,
) -> bytes:
    out = f"event: {event}\n"
    if event_id is not None:
        out += f"id: {event_id}\n"
    if retry_ms is not None:
        out += f"retry: {retry_ms}\n"
    body = data if isinstance(data, bytes) else data.encode()
    return out.encode() + b"data: " + body + b"\n\n"


def connected() -> bytes:
    return frame("connected", b'{"status":"connected"}')


def disconnecting(reason: str, retry_ms: int) -> bytes:
    return frame("disconnecting", wire.dumps({"reason": reason, "retry_ms": retry_ms}))


def durable_event(item: Item, retry_ms: int) -> bytes:
    """Upstream stream: a durable event carries `id:` (its event id)."""
    cached: bytes | None = item.get("_sse")
    if cached is None:
        event_id = (
            item["id"]
            if isinstance(item["id"], str)
            else format_id("event", item["id"])
        )
        cached = frame(item["type"], item["body"], event_id=event_id, retry_ms=retry_ms)
        item["_sse"] = cached
    return cached


def delta_event(item: Item, retry_ms: int) -> bytes:
    """Upstream stream: ephemeral deltas, no `id:` (they cannot be replayed)."""
    cached: bytes | None = item.get("_sse")
    if cached is None:
        data: dict[str, Any] = {
            "turn_id": item.get("turn"),
            "delta": item["t"],
            "accumulated": item.get("acc", item["t"]),
        }
        if item["ev"] == "output.message.delta":
            data["message_id"] = "message_" + item["m"]
        envelope = {
            "id": item["eid"],
            "type": item["ev"],
            "ts": item["ts"],
            "session_id": "session_" + item["s"],
            "context": {"turn_id": item["turn"]} if item.get("turn") else {},
            "data": data,
        }
        cached = frame(item["ev"], wire.dumps(envelope), retry_ms=retry_ms)
        item["_sse"] = cached
    return cached


def message_mutation(item: Item) -> bytes:
    cached: bytes | None = item.get("_mut")
    if cached is None:
        cached = frame(
            "message",
            b'{"message":' + item["snap"].encode() + b"}",
            event_id=str(item["q"]),
        )
        item["_mut"] = cached
    return cached


def snapshot_mutation(changed_sequence: int, snapshot: str) -> bytes:
    return frame(
        "message",
        b'{"message":' + snapshot.encode() + b"}",
        event_id=str(changed_sequence),
    )


def part_mutation(message_hex: str, revision: int, part: dict[str, Any]) -> bytes:
    body = {"message_id": "message_" + message_hex, "revision": revision, "part": part}
    return frame("part", wire.dumps(body))


def delta_mutation(item: Item) -> bytes:
    cached: bytes | None = item.get("_mut")
    if cached is None:
        body = {
            "message_id": "message_" + item["m"],
            "revision": item["r"],
            "part_id": item["pid"],
            "offset": item["o"],
            "text": item["t"],
        }
        cached = frame("delta", wire.dumps(body))
        item["_mut"] = cached
    return cached


def reset(reason: str) -> bytes:
    return frame("reset", wire.dumps({"reason": reason}))
