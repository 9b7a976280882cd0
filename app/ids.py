"""Typed wire IDs: `{prefix}_{32 lowercase hex}`, parsed with upstream's error texts."""

import os
import time
import uuid

from app.errors import InvalidId

DEFAULT_ORG_ID = uuid.UUID(int=1)


# The 74 random bits of a UUIDv7 (rand_a and rand_b), counted on within a millisecond.
_RANDOM_BITS = 74
_last_ms = 0
_last_random = 0


def uuid7() -> uuid.UUID:
    """A time-ordered UUIDv7 (see `uuid7_int`)."""
    return uuid.UUID(int=uuid7_int())


def event_id() -> str:
    """A new event id, `event_<uuid7 hex>`: minted for every live delta, so without the
    UUID object."""
    return f"event_{uuid7_int():032x}"


def uuid7_int() -> int:
    """A time-ordered UUIDv7 (RFC 9562): 48-bit ms timestamp, then 74 random bits.

    Monotonic within the process (RFC 9562 section 6.2, method 2): an id minted in the
    same millisecond as the one before it (or after the clock stepped back) takes that
    one's random bits plus a random increment, so ids sort in the order they were
    minted. If the increment overflows them, the timestamp moves on by 1 ms."""
    global _last_ms, _last_random
    ms = time.time_ns() // 1_000_000
    if ms > _last_ms:
        random = int.from_bytes(os.urandom(10), "big") >> (80 - _RANDOM_BITS)
    else:
        ms = _last_ms
        random = _last_random + 1 + (int.from_bytes(os.urandom(4), "big") >> 1)
        if random >> _RANDOM_BITS:
            ms += 1
            random &= (1 << _RANDOM_BITS) - 1
    _last_ms, _last_random = ms, random
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= (random >> 62) << 64
    value |= 0b10 << 62
    value |= random & ((1 << 62) - 1)
    return value


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
