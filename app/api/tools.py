"""Tool routes: client-side tool results."""

from fastapi import APIRouter

from app.api import guards
from app.api.deps import OrgId, SessionId, SettingsDep, WriteDb
from app.errors import BODY_PROBLEMS, problem_responses
from app.tools import schemas, service

router = APIRouter(tags=["tools"])


@router.post(
    "/sessions/{session_id}/tool-results",
    response_model=schemas.ToolResultsResponse,
    responses=problem_responses(400, 401, 404, 409, 422, *BODY_PROBLEMS),
)
async def submit_tool_results(
    session_id: SessionId,
    data: schemas.ToolResultsRequest,
    db: WriteDb,
    org: OrgId,
    settings: SettingsDep,
) -> schemas.ToolResultsResponse:
    """Results of client-side tool calls (the `tool_calls` of `tool.call_requested`
    events) while the session is `waitingfortoolresults`. Each moves its tool to
    `completed` (or `failed` with `error`); once every call of the step has its
    result the turn goes on. `409` with "not waiting for tool results" when nothing
    waits; `422` for a call that does not wait; the same result posted again is
    stored once and answered the same way; another result for a call that has one is
    `409` `tool_result_conflict`. A `result` is free-form JSON within
    MAX_JSON_BYTES and MAX_JSON_DEPTH."""
    for index, item in enumerate(data.tool_results):
        guards.check_json_field(f"tool_results.{index}.result", item.result, settings)
    return await service.submit_tool_results(
        db, organization_id=org, session_id=session_id, data=data
    )
