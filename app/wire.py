"""Wire encoding: orjson bytes, RFC 3339 timestamps, and responses built from stored JSON."""

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
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_ts(value: datetime) -> str:
    """Event `ts`: millisecond precision, upstream's `2024-01-15T10:30:00.000Z`."""
    return (
        value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{value.microsecond // 1000:03d}Z"
    )


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


def json_response(
    body: bytes, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(body, status_code=status_code, media_type=JSON, headers=headers)
