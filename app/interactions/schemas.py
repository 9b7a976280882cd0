"""Interaction wire shapes: the decision request and an interaction as listed."""

from typing import Annotated, Any, Literal

from pydantic import Field

from app.schemas import InputSchema, Schema, StorableText

InteractionStatus = Literal["pending", "approved", "denied", "cancelled"]


class Decision(InputSchema):
    decision: Literal["approve", "deny"]
    reason: Annotated[str, Field(max_length=2000), StorableText] | None = Field(
        default=None, description="Why; a denial's reason is what the model sees."
    )


class Interaction(Schema):
    interaction_id: str
    interaction_type: str
    status: InteractionStatus
    message_id: str
    tool_call_id: str | None = None
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    resolved_at: str | None = None
    cancel_reason: (
        Literal["turn_stopped", "session_disposed", "runtime_interrupted"] | None
    ) = None


class InteractionList(Schema):
    data: list[Interaction]
