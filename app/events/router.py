"""The durable event log over JSON: `GET /v1/sessions/{id}/events`."""

from typing import Annotated

from fastapi import APIRouter, Query, Response

from app import wire
from app.deps import OrgId, ReadDb, SessionId, StateDep
from app.errors import InvalidParameter, problem_responses
from app.events import schemas, service
from app.events.types import MAX_TYPE_FILTERS, VALID_EVENT_TYPES, validate_types
from app.ids import parse_or_400
from app.schemas import MAX_INT32

router = APIRouter(tags=["events"])


# The documented shapes of the cursor and filter parameters. The handlers enforce them
# with upstream's texts, so FastAPI is not asked to validate them itself.
EVENT_ID_SCHEMA = {
    "anyOf": [{"type": "string", "pattern": "^event_[0-9a-f]{32}$"}, {"type": "null"}]
}
TYPE_FILTER_SCHEMA = {
    "anyOf": [
        {
            "type": "array",
            "items": {"type": "string", "enum": sorted(VALID_EVENT_TYPES)},
            "maxItems": MAX_TYPE_FILTERS,
        },
        {"type": "null"},
    ]
}


# A repeatable `types=` / `exclude=` filter of known event type names.
TypeFilter = Annotated[list[str] | None, Query(json_schema_extra=TYPE_FILTER_SCHEMA)]


@router.get(
    "/sessions/{session_id}/events",
    response_model=schemas.EventList,
    responses=problem_responses(400, 401, 404),
)
async def list_events(
    session_id: SessionId,
    db: ReadDb,
    org: OrgId,
    state: StateDep,
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
) -> Response:
    """Durable events oldest first. Deltas are live only and never listed. With `limit`,
    the last N matching events and an `X-Total-Count` header. A page whose events
    would pass MAX_LIST_BYTES ends early with `has_more` and the cursor to continue
    from (`next_after_sequence`, or `next_before_sequence` with `limit`)."""
    type_filter = validate_types("types", types)
    exclude_filter = validate_types("exclude", exclude)
    if since_id is not None and after_sequence is not None:
        raise InvalidParameter("since_id and after_sequence are mutually exclusive")
    event_id = (
        parse_or_400("event", "event", since_id) if since_id is not None else None
    )
    flt = service.EventFilter(
        after_sequence, before_sequence, type_filter, exclude_filter, limit
    )
    body, total = await service.list_events(
        db,
        organization_id=org,
        session_id=session_id,
        since_id=event_id,
        flt=flt,
        max_bytes=state.settings.max_list_bytes,
    )
    headers = {"X-Total-Count": str(total)} if total is not None else {}
    return wire.json_response(body, headers=headers)
