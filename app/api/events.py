"""The durable event log over JSON: `GET /v1/sessions/{id}/events`."""

import uuid
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from app import wire
from app.api.deps import OrgId, ReadDb, SessionId, SettingsDep
from app.api.sse_schemas import EVENT_ID_SCHEMA, type_filter_schema
from app.errors import InvalidParameter, problem_responses
from app.events import schemas, service
from app.events.types import VALID_EVENT_TYPES, validate_types
from app.ids import parse_or_400
from app.schemas import MAX_INT32, UtcTimestamp

router = APIRouter(tags=["events"])


# A repeatable `types=` / `exclude=` filter of known event type names.
TypeFilter = Annotated[
    list[str] | None,
    Query(json_schema_extra=type_filter_schema(VALID_EVENT_TYPES)),
]


@dataclass(frozen=True, slots=True)
class EventQuery:
    """A list request's cursor (an event id) and filter, checked."""

    since_id: uuid.UUID | None
    filter: service.EventFilter


async def event_query(
    since_id: Annotated[
        str | None,
        Query(
            description="Only events after this event ID",
            json_schema_extra=EVENT_ID_SCHEMA,
        ),
    ] = None,
    after_sequence: Annotated[int | None, Query(ge=0, le=MAX_INT32)] = None,
    before_sequence: Annotated[int | None, Query(ge=1, le=MAX_INT32)] = None,
    types: TypeFilter = None,
    exclude: TypeFilter = None,
    limit: Annotated[
        int | None,
        Query(ge=1, le=1000, description="Return the last N matching events"),
    ] = None,
    around: Annotated[
        str | None,
        Query(
            description="Anchor event ID: up to `window` matching events on each side "
            "of it (and the anchor, if it matches). Not with since_id, after_sequence, "
            "before_sequence or limit.",
            json_schema_extra=EVENT_ID_SCHEMA,
        ),
    ] = None,
    window: Annotated[
        int | None,
        Query(ge=1, le=500, description="Events on each side of `around` (default 50)"),
    ] = None,
    from_ts: Annotated[
        UtcTimestamp,
        Query(description="Lower bound on the event's time, inclusive (RFC 3339)"),
    ] = None,
    to_ts: Annotated[
        UtcTimestamp,
        Query(description="Upper bound on the event's time, inclusive (RFC 3339)"),
    ] = None,
    turn_id: Annotated[
        str | None, Query(description="Only events of this turn (`context.turn_id`)")
    ] = None,
    tool_name: Annotated[
        str | None,
        Query(
            max_length=64,
            description="Only tool events (`tool.*`) of the tool with this name",
        ),
    ] = None,
    q: Annotated[
        str | None,
        Query(
            max_length=200,
            description="Only events whose JSON contains this text (case-insensitive)",
        ),
    ] = None,
    order_desc: Annotated[
        bool, Query(description="Newest first when true; oldest first by default")
    ] = False,
    exec_id: Annotated[
        str | None, Query(description="Not supported here: answered 400")
    ] = None,
    trace_id: Annotated[
        str | None, Query(description="Not supported here: answered 400")
    ] = None,
    tags: Annotated[
        list[str] | None, Query(description="Not supported here: answered 400")
    ] = None,
) -> EventQuery:
    """The query parameters of `list_events`, checked with upstream's texts."""
    _refuse_unsupported(exec_id=exec_id, trace_id=trace_id, tags=tags)
    type_filter = validate_types("types", types)
    exclude_filter = validate_types("exclude", exclude)
    _check_cursors(since_id, after_sequence, before_sequence, limit, around, window)
    return EventQuery(
        parse_or_400("event", "event", since_id) if since_id is not None else None,
        service.EventFilter(
            after_sequence,
            before_sequence,
            type_filter,
            exclude_filter,
            limit,
            turn_id=parse_or_400("turn", "turn", turn_id) if turn_id else None,
            from_ts=from_ts,
            to_ts=to_ts,
            tool_name=tool_name,
            q=q,
            order_desc=order_desc,
            around=parse_or_400("event", "event", around) if around else None,
            window=window or 50,
        ),
    )


def _refuse_unsupported(**values: str | list[str] | None) -> None:
    """Events here carry no execution or trace ids and no tags: filtering on them is
    refused rather than ignored."""
    for name, value in values.items():
        if value:
            raise InvalidParameter(
                f"{name}: not supported, events here carry no {name.replace('_', ' ')}"
            )


def _check_cursors(
    since_id: str | None,
    after_sequence: int | None,
    before_sequence: int | None,
    limit: int | None,
    around: str | None,
    window: int | None,
) -> None:
    if since_id is not None and after_sequence is not None:
        raise InvalidParameter("since_id and after_sequence are mutually exclusive")
    if around is not None and (
        since_id is not None
        or after_sequence is not None
        or before_sequence is not None
        or limit is not None
    ):
        raise InvalidParameter(
            "around is mutually exclusive with since_id, after_sequence, "
            "before_sequence and limit"
        )
    if window is not None and around is None:
        raise InvalidParameter("window needs around")


@router.get(
    "/sessions/{session_id}/events",
    response_model=schemas.EventList,
    responses=problem_responses(400, 401, 404),
)
async def list_events(
    session_id: SessionId,
    db: ReadDb,
    org: OrgId,
    settings: SettingsDep,
    query: Annotated[EventQuery, Depends(event_query)],
) -> Response:
    """Durable events oldest first. Deltas are live only and never listed. With `limit`,
    the last N matching events and an `X-Total-Count` header. A page whose events
    would pass MAX_LIST_BYTES ends early with `has_more` and the cursor to continue
    from (`next_after_sequence`, or `next_before_sequence` with `limit`). Events here
    carry no execution or trace ids and no tags, so `exec_id`, `trace_id` and `tags`
    are refused rather than ignored."""
    body, total = await service.list_events(
        db,
        organization_id=org,
        session_id=session_id,
        since_id=query.since_id,
        flt=query.filter,
        max_bytes=settings.max_list_bytes,
    )
    headers = {"X-Total-Count": str(total)} if total is not None else {}
    return wire.json_response(body, headers=headers)
