"""Session wire shapes (upstream's `WithUrls<Session>`, `PaginatedResponse`) and requests."""

from typing import Any, Literal

from pydantic import Field

from app.schemas import InputSchema, Schema

SessionStatus = Literal["started", "active", "idle", "waitingfortoolresults"]


class SessionCreate(InputSchema):
    title: str | None = Field(default=None, max_length=1000)
    tags: list[str] | None = None
    hints: dict[str, Any] | None = None
    locale: str | None = None
    model_id: str | None = Field(default=None, pattern=r"^model_[0-9a-f]{32}$")
    goal: str | None = None
    system_prompt: str | None = None
    agent_id: str | None = Field(default=None, pattern=r"^agent_[0-9a-f]{32}$")
    agent_name: str | None = None
    harness_id: str | None = Field(default=None, pattern=r"^harness_[0-9a-f]{32}$")
    harness_name: str | None = None
    metadata: dict[str, Any] | None = None
    max_iterations: int | None = Field(default=None, ge=1)
    source: Literal["chat", "api"] | None = None


class SessionUpdate(InputSchema):
    title: str | None = Field(default=None, max_length=1000)
    tags: list[str] | None = None
    goal: str | None = None
    locale: str | None = None


class Session(Schema):
    id: str
    organization_id: str
    harness_id: str
    owner_principal_id: str
    workspace_id: str
    status: SessionStatus
    title: str | None = None
    tags: list[str] = Field(default_factory=list)
    created_at: str
    updated_at: str
    started_at: str | None = None
    finished_at: str | None = None
    self_url: str
    view_url: str
    ui_link: str


class SessionPage(Schema):
    data: list[Session]
    total: int
    offset: int
    limit: int
    next_url: str | None = None
    prev_url: str | None = None


class CancelTurnResponse(Schema):
    status: Literal["cancelled", "no_op"]
    message: str
