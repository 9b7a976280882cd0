"""`GET /v1/models`: the models sessions and messages may select."""

from fastapi import APIRouter, Response

from app import wire
from app.catalog import schemas
from app.deps import OrgId, StateDep
from app.errors import problem_responses

router = APIRouter(tags=["models"])


@router.get(
    "/models", response_model=schemas.ModelList, responses=problem_responses(400, 401)
)
async def list_models(_org: OrgId, state: StateDep) -> Response:
    """The models the operator configured, the default first. A session's `model_id`
    and a message's `controls.model_id` must be one of these IDs (else `422`)."""
    models = state.catalog.models
    return wire.json_response(
        wire.dumps({"data": [m.wire() for m in models], "total": len(models)})
    )
