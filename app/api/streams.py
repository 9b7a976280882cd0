"""The two SSE streams: upstream's `/sse` and the Mutation stream. The routes validate
and look up before streaming, then hand off to generators that own their resources."""

from typing import Annotated

from fastapi import APIRouter, Header, Query

from app.api import stream_open
from app.api.deps import CallerDep, SessionId, StateDep
from app.api.sse_schemas import (
    CURSOR_HEADER_SCHEMA,
    CURSOR_SCHEMA,
    EVENT_ID_SCHEMA,
    LAST_EVENT_ID_SCHEMA,
    MUTATION_SSE_RESPONSES,
    UPSTREAM_SSE_RESPONSES,
    type_filter_schema,
)
from app.events.types import VALID_EVENT_TYPES
from app.live.items import LIVE_ONLY_TYPES
from app.live.response import EventStreamResponse
from app.schemas import MAX_INT32

router = APIRouter(tags=["streams"])

# `/sse`'s `types=` / `exclude=`: upstream's event types and this service's live ones.
LiveTypeFilter = Annotated[
    list[str] | None,
    Query(json_schema_extra=type_filter_schema(VALID_EVENT_TYPES | LIVE_ONLY_TYPES)),
]


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
    return await stream_open.open_upstream(
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
    return await stream_open.open_mutations(
        state,
        organization_id=caller.organization_id,
        session_id=session_id,
        after=after,
        include_internal=include_internal,
        last_event_id=last_event_id,
        key_hash=caller.key_hash,
    )
