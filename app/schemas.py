"""Shared schema bases and the one validation layer every request body goes through:
strings without NUL or lone surrogates, finite numbers within signed 64 bits, and the
fixed size caps of request fields. Inputs ignore unknown fields (upstream
clients send more than we use)."""

import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import PydanticCustomError

# Sequences and offsets are int32 (upstream's `format: int32`, PostgreSQL `integer`):
# a larger query value is a 400, not a database overflow.
MAX_INT32 = 2**31 - 1
# What ASCII digit strings fit in MAX_INT32 (leading zeros allowed): the documented
# shape of the cursors sent as text (the Mutation stream's `after` and Last-Event-ID).
INT32_DIGITS = (
    "^0*(?:[0-9]{1,9}|1[0-9]{9}|20[0-9]{8}|21[0-3][0-9]{7}|214[0-6][0-9]{6}"
    "|2147[0-3][0-9]{5}|21474[0-7][0-9]{4}|214748[0-2][0-9]{3}|2147483[0-5][0-9]{2}"
    "|21474836[0-3][0-9]|214748364[0-7])$"
)
# Numbers inside free-form JSON (metadata, hints) lie within signed 64 bits. orjson
# refuses a wider integer, so it would fail only when the stored value is rendered;
# and PostgreSQL's jsonb prints numbers without an exponent, so a float of 1e19 is
# read back as the integer 10000000000000000000, which fails the same way.
MIN_INT64 = -(2**63)
MAX_INT64 = 2**63 - 1

# Fixed caps of request fields, published in the OpenAPI document as maxLength and
# maxItems. Long free text (message text, context, base64, goal, system_prompt) and
# free-form JSON (metadata, hints) are capped by settings instead (MAX_TEXT_CHARS,
# MAX_JSON_BYTES, MAX_JSON_DEPTH), checked by app/api/guards.py.
MAX_TITLE_CHARS = 1000
MAX_TAG_CHARS = 200
MAX_TAGS = 100
# Names, locales, media types, filenames, actor ids and channel names.
MAX_LABEL_CHARS = 255
# RFC 9110 §4.1 recommends supporting at least 8000 octets; inline image data goes in
# `base64`, not in a data: URL.
MAX_URL_CHARS = 8192
MAX_CLIENT_MESSAGE_ID_CHARS = 200
# A turn's step cap: beyond this a session would run for hours on one message.
MAX_ITERATIONS = 1000
# Field descriptions of the caps that settings make configurable.
LONG_TEXT_NOTE = "At most MAX_TEXT_CHARS characters (a setting; default 200,000)."
FREE_JSON_NOTE = (
    "Free-form JSON: at most MAX_JSON_BYTES encoded (default 32,768) and "
    "MAX_JSON_DEPTH levels deep (default 16); numbers within signed 64 bits."
)
# The OpenAPI document's `JsonValue` component (added by app/main.py): any JSON value
# the layer accepts, so that what a schema-driven client generates is accepted.
JSON_VALUE_REF = "#/components/schemas/JsonValue"
JSON_VALUE_SCHEMA: dict[str, Any] = {
    "description": "A JSON value; numbers within signed 64 bits, strings without "
    "U+0000 or lone surrogates.",
    "anyOf": [
        {"type": "string", "pattern": "^[^\\u0000]*$"},
        {"type": "number", "minimum": MIN_INT64, "maximum": MAX_INT64},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": {"$ref": JSON_VALUE_REF}},
        {
            "type": "object",
            "propertyNames": {"pattern": "^[^\\u0000]*$"},
            "additionalProperties": {"$ref": JSON_VALUE_REF},
        },
    ],
}


def _error(kind: str, message: str, where: list[str | int]) -> PydanticCustomError:
    """A validation error at `where` below the field being validated; app/errors.py
    appends it to the error's location, so `metadata.a.b` is named, not `metadata`."""
    return PydanticCustomError(kind, message, {"where": where})


def _check_string(value: str, where: list[str | int]) -> None:
    if "\x00" in value:
        raise _error("string_nul", "must not contain NUL (U+0000)", where)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # Python's JSON parser decodes "\ud800" into a lone surrogate, which no
            # UTF-8 encoder (orjson, PostgreSQL, SQLite) will store.
            raise _error(
                "string_surrogate",
                "must not contain a lone surrogate (U+D800 to U+DFFF)",
                where,
            ) from None


def check_value(value: Any) -> Any:
    """Walk a decoded request value (iteratively: JSON nests deeper than Python's
    recursion limit) and refuse what cannot be stored and served back: NUL and lone
    surrogates in strings and object keys, numbers beyond signed 64 bits, NaN and
    Infinity (Python's JSON parser accepts them; they would be stored as null).
    Nested models validate their own fields."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            _check_string(item, where)
        elif isinstance(item, bool) or item is None or isinstance(item, BaseModel):
            continue
        elif isinstance(item, int | float):
            if isinstance(item, float) and not math.isfinite(item):
                raise _error(
                    "finite_number",
                    "must be a finite number, not NaN or Infinity",
                    where,
                )
            if not MIN_INT64 <= item <= MAX_INT64:
                raise _error(
                    "number_range",
                    f"must be a number from {MIN_INT64} to {MAX_INT64}",
                    where,
                )
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str):
                    _check_string(key, [*where, key])
                stack.append((child, [*where, key]))
        elif isinstance(item, list | tuple):
            for index, child in enumerate(item):
                stack.append((child, [*where, index]))
    return value


class Schema(BaseModel):
    """Wire output shapes (documentation of stored JSON; reads serve stored bytes)."""

    model_config = ConfigDict(extra="allow")


class InputSchema(BaseModel):
    """Request bodies: unknown fields are accepted and ignored; every field's value
    passes `check_value`, so no request model can forget a string or number rule."""

    model_config = ConfigDict(extra="ignore")

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        return check_value(value)


# ---- field types -----------------------------------------------------------------------


def _storable_text(value: Any) -> Any:
    """A length cap makes pydantic measure the string first, and it calls a lone
    surrogate "unable to parse raw data": check before, so every string field refuses
    the same inputs with the same words."""
    if isinstance(value, str):
        _check_string(value, [])
    return value


StorableText = BeforeValidator(_storable_text)
Title = Annotated[str, Field(max_length=MAX_TITLE_CHARS), StorableText]
Label = Annotated[str, Field(max_length=MAX_LABEL_CHARS), StorableText]
Url = Annotated[str, Field(max_length=MAX_URL_CHARS), StorableText]
Tag = Annotated[str, Field(max_length=MAX_TAG_CHARS), StorableText]
Tags = Annotated[list[Tag], Field(max_length=MAX_TAGS)]
# Free-form JSON objects (metadata, hints): checked by check_value like every field;
# documented as objects of JsonValue.
JsonObject = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": "^[^\\u0000]*$"},
            "additionalProperties": {"$ref": JSON_VALUE_REF},
        }
    ),
]
ClientMessageId = Annotated[
    str, Field(min_length=1, max_length=MAX_CLIENT_MESSAGE_ID_CHARS), StorableText
]


def _as_utc(value: datetime | None) -> datetime | None:
    """A query timestamp needs its offset (RFC 3339) and must be a representable UTC
    instant: `0001-01-01T00:00:00+01:00` falls before year 1 in UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise PydanticCustomError(
            "timestamp_offset", "needs a UTC offset (RFC 3339), e.g. Z or +02:00"
        )
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise PydanticCustomError(
            "timestamp_range", "out of range: years 1 to 9999 in UTC"
        ) from None


# ASCII digits only: `\d` would also take other scripts' digits.
RFC3339_PREFIX = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}")


def _rfc3339_only(value: Any) -> Any:
    """Pydantic would read `0.5` or `1700000000` as a Unix time: only RFC 3339 here."""
    if value is None or isinstance(value, datetime):
        return value
    # A number in a JSON body is refused too, not only one in a query string.
    if not isinstance(value, str) or not RFC3339_PREFIX.match(value):
        raise PydanticCustomError("timestamp_format", "expected an RFC 3339 timestamp")
    return value


UtcTimestamp = Annotated[
    datetime | None, BeforeValidator(_rfc3339_only), AfterValidator(_as_utc)
]


# What a session PATCH changes that a turn runs with (app/sessions/actions.py).
ActionType = Literal[
    "model_changed",
    "approval_mode_changed",
    "system_prompt_changed",
    "tools_changed",
]
