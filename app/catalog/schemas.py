"""`GET /v1/models` wire shapes."""

from pydantic import Field

from app.schemas import Schema


class Model(Schema):
    id: str = Field(description="Model ID (format: model_{32-hex})")
    name: str
    driver: str = Field(description="The driver that runs it: `scripted` or `openai`")
    context_tokens: int = Field(description="The context size the model input fits in")


class ModelList(Schema):
    data: list[Model] = Field(description="The default model first")
    total: int
