"""The OpenAPI shapes shared by the routes: the cursor and filter parameters, and the
documented frames of the two SSE streams. Data only, so no router imports another."""

from collections.abc import Callable
from typing import Any

from app.errors import problem_responses
from app.events.types import MAX_TYPE_FILTERS, VALID_EVENT_TYPES
from app.live.items import MODEL_RETRY, TOOL_INPUT_DELTA
from app.schemas import INT32_DIGITS

# The documented shapes of the cursor and filter parameters. The handlers enforce them
# with upstream's texts, so FastAPI is not asked to validate them itself.
EVENT_ID_SCHEMA = {
    "anyOf": [{"type": "string", "pattern": "^event_[0-9a-f]{32}$"}, {"type": "null"}]
}


def type_filter_schema(names: frozenset[str]) -> dict[str, object]:
    """The schema of a repeatable `types=` / `exclude=` filter of these type names."""
    return {
        "anyOf": [
            {
                "type": "array",
                "items": {"type": "string", "enum": sorted(names)},
                "maxItems": MAX_TYPE_FILTERS,
            },
            {"type": "null"},
        ]
    }


def _json_data(schema: dict[str, Any]) -> dict[str, Any]:
    """A frame's `data:` line: a JSON document of this schema."""
    return {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": schema,
    }


def _frame(event: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": event,
            "data": _json_data(data),
            "retry": {"type": "integer"},
        },
        "additionalProperties": False,
    }


def _sse_responses(
    description: str, frames: list[dict[str, Any]], last_event_id: dict[str, Any]
) -> dict[int | str, Any]:
    """OpenAPI 3.1 has no item schema for streams: by convention (schemathesis, Swagger)
    `schema` of text/event-stream describes one event as {event, data, id?, retry?}.
    `id` is the last event ID, which a frame without `id:` keeps (the SSE spec), so it
    may appear on any event. Comments (heartbeats, pings) are not events."""
    for frame in frames:
        frame["properties"]["id"] = last_event_id
    return {
        200: {
            "description": description,
            "content": {"text/event-stream": {"schema": {"oneOf": frames}}},
        },
        **problem_responses(400, 401, 404, 429),
    }


def _object(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


EVENT_REF = {"$ref": "#/components/schemas/Event"}
MESSAGE_REF = {"$ref": "#/components/schemas/Message"}
INT = {"type": "integer"}
STR = {"type": "string"}
UTF16_OFFSET = {
    "type": "integer",
    "minimum": 0,
    "description": "Where `text` starts in the part's text, in UTF-16 code units (what "
    "JavaScript's `String.length` counts; a character beyond U+FFFF, such as most "
    "emoji, is two). Apply the delta when this equals the length of the text you hold.",
}
DISCONNECTING_FRAME = _object(
    ["reason", "retry_ms"],
    reason={
        "type": "string",
        "description": "`connection_cycle` (every `SSE_CYCLE_SECONDS`), "
        "`session_deleted`, `unauthorized` (the key was revoked) or `error` (the "
        "client fell too far behind); more may be added",
    },
    retry_ms={
        "type": "integer",
        "description": "Reconnect after this many milliseconds (the frame's `retry:`)",
    },
)
UPSTREAM_SSE_RESPONSES = _sse_responses(
    "Upstream's event stream: `connected`, durable events (with `id:`), live deltas, "
    "`disconnecting` before a periodic close; `: heartbeat` comments",
    [
        _frame(
            {"const": "connected"},
            _object(["status"], status={"const": "connected"}),
        ),
        _frame({"const": "disconnecting"}, DISCONNECTING_FRAME),
        _frame({"type": "string", "enum": sorted(VALID_EVENT_TYPES)}, EVENT_REF),
        # Live events beyond upstream's list (never stored): a tool call's streamed
        # arguments, and a model request being retried.
        _frame({"type": "string", "enum": [MODEL_RETRY, TOOL_INPUT_DELTA]}, EVENT_REF),
    ],
    {"type": "string", "pattern": "^event_[0-9a-f]{32}$"},
)
# What every Mutation's data starts with (message, part, delta, turn, session, warning).
MUTATION_FIELDS: dict[str, dict[str, Any]] = {
    "mutation_id": {
        "type": "string",
        "description": "The same change always has the same id: drop a frame whose "
        "id you already applied",
    },
    "session_id": STR,
    "created_at": {"type": "string", "description": "RFC 3339, milliseconds"},
}


def _mutation(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    return _object([*MUTATION_FIELDS, *required], **MUTATION_FIELDS, **properties)


MUTATION_SSE_RESPONSES = _sse_responses(
    "The Mutation stream: a `retry:` line first, `message` snapshots (`id:` = cursor), "
    "`part` and `delta` of the live projection (`offset` in UTF-16 code units), "
    "`turn` and `session` changes, `warning` (a model request retried), `reset`, `disconnecting` before every close the server decides; `: ping` comments",
    [
        _frame({"const": "message"}, _mutation(["message"], message=MESSAGE_REF)),
        _frame(
            {"const": "part"},
            _mutation(
                ["message_id", "revision", "part"],
                message_id=STR,
                revision=INT,
                part=_object(["part_id", "type"], part_id=STR, type=STR),
            ),
        ),
        _frame(
            {"const": "delta"},
            _mutation(
                ["message_id", "revision", "part_id", "offset", "text", "kind"],
                message_id=STR,
                revision=INT,
                part_id=STR,
                offset=UTF16_OFFSET,
                text=STR,
                kind={
                    "type": "string",
                    "enum": ["text", "reasoning", "tool_input"],
                    "description": "What the text extends: a text part, a reasoning "
                    "part, or a tool call's streamed arguments (`tool_input`)",
                },
                tool_call_id={
                    "type": "string",
                    "description": "With `kind: tool_input`: the call it is of",
                },
            ),
        ),
        _frame(
            {"const": "warning"},
            _mutation(
                ["kind", "attempt", "max_attempts", "code", "will_retry"],
                kind={"const": "model_retry"},
                attempt=INT,
                max_attempts=INT,
                code={
                    "type": "string",
                    "description": "The provider's HTTP status, or `timeout`, "
                    "`connection_error`, `stream_error`",
                },
                message=STR,
                will_retry={"type": "boolean"},
                retry_in_ms=INT,
                turn_id=STR,
                message_id=STR,
            ),
        ),
        _frame(
            {"const": "turn"},
            _mutation(
                ["turn_id", "status"],
                turn_id=STR,
                status={
                    "type": "string",
                    "enum": ["running", "completed", "failed", "cancelled"],
                },
            ),
        ),
        _frame(
            {"const": "session"},
            {
                **_mutation(
                    [],
                    status={
                        "type": "string",
                        "enum": ["started", "active", "idle", "waitingfortoolresults"],
                    },
                    title={"type": ["string", "null"]},
                    model_id={"type": ["string", "null"]},
                ),
                "description": "The session field that changed: `status`, `title` "
                "or `model_id`",
                "minProperties": len(MUTATION_FIELDS) + 1,
            },
        ),
        _frame({"const": "reset"}, _object(["reason"], reason=STR)),
        _frame({"const": "disconnecting"}, DISCONNECTING_FRAME),
    ],
    {"type": "string", "pattern": "^[0-9]+$"},
)


# A Mutation stream cursor: the session event sequence as a string; empty is no cursor.
CURSOR_SCHEMA = {
    "anyOf": [{"type": "string", "pattern": INT32_DIGITS}, {"type": "null"}]
}


def _header_schema(pattern: str) -> Callable[[dict[str, Any]], None]:
    """A header is a string or absent, never JSON null: no `anyOf` with null."""

    def update(schema: dict[str, Any]) -> None:
        schema.pop("anyOf", None)
        schema.update(type="string", pattern=pattern)

    return update


# An EventSource resends the last `id:` it saw; empty is no cursor.
LAST_EVENT_ID_SCHEMA = _header_schema("^(event_[0-9a-f]{32})?$")
CURSOR_HEADER_SCHEMA = _header_schema(INT32_DIGITS)


# A frontend protocol's event: JSON with its `type` (AG-UI's events, the AI SDK's
# chunks), sent as unnamed SSE events (`message`).
FRONTEND_EVENT = _object(["type"], type=STR)


def frontend_stream(description: str, *, done: bool = False) -> dict[int | str, Any]:
    """The 200 of a frontend protocol's stream: events whose data is one JSON object
    with a `type`; with `done`, the AI SDK's closing `data: [DONE]` too."""
    frames: list[dict[str, Any]] = [
        {
            "type": "object",
            "required": ["data"],
            "properties": {"event": {"const": "message"}, "data": data},
            "additionalProperties": False,
        }
        for data in (
            [_json_data(FRONTEND_EVENT), {"const": "[DONE]"}]
            if done
            else [_json_data(FRONTEND_EVENT)]
        )
    ]
    return {
        200: {
            "description": description,
            "content": {"text/event-stream": {"schema": {"anyOf": frames}}},
        }
    }
