"""Wire encoding: orjson bytes, RFC 3339 timestamps, UTF-16 text offsets, and responses
built from stored JSON."""

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.responses import Response

JSON = "application/json"


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def loads(value: str | bytes) -> Any:
    return orjson.loads(value)


def timestamp(value: datetime) -> str:
    """RFC 3339 UTC with microseconds, as resources carry them."""
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    # isoformat ends in "+00:00" here; it costs half of strftime.
    return value.isoformat(timespec="microseconds")[:-6] + "Z"


def event_ts(value: datetime) -> str:
    """Event `ts`: millisecond precision, upstream's `2024-01-15T10:30:00.000Z`."""
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return value.isoformat(timespec="milliseconds")[:-6] + "Z"


_now_ms = -1
_now_text = ""


def event_now() -> str:
    """`event_ts` of the current time, formatted once per millisecond: every live delta
    carries one, and several share a millisecond under load."""
    global _now_ms, _now_text
    ms = time.time_ns() // 1_000_000
    if ms != _now_ms:
        moment = datetime.fromtimestamp(ms // 1000, UTC).replace(
            microsecond=ms % 1000 * 1000
        )
        _now_ms, _now_text = ms, moment.isoformat(timespec="milliseconds")[:-6] + "Z"
    return _now_text


def join_array(items: Iterable[str | bytes]) -> bytes:
    """A JSON array from already-encoded items, without parsing them."""
    return (
        b"[" + b",".join(i.encode() if isinstance(i, str) else i for i in items) + b"]"
    )


def within_budget(items: Iterable[bytes], budget: int) -> list[bytes]:
    """Encoded items in order until the next one would take the array past `budget`
    bytes; always the first, so a page makes progress however large one item is.
    Stops consuming `items` there, so a lazy iterable encodes no more than it keeps."""
    kept: list[bytes] = []
    used = 1
    for item in items:
        used += len(item) + 1
        if kept and used > budget:
            break
        kept.append(item)
    return kept


def with_field(encoded_object: str, key: str, value: Any) -> bytes:
    """Append one field to an encoded JSON object without re-parsing it."""
    head = encoded_object.encode()
    assert head.endswith(b"}")
    sep = b"," if len(head) > 2 else b""
    return head[:-1] + sep + dumps(key) + b":" + dumps(value) + b"}"


def utf16_len(text: str) -> int:
    """The length of `text` in UTF-16 code units, the unit of every text offset on the
    wire: what JavaScript's `String.length` counts, so a browser applies a delta at
    `offset` without converting. A code point beyond U+FFFF (an emoji, most flags'
    halves) is two units. `isascii` is O(1) in CPython, and nearly every delta is ASCII;
    otherwise the encode costs well under a microsecond for a delta-sized string."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le")) >> 1


def utf16_tail(text: str, units: int) -> str:
    """`text` without its first `units` UTF-16 code units. Offsets on the wire always
    fall between whole code points (every delta is whole code points), so the cut never
    splits a surrogate pair; if it did, the strict decode raises instead of sending half
    a character."""
    if text.isascii():
        return text[units:]
    return text.encode("utf-16-le")[2 * units :].decode("utf-16-le")


def json_response(
    body: bytes, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(body, status_code=status_code, media_type=JSON, headers=headers)
