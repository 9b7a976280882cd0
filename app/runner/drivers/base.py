"""What every model driver speaks: the model events a step streams, the `Turn` a
driver sees, and the `Driver` protocol."""

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    pass


@dataclass
class TextDelta:
    text: str


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class ToolCallStarted:
    """A tool call began streaming: its part exists from here, its arguments follow as
    `ToolInputDelta`s, and a `ToolCall` with the same id completes it."""

    id: str
    name: str


@dataclass
class ToolInputDelta:
    id: str
    text: str


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    # Set when the streamed arguments were not a JSON object: the tool fails without
    # running (`arguments` is then empty).
    error: str | None = None


@dataclass
class Retrying:
    """The model request failed and is tried again (or not: `will_retry`). Whatever the
    step streamed before is void: the step starts over."""

    attempt: int
    max_attempts: int
    code: str
    message: str
    will_retry: bool
    delay_ms: int


@dataclass
class Annotations:
    """Citations for the text streamed so far in this step."""

    items: list[dict[str, Any]]


@dataclass
class StepFinish:
    phase: str = "final_answer"
    usage: dict[str, Any] = field(default_factory=dict)


ModelEvent = (
    TextDelta
    | ReasoningDelta
    | ToolCallStarted
    | ToolInputDelta
    | ToolCall
    | Retrying
    | Annotations
    | StepFinish
)


class ModelError(Exception):
    """The model failed mid-stream; the runner persists an error part and fails the turn."""


@dataclass
class Turn:
    """What a driver sees: the conversation so far (wire messages, oldest first), the
    step number within the turn, and tool results of the previous step. `model_input`
    is the same history composed for the model (app/runner/composer.py: Chat
    Completions messages, system prompt first, fitted to the context budget) and
    `tools` the tool definitions offered to it; the scripted driver reads only the
    wire messages, but the runner composes for every driver."""

    messages: Sequence[dict[str, Any]]
    iteration: int
    tool_results: list[dict[str, Any]]
    model_input: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    # The provider's name of the model selected from the catalog (None: the
    # driver's configured one).
    model: str | None = None


class Driver(Protocol):
    name: str

    def step(self, turn: Turn) -> AsyncGenerator[ModelEvent, None]: ...

    async def summarize(self, messages: list[dict[str, Any]]) -> str:
        """A summary of the conversation in `messages` (Chat Completions messages
        from the Composer's `summary_request`, the instruction last)."""
        ...
