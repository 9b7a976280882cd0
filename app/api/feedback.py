"""Feedback routes: HTTP only; the service does the work."""

from typing import Annotated

from fastapi import APIRouter, Path, Response

from app import wire
from app.api.deps import CallerDep, MetricsDep, OrgId, ReadDb, SessionId, WriteDb
from app.errors import BODY_PROBLEMS, problem_responses
from app.feedback import schemas, service
from app.ids import parse_or_400

router = APIRouter(tags=["feedback"])

MessageIdPath = Annotated[
    str,
    Path(
        description="Message ID (format: message_{32-hex})",
        json_schema_extra={"pattern": "^message_[0-9a-f]{32}$"},
    ),
]


@router.put(
    "/sessions/{session_id}/messages/{message_id}/feedback",
    response_model=schemas.Feedback,
    responses=problem_responses(400, 401, 404, 422, *BODY_PROBLEMS),
)
async def put_feedback(
    session_id: SessionId,
    message_id: MessageIdPath,
    data: schemas.FeedbackInput,
    db: WriteDb,
    org: OrgId,
    caller: CallerDep,
    metrics: MetricsDep,
) -> Response:
    """Rate a message (`good` or `bad`) and comment on it, replacing the caller's
    earlier feedback on it; no rating and no comment remove it. Each API key has
    feedback of its own."""
    message_uuid = parse_or_400("message", "message", message_id)
    body = await service.rate(
        db,
        organization_id=org,
        session_id=session_id,
        message_id=message_uuid,
        key=service.caller_key(caller.key_hash),
        data=data,
    )
    if metrics is not None:
        metrics.feedback.inc((data.rating or "none",))
    return wire.json_response(wire.dumps(body))


@router.get(
    "/sessions/{session_id}/feedback",
    response_model=schemas.FeedbackList,
    responses=problem_responses(400, 401, 404),
)
async def list_feedback(
    session_id: SessionId, db: ReadDb, org: OrgId, caller: CallerDep
) -> Response:
    """The caller's feedback on the session's messages, in the messages' order."""
    rows = await service.list_feedback(
        db,
        organization_id=org,
        session_id=session_id,
        key=service.caller_key(caller.key_hash),
    )
    return wire.json_response(wire.dumps({"data": rows}))
