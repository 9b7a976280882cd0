"""Session routes: HTTP only; the service does the work."""

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.responses import StreamingResponse

from app import wire
from app.api import guards
from app.api.deps import (
    BaseUrl,
    CatalogDep,
    OrgId,
    ReadDb,
    ReadsDep,
    SessionId,
    SettingsDep,
    WriteDb,
)
from app.errors import BODY_PROBLEMS, InvalidParameter, problem_responses
from app.ids import format_id, parse_or_400
from app.schemas import MAX_INT32, UtcTimestamp
from app.sessions import actions, atif, export, imports, page, schemas, service
from app.tools import schema_check

router = APIRouter(tags=["sessions"])

JSONL = "application/jsonl"

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
    settings: SettingsDep,
    catalog: CatalogDep,
    data: Annotated[schemas.SessionCreate | None, Body()] = None,
) -> Response:
    """Create a session. Every body field is optional; so is the body."""
    data = data or schemas.SessionCreate()
    guards.check_session(data, settings)
    await schema_check.check_tools(data.tools)
    catalog.require(data.model_id, "model_id")
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
    settings: SettingsDep,
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
    created_after: UtcTimestamp = None,
    created_before: UtcTimestamp = None,
    order: Literal["created_at", "last_activity"] = "created_at",
    include_archived: Annotated[
        bool, Query(description="List archived sessions with the others.")
    ] = False,
    archived_only: Annotated[
        bool, Query(description="List archived sessions only.")
    ] = False,
    forked_from: Annotated[
        str | None,
        Query(
            description="Only the sessions forked from this one (its branches).",
            json_schema_extra={"pattern": "^session_[0-9a-f]{32}$"},
        ),
    ] = None,
) -> Response:
    """List the organization's sessions, newest first, with offset pagination. A page
    whose sessions would pass MAX_LIST_BYTES ends early: `limit` then says how many it
    holds, and `next_url` (or `offset + limit`) continues after them."""
    if search is not None and "\x00" in search:
        raise InvalidParameter("search: must not contain NUL (U+0000)")
    statuses: list[str] = []
    for value in (status or "").split(","):
        if value.strip():
            if value.strip() not in service.STATUS_FILTERS:
                raise InvalidParameter(f"status: unknown value '{value.strip()}'")
            statuses.append(service.STATUS_FILTERS[value.strip()])
    query = service.SessionQuery(
        offset,
        limit,
        search,
        tuple(statuses),
        created_after,
        created_before,
        order,
        "only" if archived_only else "include" if include_archived else "exclude",
        forked_from=(
            format_id("session", parse_or_400("session", "forked_from", forked_from))
            if forked_from is not None
            else None
        ),
    )
    rows, total = await service.list_sessions(
        db, organization_id=org, query=query, backend=settings.backend
    )
    return wire.json_response(
        page.render(
            rows,
            total=total,
            query=query,
            base=base,
            max_bytes=settings.max_list_bytes,
        )
    )


@router.post(
    "/sessions/import",
    status_code=201,
    response_model=schemas.Session,
    responses=problem_responses(400, 401, 422, *BODY_PROBLEMS),
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "A session's export (`GET .../export?format=jsonl`)",
            "content": {JSONL: {"schema": {"type": "string"}}},
        }
    },
)
async def import_session(
    request: Request, db: WriteDb, org: OrgId, base: BaseUrl
) -> Response:
    """A new session from a JSON Lines export: its title, tags and settings, and its
    messages in order (new ids, each keeping its `origin`). The whole input is checked
    first: the first line that is not what an export holds is a 422 naming it, and
    nothing is written. At most MAX_IMPORT_BYTES."""
    exported = imports.parse(await request.body())
    created = await imports.import_session(db, organization_id=org, exported=exported)
    body = service.session_wire(created, base)
    return wire.json_response(
        wire.dumps(body), 201, headers={"Location": body["self_url"]}
    )


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


@router.get(
    "/sessions/{session_id}/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "The session, its messages and its events as JSON Lines, "
            "or an ATIF trajectory (docs/api.md, Export)",
            "content": {
                JSONL: {"schema": {"type": "string"}},
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["schema_version", "session_id", "agent", "steps"],
                    }
                },
            },
            "headers": {"Content-Disposition": {"schema": {"type": "string"}}},
        },
        **problem_responses(400, 401, 404),
    },
)
async def export_session(
    session_id: SessionId,
    db: ReadDb,
    reads: ReadsDep,
    org: OrgId,
    base: BaseUrl,
    format: Annotated[
        Literal["jsonl", "atif"],
        Query(
            description="`jsonl`: the session, its messages and events, one per line; "
            "`atif`: an ATIF v1.4 trajectory (one JSON document)."
        ),
    ] = "jsonl",
) -> StreamingResponse:
    """The session, every message (internal ones included) and every event of its log,
    one JSON object per line (or the session as an ATIF trajectory), streamed."""
    session = await service.get_session(db, organization_id=org, session_id=session_id)
    body = service.session_wire(session, base)
    if format == "atif":
        return StreamingResponse(
            atif.trajectory(reads, session_id, session.last_sequence, body),
            media_type="application/json",
            headers={
                "Content-Disposition": f'attachment; filename="{body["id"]}.atif.json"'
            },
        )
    return StreamingResponse(
        export.jsonl(reads, session_id, session.last_sequence, body),
        media_type=JSONL,
        headers={"Content-Disposition": f'attachment; filename="{body["id"]}.jsonl"'},
    )


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
    settings: SettingsDep,
    catalog: CatalogDep,
) -> Response:
    """Update the fields sent, and only those. A change of model, approval mode,
    system prompt or tools is recorded as an Action in the conversation."""
    guards.check_session(data, settings)
    await schema_check.check_tools(data.tools)
    catalog.require(data.model_id, "model_id")
    before, session = await service.update_session(
        db, organization_id=org, session_id=session_id, data=data
    )
    await actions.record_changes(
        db, before, session, model_name=lambda m: catalog.get(m).name
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


@router.put(
    "/sessions/{session_id}/pin",
    status_code=204,
    responses=problem_responses(400, 401, 404),
)
async def pin_session(session_id: SessionId, db: WriteDb, org: OrgId) -> Response:
    """Pin the session (`is_pinned: true`). Idempotent."""
    await service.mark_session(
        db, organization_id=org, session_id=session_id, mark="pinned_at", on=True
    )
    return Response(status_code=204)


@router.delete(
    "/sessions/{session_id}/pin",
    status_code=204,
    responses=problem_responses(400, 401, 404),
)
async def unpin_session(session_id: SessionId, db: WriteDb, org: OrgId) -> Response:
    """Unpin the session. Idempotent."""
    await service.mark_session(
        db, organization_id=org, session_id=session_id, mark="pinned_at", on=False
    )
    return Response(status_code=204)


@router.put(
    "/sessions/{session_id}/archive",
    status_code=204,
    responses=problem_responses(400, 401, 404),
)
async def archive_session(session_id: SessionId, db: WriteDb, org: OrgId) -> Response:
    """Archive the session: `GET /v1/sessions` leaves it out unless `include_archived`
    or `archived_only` asks for it; everything else works as before. Idempotent."""
    await service.mark_session(
        db, organization_id=org, session_id=session_id, mark="archived_at", on=True
    )
    return Response(status_code=204)


@router.delete(
    "/sessions/{session_id}/archive",
    status_code=204,
    responses=problem_responses(400, 401, 404),
)
async def unarchive_session(session_id: SessionId, db: WriteDb, org: OrgId) -> Response:
    """Bring the session back to the default list. Idempotent."""
    await service.mark_session(
        db, organization_id=org, session_id=session_id, mark="archived_at", on=False
    )
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
