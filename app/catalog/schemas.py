"""`GET /v1/models` wire shapes."""

from typing import Literal

from pydantic import Field

from app.schemas import Schema


class Model(Schema):
    """This service's fields, and upstream's `ModelWithProvider` around them."""

    id: str = Field(description="Model ID (format: model_{32-hex})")
    name: str
    driver: str = Field(description="The driver that runs it: `scripted` or `openai`")
    context_tokens: int = Field(description="The context size the model input fits in")
    display_name: str = Field(description="Upstream's name for `name`")
    model_id: str = Field(description="What the provider calls the model")
    provider_id: str = Field(description="The driver as upstream's provider")
    provider_name: str
    provider_type: str
    capabilities: list[str]
    enabled: bool
    healthy: bool
    is_favorite: bool
    source: Literal["predefined", "manual"] = Field(
        description="`predefined`: the driver's one model; `manual`: a MODELS_FILE entry"
    )
    created_at: str = Field(description="When this process loaded the catalog")
    updated_at: str


class ModelList(Schema):
    data: list[Model] = Field(description="The default model first")
    total: int
