"""What the official SDK's `AgentClient` asks of an agent besides the session routes
(its base URL is `{server}/v1`): the agent card, and tool approvals decided several
at a time. Question answers have no route: this service has no question tool."""

from fastapi import APIRouter, Request

from app.api.deps import CallerDep, OrgId, SessionId, WriteDb
from app.errors import BODY_PROBLEMS, problem_responses
from app.interactions import schemas, service
from app.schemas import Schema

router = APIRouter(tags=["agent"])

# The content part types a user message may carry (app/messages/schemas.py).
ACCEPTED_INPUT = ["text", "image", "image_file", "file", "context"]


class AgentCard(Schema):
    name: str
    description: str
    version: str
    accepted_input: list[str]
    # `bearer`: every request needs `Authorization: Bearer <key>`; empty in open mode
    # (no key exists yet).
    credentials: list[str]
    # None are configured: this service serves one general agent.
    conversation_starters: list[str]


class ToolApprovalsResult(Schema):
    data: list[schemas.Interaction]


async def agent_card(caller: CallerDep, request: Request) -> AgentCard:
    """The agent card (`AgentClient.card()`): who answers here, what a message may
    carry, and how to authenticate."""
    return AgentCard(
        name="evermirror",
        description="A self-hostable service that speaks the Everruns session API.",
        version=request.app.version,
        accepted_input=ACCEPTED_INPUT,
        credentials=[] if caller.key_hash is None else ["bearer"],
        conversation_starters=[],
    )


@router.post(
    "/sessions/{session_id}/tool-approvals",
    responses=problem_responses(400, 401, 404, 409, 422, *BODY_PROBLEMS),
)
async def submit_tool_approvals(
    session_id: SessionId, data: schemas.ToolApprovals, db: WriteDb, org: OrgId
) -> ToolApprovalsResult:
    """Approve or deny several pending approvals at once
    (`AgentClient.submit_tool_approvals`), each named by its `interaction_id` or by
    the `tool_call_id` it holds back. All are written together or none: a `404` (no
    such pending approval), `409 interaction_resolved` or `422` (one decided twice)
    for any of them writes nothing."""
    resolved = await service.resolve_many(
        db, organization_id=org, session_id=session_id, decisions=data.decisions
    )
    return ToolApprovalsResult.model_validate({"data": resolved})


def card_router(base: str, *, include_in_schema: bool = True) -> APIRouter:
    """The card at the API's base URL itself (`/v1`, `/api/v1`): a path the feature
    routers, mounted under that prefix, cannot have."""
    card = APIRouter(tags=["agent"], include_in_schema=include_in_schema)
    card.add_api_route(
        base, agent_card, methods=["GET"], responses=problem_responses(401)
    )
    return card
