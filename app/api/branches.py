"""Branches: fork a session, edit a question, regenerate an answer. HTTP only; the
service (app/sessions/fork.py) does the work in one unit of work."""

from typing import Annotated

from fastapi import APIRouter, Path, Response

from app import wire
from app.api import endpoints
from app.api.deps import BaseUrl, OrgId, SessionId, StateDep, WriteDb
from app.errors import BODY_PROBLEMS, InvalidRequest, problem_responses
from app.ids import parse_or_400
from app.messages.schemas import MessageCreate
from app.sessions import fork, schemas, service

router = APIRouter(tags=["sessions"])

MessageIdPath = Annotated[
    str,
    Path(
        description="Message ID (format: message_{32-hex})",
        json_schema_extra={"pattern": "^message_[0-9a-f]{32}$"},
    ),
]


def _created(body: bytes, location: str) -> Response:
    return wire.json_response(body, 201, headers={"Location": location})


@router.post(
    "/sessions/{session_id}/fork",
    status_code=201,
    response_model=schemas.Session,
    responses=problem_responses(400, 401, 404, 422, *BODY_PROBLEMS),
)
async def fork_session(
    session_id: SessionId,
    db: WriteDb,
    org: OrgId,
    base: BaseUrl,
    data: schemas.ForkCreate | None = None,
) -> Response:
    """A new session holding this one's committed history up to `message_id` (with
    it unless `include_message` is false; absent: all of it), its messages keeping
    their `origin`. Allowed while a turn runs: what is committed is copied, pending
    approvals are not."""
    data = data or schemas.ForkCreate()
    message_id = (
        parse_or_400("message", "message_id", data.message_id)
        if data.message_id is not None
        else None
    )
    created = await fork.fork(
        db,
        organization_id=org,
        session_id=session_id,
        message_id=message_id,
        include_message=data.include_message,
        title=data.title,
        tags=data.tags,
    )
    body = service.session_wire(created, base)
    return _created(wire.dumps(body), body["self_url"])


@router.post(
    "/sessions/{session_id}/messages/{message_id}/regenerate",
    status_code=201,
    response_model=schemas.Branch,
    responses=problem_responses(400, 401, 404, 429, *BODY_PROBLEMS),
)
async def regenerate_message(
    session_id: SessionId,
    message_id: MessageIdPath,
    db: WriteDb,
    org: OrgId,
    base: BaseUrl,
    state: StateDep,
) -> Response:
    """Ask an agent message's question again, in a fork that ends before it: the new
    session and its turn. This session is untouched."""
    forked = await fork.ask_again(
        db,
        organization_id=org,
        session_id=session_id,
        message_id=parse_or_400("message", "message", message_id),
        content=None,
        admission=state.admission,
    )
    return _branch(forked, base)


@router.post(
    "/sessions/{session_id}/messages/{message_id}/edit",
    status_code=201,
    response_model=schemas.Branch,
    responses=problem_responses(400, 401, 404, 422, 429, *BODY_PROBLEMS),
)
async def edit_message(
    session_id: SessionId,
    message_id: MessageIdPath,
    data: MessageCreate,
    db: WriteDb,
    org: OrgId,
    base: BaseUrl,
    state: StateDep,
) -> Response:
    """Ask a user message again with new content (`message.content`), in a fork that
    ends before it: the new session and its turn. This session is untouched."""
    if data.message.role != "user":
        raise InvalidRequest("Only user messages can be created through this endpoint")
    endpoints.accept_message(state, data)
    forked = await fork.ask_again(
        db,
        organization_id=org,
        session_id=session_id,
        message_id=parse_or_400("message", "message", message_id),
        content=[part.model_dump(exclude_none=True) for part in data.message.content],
        admission=state.admission,
    )
    return _branch(forked, base)


def _branch(forked: fork.Forked, base: str) -> Response:
    session = service.session_wire(forked.session, base)
    assert forked.message is not None
    body = b'{"session":' + wire.dumps(session) + b',"message":' + forked.message + b"}"
    return _created(body, session["self_url"])
