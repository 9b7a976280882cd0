"""Tool wire shapes: upstream's `ToolDefinition` as sessions carry it, and the
client-side tool results request (`SubmitToolResultsRequest`) and its answer."""

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from app.schemas import InputSchema, JsonObject, Schema, StorableText

TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
MAX_TOOLS = 128
MAX_TOOL_DESCRIPTION_CHARS = 10_000
MAX_TOOL_RESULTS = 128
MAX_TOOL_ERROR_CHARS = 10_000
ToolPolicy = Literal["auto", "requires_approval", "client_side"]


class ToolDefinition(InputSchema):
    """A tool a session offers the model. `client_side` tools are run by the client:
    the turn waits for their results (`POST /v1/sessions/{id}/tool-results`);
    `builtin` ones by the server. Other upstream fields (`display_name`, `hints`, ...)
    are accepted and ignored."""

    type: Literal["builtin", "client_side"] = Field(
        default="client_side", description="Who runs the tool (the SDK's default)."
    )
    name: str = Field(pattern=TOOL_NAME_PATTERN, description="Unique in the session.")
    description: Annotated[
        str, Field(max_length=MAX_TOOL_DESCRIPTION_CHARS), StorableText
    ] = ""
    # Checked against the meta-schema by the routes, within a budget
    # (app/tools/schema_check.py): not here, where it would run on the event loop.
    parameters: JsonObject = Field(
        description="A JSON Schema (draft 2020-12) of the tool's arguments."
    )
    policy: ToolPolicy | None = Field(
        default=None,
        description="`requires_approval` asks before running; `client_side` as type.",
    )


def _unique_names(tools: list[ToolDefinition]) -> list[ToolDefinition]:
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        if tool.name in seen:
            raise PydanticCustomError(
                "tool_name_unique",
                "duplicate tool name '{name}': tool names are unique in a session",
                {"name": tool.name, "where": [index, "name"]},
            )
        seen.add(tool.name)
    return tools


Tools = Annotated[
    list[ToolDefinition], Field(max_length=MAX_TOOLS), AfterValidator(_unique_names)
]


def is_client_side(tools: list[dict[str, Any]], name: str) -> bool:
    """Whether the session's tool `name` is run by the client."""
    for tool in tools:
        if tool.get("name") == name:
            return bool(
                tool.get("type") == "client_side" or tool.get("policy") == "client_side"
            )
    return False


def needs_approval(tools: list[dict[str, Any]], name: str) -> bool:
    """Whether the session's tool `name` asks before it runs (policy
    `requires_approval`, unless the session's approval_mode is `always-allow`)."""
    return any(
        t.get("name") == name and t.get("policy") == "requires_approval" for t in tools
    )


class ToolResult(InputSchema):
    tool_call_id: Annotated[str, Field(min_length=1, max_length=255), StorableText]
    result: Any = Field(default=None, description="What the tool returned (any JSON).")
    error: (
        Annotated[str, Field(max_length=MAX_TOOL_ERROR_CHARS), StorableText] | None
    ) = Field(default=None, description="Why the tool failed; the model sees it.")


def _distinct_calls(results: list[ToolResult]) -> list[ToolResult]:
    seen: set[str] = set()
    for index, item in enumerate(results):
        if item.tool_call_id in seen:
            raise PydanticCustomError(
                "tool_call_id_unique",
                "tool call '{id}' appears twice in one request",
                {"id": item.tool_call_id[:100], "where": [index, "tool_call_id"]},
            )
        seen.add(item.tool_call_id)
    return results


class ToolResultsRequest(InputSchema):
    tool_results: Annotated[
        list[ToolResult],
        Field(min_length=1, max_length=MAX_TOOL_RESULTS),
        AfterValidator(_distinct_calls),
    ]


class ToolResultsResponse(Schema):
    accepted: int = Field(description="How many of the request's results are stored.")
    status: str = Field(
        description="The session's status once they were: `waitingfortoolresults` "
        "while other calls of the step still wait, else `active` (the turn goes on). "
        "A repeated request is answered as the first one was."
    )
