"""The scripted driver, the default: deterministic and offline, with scenarios that
exercise every part type."""

import asyncio
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

from app.runner.drivers.base import (
    Annotations,
    ModelError,
    ModelEvent,
    ReasoningDelta,
    StepFinish,
    TextDelta,
    ToolCall,
    Turn,
)
from app.wire import utf16_len

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


def latest_user_text(messages: Sequence[dict[str, Any]]) -> str:
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


def call_id(messages: Sequence[dict[str, Any]], name: str) -> str:
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


class Pace:
    """A provider's pace: a step's chunk i is due `delay` x i after its first was asked
    for, however long its reader took over the ones before (a reader that fell behind
    finds the next chunks waiting, as it would with a hosted model)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.due: float | None = None

    async def next(self) -> None:
        if self.delay <= 0:
            return
        now = asyncio.get_running_loop().time()
        self.due = (now if self.due is None else self.due) + self.delay
        await asyncio.sleep(max(0.0, self.due - now))


USAGE = (
    "Scenarios: /scenario echo TEXT, tool [QUERY], call NAME JSON, reasoning,"
    " citations, fail, long [N]."
)


class ScriptedDriver:
    """Offline and deterministic. `/scenario NAME [args]` picks a scenario; any other
    text is echoed back word by word. Scenarios: echo, tool, call NAME JSON,
    reasoning, citations, fail, long N."""

    name = "scripted"

    def __init__(self, delay_ms: int) -> None:
        self.delay = delay_ms / 1000

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

    async def _words(self, text: str, pace: Pace) -> AsyncIterator[ModelEvent]:
        words = text.split(" ")
        for index, word in enumerate(words):
            await pace.next()
            yield TextDelta(word if index == len(words) - 1 else word + " ")

    async def step(self, turn: Turn) -> AsyncGenerator[ModelEvent, None]:
        pace = Pace(self.delay)
        text = latest_user_text(turn.messages)
        match = SCENARIO.match(text)
        scenario, args = (
            (match.group(1), (match.group(2) or "").strip())
            if match
            else ("echo", text)
        )
        if scenario == "tool":
            if turn.iteration == 1:
                async for event in self._words("Let me look that up.", pace):
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
                async for event in self._words(f"The lookup returned {result}.", pace):
                    yield event
                yield StepFinish()
        elif scenario == "call":
            request = call_request(args)
            if isinstance(request, str):
                async for event in self._words(request, pace):
                    yield event
                yield StepFinish()
            elif turn.iteration == 1:
                name, arguments = request
                async for event in self._words(f"Calling {name}.", pace):
                    yield event
                yield ToolCall(
                    id=call_id(turn.messages, name), name=name, arguments=arguments
                )
                yield StepFinish(phase="commentary")
            else:
                async for event in self._words(
                    tool_outcome(request[0], turn.tool_results), pace
                ):
                    yield event
                yield StepFinish()
        elif scenario == "reasoning":
            for chunk in ("Thinking ", "about ", "the ", "question."):
                await pace.next()
                yield ReasoningDelta(chunk)
            async for event in self._words("Here is a considered answer.", pace):
                yield event
            yield StepFinish()
        elif scenario == "citations":
            body = "The control plane owns durable state."
            async for event in self._words(body, pace):
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
            async for event in self._words("Starting an answer that will not", pace):
                yield event
            raise ModelError("The scripted model failed mid-stream")
        elif scenario == "long":
            count = long_count(args)
            for index in range(count):
                await pace.next()
                yield TextDelta(f"chunk{index} ")
            yield StepFinish()
        else:
            said = args if match else text
            if match and scenario != "echo":
                said = f"Unknown scenario {scenario!r}. {USAGE}"
            elif not said.strip():
                said = f"Nothing to echo. {USAGE}"
            async for event in self._words(said, pace):
                yield event
            yield StepFinish()
