"""Model drivers turn a conversation into a stream of model events. `scripted` is the
default: deterministic and offline, with scenarios that exercise every part type."""

import asyncio
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from app.wire import utf16_len

if TYPE_CHECKING:
    from app.settings import Settings


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

    messages: list[dict[str, Any]]
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


SCENARIO = re.compile(r"^/scenario\s+(\w+)(?:\s+(.*))?$", re.DOTALL)


# `/scenario long N`: N deltas, 100 unless N is a number, at most this many.
LONG_DEFAULT = 100
LONG_MAX = 1_000_000


def long_count(args: str) -> int:
    """N of `/scenario long N`. Only ASCII digits make a number: `str.isdigit` also
    takes `²` (which `int()` refuses) and other scripts' digits. A longer number is
    capped before `int()`, which refuses to parse over 4,300 digits."""
    if not (args.isascii() and args.isdigit()):
        return LONG_DEFAULT
    digits = args.lstrip("0") or "0"
    return LONG_MAX if len(digits) > 7 else min(int(digits), LONG_MAX)


def latest_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message["role"] == "user":
            return " ".join(
                p.get("text", "") for p in message["content"] if p["type"] == "text"
            ).strip()
    return ""


CALL_ARGS = re.compile(r"^([A-Za-z0-9_-]{1,64})(?:\s+(.*))?$", re.DOTALL)


def call_request(args: str) -> tuple[str, dict[str, Any]] | str:
    """`/scenario call <tool_name> [json object]`: the tool and its arguments, or why
    the request cannot be made."""
    match = CALL_ARGS.match(args)
    if match is None:
        return "Usage: /scenario call <tool_name> <json arguments>"
    try:
        arguments = json.loads(match.group(2) or "{}")
    except ValueError:
        return "The arguments of /scenario call must be a JSON object."
    if not isinstance(arguments, dict):
        return "The arguments of /scenario call must be a JSON object."
    return match.group(1), arguments


def call_id(messages: list[dict[str, Any]], name: str) -> str:
    """A tool call id unique to the user message that asked for the call (client-side
    results are posted by it), stable across a resumed turn."""
    for message in reversed(messages):
        if message["role"] == "user":
            return f"call_{name}_{message['id'].rpartition('_')[2][:12]}"
    return f"call_{name}_1"


def tool_outcome(name: str, results: list[dict[str, Any]]) -> str:
    """What the scripted model says a tool returned."""
    if not results:
        return f"The {name} tool returned nothing."
    first = results[0]
    if first.get("error") is not None:
        return f"The {name} tool failed: {first['error']}"
    return f"The {name} tool returned {json.dumps(first.get('result'))}."


class ScriptedDriver:
    """Offline and deterministic. `/scenario NAME [args]` picks a scenario; any other
    text is echoed back word by word. Scenarios: echo, tool, call NAME JSON,
    reasoning, citations, fail, long N."""

    name = "scripted"

    def __init__(self, delay_ms: int) -> None:
        self.delay = delay_ms / 1000

    async def _pause(self) -> None:
        if self.delay > 0:
            await asyncio.sleep(self.delay)

    async def summarize(self, messages: list[dict[str, Any]]) -> str:
        """Deterministic: how many messages, and the start of each user message."""
        said = [
            m["content"][:80]
            for m in messages[:-1]
            if m["role"] == "user" and isinstance(m["content"], str)
        ]
        return f"{len(messages) - 1} earlier messages; the user said: " + " | ".join(
            said
        )

    async def _words(self, text: str) -> AsyncIterator[ModelEvent]:
        words = text.split(" ")
        for index, word in enumerate(words):
            await self._pause()
            yield TextDelta(word if index == len(words) - 1 else word + " ")

    async def step(self, turn: Turn) -> AsyncGenerator[ModelEvent, None]:
        text = latest_user_text(turn.messages)
        match = SCENARIO.match(text)
        scenario, args = (
            (match.group(1), (match.group(2) or "").strip())
            if match
            else ("echo", text)
        )
        if scenario == "tool":
            if turn.iteration == 1:
                async for event in self._words("Let me look that up."):
                    yield event
                yield ToolCall(
                    id="call_lookup_1",
                    name="lookup",
                    arguments={"query": args or "the answer"},
                )
                yield StepFinish(phase="commentary")
            else:
                result = (
                    json.dumps(turn.tool_results[0].get("result"))
                    if turn.tool_results
                    else "nothing"
                )
                async for event in self._words(f"The lookup returned {result}."):
                    yield event
                yield StepFinish()
        elif scenario == "call":
            request = call_request(args)
            if isinstance(request, str):
                async for event in self._words(request):
                    yield event
                yield StepFinish()
            elif turn.iteration == 1:
                name, arguments = request
                async for event in self._words(f"Calling {name}."):
                    yield event
                yield ToolCall(
                    id=call_id(turn.messages, name), name=name, arguments=arguments
                )
                yield StepFinish(phase="commentary")
            else:
                async for event in self._words(
                    tool_outcome(request[0], turn.tool_results)
                ):
                    yield event
                yield StepFinish()
        elif scenario == "reasoning":
            for chunk in ("Thinking ", "about ", "the ", "question."):
                await self._pause()
                yield ReasoningDelta(chunk)
            async for event in self._words("Here is a considered answer."):
                yield event
            yield StepFinish()
        elif scenario == "citations":
            body = "The control plane owns durable state."
            async for event in self._words(body):
                yield event
            yield Annotations(
                [
                    {
                        # Text offsets count UTF-16 code units, as deltas do.
                        "start": 0,
                        "end": utf16_len(body),
                        "origin": "citation_retrieval",
                        "source": {
                            "uri": "https://example.com/architecture",
                            "title": "Architecture Overview",
                        },
                        "verified": {"status": "entailed", "score": 0.92},
                    }
                ]
            )
            yield StepFinish()
        elif scenario == "fail":
            async for event in self._words("Starting an answer that will not"):
                yield event
            raise ModelError("The scripted model failed mid-stream")
        elif scenario == "long":
            count = long_count(args)
            for index in range(count):
                await self._pause()
                yield TextDelta(f"chunk{index} ")
            yield StepFinish()
        else:
            async for event in self._words(args if match else text):
                yield event
            yield StepFinish()


# The built-in tools, offered to real models as Chat Completions function tools.
BUILTIN_TOOLS: list[dict[str, Any]] = [
    {
        "type": "builtin",
        "name": "lookup",
        "description": "Look a question up in the service's built-in knowledge base.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "The question"}},
            "required": ["query"],
        },
    }
]


async def run_tool(name: str, arguments: dict[str, Any]) -> Any:
    """The built-in tools the scripted scenarios call."""
    if name == "lookup":
        return {"query": arguments.get("query"), "answer": 42}
    raise ModelError(f"unknown tool {name}")


def create_driver(settings: "Settings", name: str | None = None) -> Driver:
    """The driver `name` (MODEL_DRIVER's when None), configured from `settings`."""
    name = name or settings.model_driver
    if name == "scripted":
        return ScriptedDriver(settings.scripted_delay_ms)
    if name == "openai":
        # Imported here: the scripted default never loads the openai package.
        from app.runner.openai_driver import OpenAIDriver

        return OpenAIDriver(settings)
    raise ValueError(f"unknown model driver {name!r}")
