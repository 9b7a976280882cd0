"""`GET /v1/models`: the models sessions and messages may select."""

from fastapi import APIRouter, Response

from app import wire
from app.api.deps import CatalogDep, OrgId
from app.catalog import schemas
from app.errors import problem_responses

router = APIRouter(tags=["models"])


@router.get(
    "/models", response_model=schemas.ModelList, responses=problem_responses(400, 401)
)
async def list_models(_org: OrgId, catalog: CatalogDep) -> Response:
    """The models the operator configured, the default first. A session's `model_id`
    and a message's `controls.model_id` must be one of these IDs (else `422`)."""
    models = catalog.models
    return wire.json_response(
        wire.dumps({"data": [m.wire() for m in models], "total": len(models)})
    )
