"""The two SSE streams: upstream's `/sse` and the Mutation stream. The routes validate
and look up before streaming, then hand off to generators that own their resources."""

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query

from app.deps import CallerDep, SessionId, StateDep
from app.errors import problem_responses
from app.events.router import EVENT_ID_SCHEMA, type_filter_schema
from app.events.types import VALID_EVENT_TYPES
from app.live import service
from app.live.items import LIVE_ONLY_TYPES, MODEL_RETRY, TOOL_INPUT_DELTA
from app.live.response import EventStreamResponse
from app.schemas import INT32_DIGITS, MAX_INT32

router = APIRouter(tags=["streams"])

# `/sse`'s `types=` / `exclude=`: upstream's event types and this service's live ones.
LiveTypeFilter = Annotated[
    list[str] | None,
    Query(json_schema_extra=type_filter_schema(VALID_EVENT_TYPES | LIVE_ONLY_TYPES)),
]


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


@router.get(
    "/sessions/{session_id}/sse",
    response_class=EventStreamResponse,
    responses=UPSTREAM_SSE_RESPONSES,
)
async def stream_sse(
    session_id: SessionId,
    state: StateDep,
    caller: CallerDep,
    since_id: Annotated[str | None, Query(json_schema_extra=EVENT_ID_SCHEMA)] = None,
    after_sequence: Annotated[
        int | None,
        Query(ge=0, le=MAX_INT32, description="0 replays the whole session"),
    ] = None,
    types: LiveTypeFilter = None,
    exclude: LiveTypeFilter = None,
    last_event_id: Annotated[
        str | None,
        Header(alias="Last-Event-ID", json_schema_extra=LAST_EVENT_ID_SCHEMA),
    ] = None,
) -> EventStreamResponse:
    """Upstream's event stream: `connected`, then durable events after the cursor
    (the `Last-Event-ID` header, else `since_id` or `after_sequence`: the header wins,
    as an EventSource reconnects to its original URL), then live events including
    deltas. `: heartbeat` comments keep it open; a `disconnecting` frame precedes each
    close the server decides, and it and `connected` carry `retry:`."""
    return await service.open_upstream(
        state,
        organization_id=caller.organization_id,
        session_id=session_id,
        since_id=since_id,
        after_sequence=after_sequence,
        types=types or (),
        exclude=exclude or (),
        last_event_id=last_event_id,
        key_hash=caller.key_hash,
    )


@router.get(
    "/sessions/{session_id}/messages/stream",
    response_class=EventStreamResponse,
    responses=MUTATION_SSE_RESPONSES,
)
async def stream_messages(
    session_id: SessionId,
    state: StateDep,
    caller: CallerDep,
    after: Annotated[
        str | None,
        Query(
            description="Resume after this cursor",
            json_schema_extra=CURSOR_SCHEMA,
        ),
    ] = None,
    include_internal: bool = False,
    last_event_id: Annotated[
        str | None,
        Header(alias="Last-Event-ID", json_schema_extra=CURSOR_HEADER_SCHEMA),
    ] = None,
) -> EventStreamResponse:
    """The Mutation stream: `message` (complete snapshot, `id:` = cursor), `part` and
    `delta` (the live projection; `offset` counts UTF-16 code units, as JavaScript's
    `String.length`), `reset` (reload snapshots). On connect it sends `retry:`, then
    replays the latest snapshot of every message changed after the cursor (the
    `Last-Event-ID` header, else `after`: the header wins, as an EventSource reconnects
    to its original URL), then the live parts of messages still streaming. A
    `disconnecting` frame (with `retry:`) precedes every close the server decides:
    every `SSE_CYCLE_SECONDS`, on session deletion, key revocation, or a client too
    slow to keep up."""
    return await service.open_mutations(
        state,
        organization_id=caller.organization_id,
        session_id=session_id,
        after=after,
        include_internal=include_internal,
        last_event_id=last_event_id,
        key_hash=caller.key_hash,
    )
