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

# Random bytes are drawn from the OS a block at a time: a getrandom call per id cost
# about 1.5 % of a posted message's CPU (its message id and its events' ids).
_BLOCK = 4096
_block = b""
_used = 0


def _forget_block() -> None:
    # A forked child must not mint the ids its parent's block still holds.
    global _block, _used
    _block, _used = b"", 0


os.register_at_fork(after_in_child=_forget_block)


def _random(size: int) -> int:
    """`size` bytes from the OS's random source, as an integer."""
    global _block, _used
    end = _used + size
    if end > len(_block):
        _block, end = os.urandom(_BLOCK), size
        _used = 0
    value = int.from_bytes(_block[_used:end], "big")
    _used = end
    return value


# A random UUID (version 4, RFC 9562): 122 random bits, its version and variant set.
_V4_CLEAR = ~((0xF << 76) | (0b11 << 62)) & ((1 << 128) - 1)
_V4_SET = (0x4 << 76) | (0b10 << 62)


def uuid4() -> uuid.UUID:
    return uuid.UUID(int=(_random(16) & _V4_CLEAR) | _V4_SET)


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
        random = _random(10) >> (80 - _RANDOM_BITS)
    else:
        ms = _last_ms
        random = _last_random + 1 + (_random(4) >> 1)
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
