"""Interaction wire shapes: the decision request and an interaction as listed."""

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

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


def _one_target_schema(schema: dict[str, Any]) -> None:
    """The schema says what the validator checks: each id is a string when sent (never
    null), and exactly one of the two is sent."""
    for name in ("interaction_id", "tool_call_id"):
        prop = schema["properties"][name]
        (text,) = [
            branch for branch in prop.pop("anyOf") if branch.get("type") != "null"
        ]
        prop.update(text)
        prop.pop("default", None)
    schema["oneOf"] = [{"required": ["interaction_id"]}, {"required": ["tool_call_id"]}]


class ToolDecision(Decision):
    """One decision of `POST .../tool-approvals`: the pending approval named by its
    interaction or by the tool call it holds back (exactly one of the two)."""

    model_config = ConfigDict(json_schema_extra=_one_target_schema)

    interaction_id: Annotated[
        str | None, Field(pattern="^interaction_[0-9a-f]{32}$", max_length=44)
    ] = None
    tool_call_id: Annotated[str | None, Field(min_length=1, max_length=256)] = None

    @model_validator(mode="after")
    def _one_target(self) -> "ToolDecision":
        if (self.interaction_id is None) == (self.tool_call_id is None):
            raise ValueError("give exactly one of interaction_id and tool_call_id")
        return self


class ToolApprovals(InputSchema):
    """Several decisions at once: all are written, or none (a `404` or `409` for one
    of them writes nothing)."""

    decisions: Annotated[list[ToolDecision], Field(min_length=1, max_length=64)]
