"""Typed wire IDs: `{prefix}_{32 lowercase hex}`, parsed with upstream's error texts."""

import os
import time
import uuid

from app.errors import InvalidId

DEFAULT_ORG_ID = uuid.UUID(int=1)


def uuid7() -> uuid.UUID:
    """A time-ordered UUIDv7 (RFC 9562): 48-bit ms timestamp, then random bits."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


def format_id(prefix: str, value: uuid.UUID) -> str:
    return f"{prefix}_{value.hex}"


class IdParseError(ValueError):
    pass


def parse_id(prefix: str, text: str) -> uuid.UUID:
    """Upstream's TypedId::parse: prefix, then length, then lowercase hex."""
    head, sep, suffix = text.partition("_")
    if not sep or head != prefix:
        raise IdParseError(f"invalid prefix: expected '{prefix}', got '{head}'")
    if len(suffix) != 32:
        raise IdParseError(f"invalid length: expected 32, got {len(suffix)}")
    if any(c not in "0123456789abcdef" for c in suffix):
        raise IdParseError(f"invalid hex in ID: {suffix}")
    return uuid.UUID(hex=suffix)


def parse_or_400(prefix: str, label: str, text: str) -> uuid.UUID:
    try:
        return parse_id(prefix, text)
    except IdParseError as exc:
        raise InvalidId(f"Invalid {label} ID: {exc}") from None
