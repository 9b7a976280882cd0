"""Interaction routes: list a session's interactions, resolve one."""

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query

from app.api.deps import OrgId, ReadDb, SessionId, WriteDb
from app.errors import BODY_PROBLEMS, problem_responses
from app.ids import format_id, parse_or_400
from app.interactions import schemas, service

router = APIRouter(tags=["interactions"])


@router.get(
    "/sessions/{session_id}/interactions",
    response_model=schemas.InteractionList,
    responses=problem_responses(400, 401, 404),
)
async def list_interactions(
    session_id: SessionId,
    db: ReadDb,
    org: OrgId,
    status: Annotated[
        Literal["pending", "approved", "denied", "cancelled"] | None, Query()
    ] = None,
) -> schemas.InteractionList:
    """The session's interactions (approvals), oldest first; `status=pending` lists
    those waiting for a decision."""
    found = await service.list_interactions(
        db, organization_id=org, session_id=session_id, status=status
    )
    return schemas.InteractionList.model_validate({"data": found})


@router.post(
    "/sessions/{session_id}/interactions/{interaction_id}",
    response_model=schemas.Interaction,
    responses=problem_responses(400, 401, 404, 409, 422, *BODY_PROBLEMS),
)
async def resolve_interaction(
    session_id: SessionId,
    interaction_id: Annotated[
        str,
        Path(
            description="Interaction ID (format: interaction_{32-hex})",
            json_schema_extra={"pattern": "^interaction_[0-9a-f]{32}$"},
        ),
    ],
    data: schemas.Decision,
    db: WriteDb,
    org: OrgId,
) -> schemas.Interaction:
    """Approve or deny a pending approval: the interaction and its tool's move
    (`running`, or `failed` with the denial reason) commit together, and the turn goes
    on. `404` for an interaction the session does not have; `409`
    `interaction_resolved` when it was already decided or cancelled."""
    parsed = parse_or_400("interaction", "interaction", interaction_id)
    resolved = await service.resolve(
        db,
        organization_id=org,
        session_id=session_id,
        interaction_id=format_id("interaction", parsed),
        data=data,
    )
    return schemas.Interaction.model_validate(resolved)
