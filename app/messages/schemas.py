"""Message wire shapes: the seed's data-wrapped Message, its content parts, the page envelope,
and the create request (upstream's CreateMessageRequest)."""

from typing import Annotated, Any, Literal

from pydantic import Field

from app.schemas import (
    FREE_JSON_NOTE,
    LONG_TEXT_NOTE,
    ActionType,
    ClientMessageId,
    InputSchema,
    JsonObject,
    Label,
    Schema,
    Tags,
    Url,
)

ExecutionPhase = Literal["commentary", "final_answer"]


# ---- input ---------------------------------------------------------------------------
# Every string and number below also passes app/schemas.check_value (no NUL, no lone
# surrogate, integers within 64 bits, finite numbers). Fields without a maxLength here
# are capped by settings: text, context and base64 by MAX_TEXT_CHARS, metadata and
# hints by MAX_JSON_BYTES and MAX_JSON_DEPTH.


class TextInput(InputSchema):
    type: Literal["text"]
    text: str = Field(description=LONG_TEXT_NOTE)


class ImageInput(InputSchema):
    type: Literal["image"]
    base64: str | None = Field(default=None, description=LONG_TEXT_NOTE)
    media_type: Label | None = None
    url: Url | None = None


class ImageFileInput(InputSchema):
    type: Literal["image_file"]
    image_id: str = Field(pattern=r"^img_[0-9a-f]{32}$")
    filename: Label | None = None


class FileInput(InputSchema):
    type: Literal["file"]
    file_id: str = Field(pattern=r"^file_[0-9a-f]{32}$")
    filename: Label | None = None


class ContextInput(InputSchema):
    """The seed's user `context` part: safely tagged text at the model boundary."""

    type: Literal["context"]
    tag: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
    context: str = Field(description=LONG_TEXT_NOTE)


InputPart = Annotated[
    TextInput | ImageInput | ImageFileInput | FileInput | ContextInput,
    Field(discriminator="type"),
]


class InputMessage(InputSchema):
    # Any role is parsed so that a non-user role gets upstream's 400, not a 422; the
    # schema documents the one role accepted.
    role: Label = Field(default="user", json_schema_extra={"enum": ["user"]})
    content: list[InputPart] = Field(
        min_length=1, description="At most MAX_MESSAGE_PARTS parts (default 100)."
    )
    # Beyond upstream: the seed's visibility; `internal` messages are hidden from lists
    # unless `include_internal=true`.
    visibility: Literal["visible", "internal"] = "visible"


class ReasoningControls(InputSchema):
    effort: (
        Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None
    ) = None


class Controls(InputSchema):
    model_id: str | None = Field(default=None, pattern=r"^model_[0-9a-f]{32}$")
    reasoning: ReasoningControls | None = None
    locale: Label | None = None
    hints: JsonObject | None = Field(default=None, description=FREE_JSON_NOTE)
    error_disclosure: Literal["generic", "standard", "detailed"] | None = None
    speed: Label | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ExternalActor(InputSchema):
    actor_id: Label
    source: Label
    actor_name: Label | None = None
    metadata: JsonObject | None = Field(default=None, description=FREE_JSON_NOTE)


class MessageCreate(InputSchema):
    message: InputMessage
    controls: Controls | None = None
    metadata: JsonObject | None = Field(default=None, description=FREE_JSON_NOTE)
    tags: Tags | None = None
    external_actor: ExternalActor | None = None
    client_message_id: ClientMessageId | None = Field(
        default=None,
        description=(
            "Idempotency key: the same key with the same body answers the stored "
            "message (`delivery: duplicate`); with a different body, 409."
        ),
    )


# ---- output --------------------------------------------------------------------------


class PartBase(Schema):
    part_id: str = Field(description="Stable identity of the part within its message.")
    sequence: int = Field(
        description="Immutable position of the part within its message, from 1."
    )
    step_id: str | None = Field(
        default=None, description="The model Step that produced the part."
    )


class AnnotationSource(Schema):
    uri: str
    title: str | None = None
    snippet: str | None = None
    location: Any = None


class AnnotationVerification(Schema):
    status: Literal["entailed", "unsupported", "uncertain"]
    score: float | None = None


class TextAnnotation(Schema):
    start: int
    end: int
    origin: str
    source: AnnotationSource
    external_id: str | None = None
    verified: AnnotationVerification | None = None


class TextPart(PartBase):
    type: Literal["text"]
    text: str
    annotations: list[TextAnnotation] | None = None


class ImagePart(PartBase):
    type: Literal["image"]
    base64: str | None = None
    media_type: str | None = None
    url: str | None = None


class ImageFilePart(PartBase):
    type: Literal["image_file"]
    image_id: str
    filename: str | None = None


class FilePart(PartBase):
    type: Literal["file"]
    file_id: str
    filename: str | None = None


class NativeToolCall(Schema):
    type: Literal["function_call", "custom_tool_call"]
    call_id: str
    name: str
    arguments: str | None = None
    input: str | None = None
    async_: bool | None = Field(default=None, alias="async")


class ToolCallPart(PartBase):
    type: Literal["tool_call"]
    id: str
    name: str
    arguments: Any
    native: NativeToolCall | None = None
    status: (
        Literal[
            "ready",
            "awaiting_approval",
            "awaiting_client",
            "running",
            "completed",
            "failed",
        ]
        | None
    ) = Field(
        default=None,
        description='The tool\'s state (README, "Tool life cycle"): ready -> '
        "awaiting_approval | awaiting_client -> running -> completed | failed; "
        "transitions update this part in place.",
    )


class ToolResultPart(PartBase):
    type: Literal["tool_result"]
    tool_call_id: str
    result: Any = None
    error: str | None = None


class ReasoningText(Schema):
    kind: Literal["plain", "summary", "redacted"]
    text: str | None = None
    parts: list[str] | None = None


class ReasoningPart(PartBase):
    type: Literal["reasoning"]
    provider: str
    text: ReasoningText | None = None
    item_id: str | None = None
    bound_tool_call_id: str | None = None
    tokens: int | None = None


class ContextPart(PartBase):
    type: Literal["context"]
    tag: str
    context: str


class InteractionPart(PartBase):
    type: Literal["interaction"]
    interaction_id: str
    kind: str
    interaction_type: str | None = Field(
        default=None, description="`approval`: a tool waits for a decision."
    )
    status: str = Field(description="pending, approved, denied or cancelled.")
    tool_call_id: str | None = None
    prompt: str | None = None
    request: Any = None
    response: Any = None
    resolved_at: str | None = None
    cancel_reason: str | None = Field(
        default=None, description="turn_stopped or runtime_interrupted."
    )


class ActionPart(PartBase):
    """A change of what the turn runs with (the seed's Action): `data` holds the
    `field` and its `old` and `new` values; a system prompt only its `new` text, a
    tool list only names (`names`, `added`, `removed`, `changed`)."""

    type: Literal["action"]
    action_id: str
    action_type: ActionType
    state: Literal["running", "completed", "failed"]
    title: str
    data: dict[str, Any]


class ErrorPart(PartBase):
    type: Literal["error"]
    code: str
    message: str


ContentPart = Annotated[
    TextPart
    | ImagePart
    | ImageFilePart
    | FilePart
    | ToolCallPart
    | ToolResultPart
    | ReasoningPart
    | ContextPart
    | InteractionPart
    | ActionPart
    | ErrorPart,
    Field(discriminator="type"),
]


class MessageOrigin(Schema):
    """Where a forked session's copy of a message comes from."""

    session_id: str
    message_id: str
    turn_id: str | None = None


class Message(Schema):
    id: str = Field(description="Unique message ID (format: message_{32-hex})")
    session_id: str
    sequence: int
    role: Literal["user", "agent"]
    content: list[ContentPart]
    phase: ExecutionPhase | None = None
    phase_source: Literal["provider", "derived", "communication"] | None = None
    controls: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    external_actor: dict[str, Any] | None = None
    origin: MessageOrigin | None = Field(
        default=None, description="In a forked session: the message this one copies."
    )
    created_at: str
    updated_at: str
    revision: int = Field(description="+1 at every durable checkpoint of this message.")
    state: Literal["streaming", "done"]
    visibility: Literal["visible", "internal"]
    turn_id: str | None = None
    delivery: Literal["started", "steered", "resumed", "duplicate"] | None = Field(
        default=None, description="Only on the response to creating a message."
    )


class MessagePage(Schema):
    data: list[Message]
    total: int = Field(
        description="Real Messages in the session (visible, or all with include_internal)."
    )
    has_more: bool = Field(
        description="Older messages exist: the session has more than `limit`, or "
        "MAX_LIST_BYTES ended the page early (it then holds the newest that fit)."
    )
    start_sequence: int | None = None
    end_sequence: int | None = None
    next_before_sequence: int | None = None
    cursor: str = Field(description="Committed stream position this page was read at.")


class WaitError(Schema):
    code: str = Field(
        description="The turn's error code (`model_error`, `internal_error`, ...), or "
        "`cancelled_by_user` when it was cancelled"
    )
    message: str


class WaitResult(Schema):
    """`POST .../messages?wait=true` when the turn ended."""

    status: Literal["completed", "failed"] = Field(
        description="`failed` also for a cancelled turn (`error` says which)"
    )
    message: Message = Field(description="The posted message, as stored")
    messages: list[Message] = Field(
        description="The turn's visible agent messages, oldest first"
    )
    error: WaitError | None = None


class WaitWaiting(Schema):
    """`POST .../messages?wait=true` when the turn waits for the client: it goes on
    once the client posts its tool results or decides its approval."""

    status: Literal["waiting"]
    waiting_for: Literal["tool_results", "approval"] = Field(
        description="`tool_results`: client-side tool calls to answer (POST"
        " .../tool-results); `approval`: a pending interaction to decide"
    )
    message: Message = Field(description="The posted message, as stored")
    messages: list[Message] = Field(
        description="The turn's visible agent messages so far, oldest first: they hold"
        " the tool calls and the interaction"
    )


class WaitTimeout(Schema):
    """`POST .../messages?wait=true` when the turn did not end within `timeout_ms`."""

    status: Literal["timeout"]
    message: Message = Field(description="The posted message, as stored")
