"""Session routes: HTTP only; the service does the work."""

import re
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Body, Query, Response
from pydantic import BeforeValidator

from app import guards, wire
from app.deps import BaseUrl, OrgId, ReadDb, SessionId, StateDep, WriteDb
from app.errors import BODY_PROBLEMS, InvalidRequest, problem_responses
from app.schemas import MAX_INT32
from app.sessions import schemas, service

router = APIRouter(tags=["sessions"])

RFC3339_PREFIX = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


def _rfc3339_only(value: Any) -> Any:
    """Pydantic would read `0.5` or `1700000000` as a Unix time: only RFC 3339 here."""
    if isinstance(value, str) and not RFC3339_PREFIX.match(value):
        raise ValueError("expected an RFC 3339 timestamp")
    return value


Timestamp = Annotated[datetime | None, BeforeValidator(_rfc3339_only)]

# What `status` accepts: known values, comma-separated; blanks around them are ignored.
_STATUS = rf"\s*({'|'.join(service.STATUS_FILTERS)})?\s*"
STATUS_LIST_PATTERN = rf"^{_STATUS}(,{_STATUS})*$"


@router.post(
    "/sessions",
    status_code=201,
    response_model=schemas.Session,
    responses=problem_responses(400, 401, 422, *BODY_PROBLEMS),
)
async def create_session(
    db: WriteDb,
    org: OrgId,
    base: BaseUrl,
    state: StateDep,
    data: Annotated[schemas.SessionCreate | None, Body()] = None,
) -> Response:
    """Create a session. Every body field is optional; so is the body."""
    data = data or schemas.SessionCreate()
    guards.check_session(data, state.settings)
    session = await service.create_session(db, organization_id=org, data=data)
    body = service.session_wire(session, base)
    return wire.json_response(
        wire.dumps(body), 201, headers={"Location": body["self_url"]}
    )


@router.get(
    "/sessions",
    response_model=schemas.SessionPage,
    responses=problem_responses(400, 401),
)
async def list_sessions(
    db: ReadDb,
    org: OrgId,
    base: BaseUrl,
    offset: Annotated[int, Query(ge=0, le=MAX_INT32)] = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    search: Annotated[
        str | None,
        # No U+0000: PostgreSQL text cannot hold it (a 400 below, on every backend).
        Query(max_length=200, json_schema_extra={"pattern": "^[^\\u0000]*$"}),
    ] = None,
    status: Annotated[
        str | None,
        Query(
            description="Comma-separated statuses",
            json_schema_extra={"pattern": STATUS_LIST_PATTERN},
        ),
    ] = None,
    created_after: Timestamp = None,
    created_before: Timestamp = None,
    order: Literal["created_at", "last_activity"] = "created_at",
) -> Response:
    """List the organization's sessions, newest first, with offset pagination."""
    if search is not None and "\x00" in search:
        raise InvalidRequest("search: must not contain NUL (U+0000)")
    statuses: list[str] = []
    for value in (status or "").split(","):
        if value.strip():
            if value.strip() not in service.STATUS_FILTERS:
                raise InvalidRequest(f"status: unknown value '{value.strip()}'")
            statuses.append(service.STATUS_FILTERS[value.strip()])
    for stamp in (created_after, created_before):
        if stamp is not None and stamp.tzinfo is None:
            raise InvalidRequest(
                "created_after/created_before need a UTC offset (RFC 3339)"
            )
    query = service.SessionQuery(
        offset, limit, search, tuple(statuses), created_after, created_before, order
    )
    rows, total = await service.list_sessions(db, organization_id=org, query=query)
    body: dict[str, object] = {
        "data": [service.session_wire(s, base) for s in rows],
        "total": total,
        "offset": offset,
        "limit": limit,
    }
    params = {
        k: v
        for k, v in {"search": search, "status": status, "order": order}.items()
        if v
    }
    if created_after is not None:
        params["created_after"] = created_after.isoformat()
    if created_before is not None:
        params["created_before"] = created_before.isoformat()
    if offset + limit < total:
        body["next_url"] = f"{base}/v1/sessions?" + urlencode(
            {**params, "offset": offset + limit, "limit": limit}
        )
    if offset > 0:
        body["prev_url"] = f"{base}/v1/sessions?" + urlencode(
            {**params, "offset": max(0, offset - limit), "limit": limit}
        )
    return wire.json_response(wire.dumps(body))


@router.get(
    "/sessions/{session_id}",
    response_model=schemas.Session,
    responses=problem_responses(400, 401, 404),
)
async def get_session(
    session_id: SessionId, db: ReadDb, org: OrgId, base: BaseUrl
) -> Response:
    """One session."""
    session = await service.get_session(db, organization_id=org, session_id=session_id)
    return wire.json_response(wire.dumps(service.session_wire(session, base)))


@router.patch(
    "/sessions/{session_id}",
    response_model=schemas.Session,
    responses=problem_responses(400, 401, 404, 422, *BODY_PROBLEMS),
)
async def update_session(
    session_id: SessionId,
    data: schemas.SessionUpdate,
    db: WriteDb,
    org: OrgId,
    base: BaseUrl,
    state: StateDep,
) -> Response:
    """Update title, tags, goal or locale; only the fields sent change."""
    guards.check_session(data, state.settings)
    session = await service.update_session(
        db, organization_id=org, session_id=session_id, data=data
    )
    return wire.json_response(wire.dumps(service.session_wire(session, base)))


@router.delete(
    "/sessions/{session_id}",
    status_code=204,
    responses=problem_responses(400, 401, 404),
)
async def delete_session(session_id: SessionId, db: WriteDb, org: OrgId) -> Response:
    """Delete the session with its messages and events; every later call answers 404."""
    await service.delete_session(db, organization_id=org, session_id=session_id)
    return Response(status_code=204)


@router.post(
    "/sessions/{session_id}/cancel",
    response_model=schemas.CancelTurnResponse,
    responses=problem_responses(400, 401, 404, *BODY_PROBLEMS),
)
async def cancel_turn(
    session_id: SessionId, db: WriteDb, org: OrgId
) -> schemas.CancelTurnResponse:
    """Stop the running turn wherever it runs. Idempotent: `no_op` when nothing runs."""
    if await service.cancel_turn(db, organization_id=org, session_id=session_id):
        return schemas.CancelTurnResponse(
            status="cancelled", message="Turn cancelled successfully"
        )
    return schemas.CancelTurnResponse(status="no_op", message="No turn was running")
