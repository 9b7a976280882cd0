"""Session wire shapes (upstream's `WithUrls<Session>`, `PaginatedResponse`) and requests."""

from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from app.schemas import (
    FREE_JSON_NOTE,
    LONG_TEXT_NOTE,
    MAX_ITERATIONS,
    InputSchema,
    JsonObject,
    Label,
    Schema,
    Tags,
    Title,
    UtcTimestamp,
)
from app.tools.schemas import Tools


def _json_integer(cls: Any, value: Any) -> Any:
    """A JSON Schema integer: `3` or `3.0`, never `true` or `"3"` (which pydantic's
    lax mode would read as 1 and 3)."""
    if value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError("int_type", "must be an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise PydanticCustomError("int_type", "must be an integer")
        return int(value)
    return value


SessionStatus = Literal["started", "active", "idle", "waitingfortoolresults"]
ApprovalMode = Literal["ask", "always-allow"]
APPROVAL_MODE_NOTE = (
    "`ask` (the default): a tool whose policy is `requires_approval` waits for a "
    "decision (`POST .../interactions/{id}`); `always-allow` runs it without asking."
)


ACTION_NOTE = (
    "A change is an `action` part in the conversation (on the running turn's "
    "streaming agent message, else a message of its own) and applies from the "
    "turn's next step."
)

# Strings and numbers also pass app/schemas.check_value; goal and system_prompt are
# capped by MAX_TEXT_CHARS, metadata and hints by MAX_JSON_BYTES and MAX_JSON_DEPTH
# (settings, checked by app/api/guards.py).


EXPIRES_NOTE = (
    "When the purge deletes the session with its messages and events, whatever its"
    " activity (RFC 3339)."
)


class SessionCreate(InputSchema):
    title: Title | None = None
    tags: Tags | None = None
    hints: JsonObject | None = Field(default=None, description=FREE_JSON_NOTE)
    locale: Label | None = None
    model_id: str | None = Field(default=None, pattern=r"^model_[0-9a-f]{32}$")
    goal: str | None = Field(default=None, description=LONG_TEXT_NOTE)
    system_prompt: str | None = Field(default=None, description=LONG_TEXT_NOTE)
    agent_id: str | None = Field(default=None, pattern=r"^agent_[0-9a-f]{32}$")
    agent_name: Label | None = None
    harness_id: str | None = Field(default=None, pattern=r"^harness_[0-9a-f]{32}$")
    harness_name: Label | None = None
    metadata: JsonObject | None = Field(default=None, description=FREE_JSON_NOTE)
    max_iterations: int | None = Field(default=None, ge=1, le=MAX_ITERATIONS)
    source: Literal["chat", "api"] | None = None
    expires_at: UtcTimestamp = Field(default=None, description=EXPIRES_NOTE)

    _integer = field_validator("max_iterations", mode="before")(_json_integer)

    tools: Tools | None = Field(
        default=None,
        description="Tools the model may call: `client_side` ones are run by the "
        "client (the turn waits for `POST .../tool-results`), `builtin` ones here.",
    )
    approval_mode: ApprovalMode | None = Field(
        default=None, description=APPROVAL_MODE_NOTE
    )


class SessionUpdate(InputSchema):
    title: Title | None = None
    tags: Tags | None = None
    expires_at: UtcTimestamp = Field(
        default=None, description=EXPIRES_NOTE + " `null`: never."
    )
    goal: str | None = Field(default=None, description=LONG_TEXT_NOTE)
    locale: Label | None = None
    model_id: str | None = Field(
        default=None,
        pattern=r"^model_[0-9a-f]{32}$",
        description="A model of `GET /v1/models` (`null`: the default). " + ACTION_NOTE,
    )
    system_prompt: str | None = Field(
        default=None, description=LONG_TEXT_NOTE + " " + ACTION_NOTE
    )
    tools: Tools | None = Field(
        default=None,
        description="Replaces the session's tools (`[]` removes them all). "
        + ACTION_NOTE,
    )
    approval_mode: ApprovalMode | None = Field(
        default=None, description=APPROVAL_MODE_NOTE + " " + ACTION_NOTE
    )


class TokenUsage(Schema):
    """Upstream's TokenUsage: prompt buckets are disjoint (`input_tokens` excludes
    cached reads)."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    actual_cost_usd: float | None = None


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
    is_pinned: bool = False
    archived_at: str | None = None
    expires_at: str | None = None
    usage: TokenUsage | None = Field(
        default=None,
        description="Cumulative token usage of every model call in this session.",
    )
    tools: list[dict[str, Any]] | None = None
    approval_mode: ApprovalMode | None = None
    forked_from_session_id: str | None = Field(
        default=None, description="The session this one was forked from."
    )
    forked_from_sequence: int | None = Field(
        default=None,
        description="The sequence of the last message of that session the fork holds.",
    )
    forked_from_message_id: str | None = Field(
        default=None,
        description="The message of that session the fork's history ends at (absent: "
        "the whole history).",
    )
    self_url: str
    view_url: str
    ui_link: str


class SessionPage(Schema):
    data: list[Session]
    total: int
    offset: int
    limit: int = Field(
        description="The page size: as asked, or how many sessions the page holds "
        "when MAX_LIST_BYTES ended it early (then `offset + limit` and `next_url` "
        "continue right after them)."
    )
    next_url: str | None = None
    prev_url: str | None = None


class CancelTurnResponse(Schema):
    status: Literal["cancelled", "no_op"]
    message: str


class ForkCreate(InputSchema):
    message_id: str | None = Field(
        default=None,
        pattern=r"^message_[0-9a-f]{32}$",
        description="Where the fork's history ends (absent: the whole history).",
    )
    include_message: bool = Field(
        default=True,
        description="Whether that message is in the fork, or ends before it.",
    )
    title: Title | None = Field(default=None, description="Absent: the source's title.")
    tags: Tags | None = Field(default=None, description="Absent: the source's tags.")


class Branch(Schema):
    """A fork that asks again: the new session, and the message posted in it (its
    `turn_id` the turn it started)."""

    session: Session
    message: dict[str, Any]


class SearchHit(Schema):
    session_id: str
    session_title: str | None
    message_id: str
    sequence: int = Field(description="The message's place in its session.")
    role: Literal["user", "agent"]
    created_at: str
    snippet: str = Field(description="Where the words occur in the message's text.")
    snippet_html: str = Field(
        description="The snippet as HTML: its text escaped, each match in `<mark>`."
    )


class SearchPage(Schema):
    data: list[SearchHit]
    offset: int
    limit: int
    next_url: str | None = Field(
        default=None, description="The next page of hits; absent on the last."
    )
