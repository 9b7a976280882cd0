"""The `openai` driver: streaming Chat Completions, the protocol of OpenAI and of every
server that speaks it (vLLM, Ollama, llama.cpp server, LM Studio, OpenRouter).

It sends what the Composer made (`Turn.model_input`) over `provider.Provider` and reads
the streamed chunks as plain data (`chat_stream`), turning them into model events: text
and reasoning deltas (`reasoning_content` or `reasoning`, as compatible servers name
it), tool calls whose arguments stream as they arrive, and the usage of the step
(`stream_options.include_usage`).

Failed attempts are retried here: 408, 409, 429, 5xx, timeouts, dropped connections
and streams that fail mid-answer are tried again up to `MODEL_MAX_RETRIES` times with
exponential backoff, or after the provider's `Retry-After`, and each retry is an event
(`Retrying`) the runner announces live. A request that cannot succeed (400, 401, 403,
404, 422, a redirect) is not retried. Closing the step's generator (the runner does on
cancel) closes the connection at once: nothing more is generated for a cancelled turn.
"""

import asyncio
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.runner.composer import tool_definitions
from app.runner.drivers import chat_stream
from app.runner.drivers.base import (
    ModelError,
    ModelEvent,
    ReasoningDelta,
    Retrying,
    StepFinish,
    TextDelta,
    ToolCall,
    ToolCallStarted,
    ToolInputDelta,
    Turn,
)
from app.runner.drivers.provider import Provider, ProviderError, stream_failed
from app.settings import Settings

log = logging.getLogger("app.runner.openai")

# Backoff between attempts: 0.5 s, 1 s, 2 s ... capped, with jitter; a Retry-After is
# honoured up to the cap.
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 30.0


@dataclass
class _Call:
    """A tool call being assembled from its chunks (keyed by the chunk's `index`)."""

    id: str
    name: str
    arguments: str = ""
    announced: bool = False


@dataclass
class _Attempt:
    """What one request streamed: whether anything was yielded, the calls so far."""

    calls: dict[int, _Call] = field(default_factory=dict)
    streamed: bool = False
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    # Characters of text, reasoning and tool arguments streamed.
    chars: int = 0


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Upstream's TokenUsage from Chat Completions usage: prompt buckets disjoint, so
    cached reads are subtracted from the prompt count (OpenAI's includes them)."""
    prompt = token_count(usage.get("prompt_tokens"))
    out: dict[str, Any] = {
        "input_tokens": prompt,
        "output_tokens": token_count(usage.get("completion_tokens")),
    }
    details = usage.get("prompt_tokens_details")
    cached = (
        token_count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    )
    if cached:
        out["input_tokens"] = max(0, prompt - cached)
        out["cache_read_tokens"] = cached
    cost = usage.get("cost")
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        out["actual_cost_usd"] = float(cost)
    return out


# A token count past this is not a count: the provider's usage field is ignored.
MAX_TOKEN_COUNT = 2**31 - 1


def token_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return int(value) if 0 < value <= MAX_TOKEN_COUNT else 0


def _reasoning(delta: dict[str, Any]) -> str | None:
    for key in ("reasoning_content", "reasoning"):
        value = delta.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def backoff(failure: ProviderError, attempt: int, jitter: bool = True) -> float:
    """Seconds before the attempt after `attempt`: the provider's Retry-After, else
    exponential from BACKOFF_BASE_SECONDS (jittered by ±20 %), capped."""
    if failure.after is not None:
        return min(failure.after, BACKOFF_CAP_SECONDS)
    delay: float = BACKOFF_BASE_SECONDS * 2.0 ** (attempt - 1)
    if jitter:
        delay *= 0.8 + 0.4 * random.random()
    return min(delay, BACKOFF_CAP_SECONDS)


class OpenAIDriver:
    name = "openai"

    def __init__(self, settings: Settings) -> None:
        self.model = settings.openai_model or ""
        self.max_retries = settings.model_max_retries
        self.timeout_seconds = settings.model_timeout_seconds
        self.max_reply_chars = settings.model_max_reply_chars
        self.max_tool_calls = settings.model_max_tool_calls
        if not settings.openai_base_url:
            raise ValueError("OPENAI_BASE_URL is required by the openai driver")
        self.provider = Provider(
            settings.openai_base_url,
            settings.openai_api_key,
            settings.model_timeout_seconds,
        )

    async def aclose(self) -> None:
        await self.provider.aclose()

    def _request(self, turn: Turn) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": turn.model or self.model,
            "messages": turn.model_input,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        tools = tool_definitions(turn.tools)
        if tools:
            body["tools"] = tools
        return body

    async def summarize(self, messages: list[dict[str, Any]]) -> str:
        """One non-streaming request, retried as a step's would be (silently: it is
        not part of any message)."""
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                answer = await self.provider.complete(
                    {"model": self.model, "messages": messages}
                )
                return _summary_text(answer)
            except ProviderError as failure:
                log.warning("summary request failed (%s): %s", failure.code, failure)
                if not failure.retryable or attempt == attempts:
                    raise ModelError(str(failure)) from failure
                await asyncio.sleep(backoff(failure, attempt, jitter=False))
        raise ModelError("no summary")

    async def step(self, turn: Turn) -> AsyncGenerator[ModelEvent, None]:
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            state = _Attempt()
            try:
                async for event in self._attempt(turn, state):
                    yield event
            except ProviderError as failure:
                will_retry = failure.retryable and attempt < attempts
                delay = backoff(failure, attempt) if will_retry else 0.0
                log.warning(
                    "model request failed (%s, attempt %d of %d)%s: %s",
                    failure.code,
                    attempt,
                    attempts,
                    f"; retried in {delay:.1f} s" if will_retry else "",
                    failure,
                )
                if failure.retryable or attempt > 1:
                    yield Retrying(
                        attempt=attempt,
                        max_attempts=attempts,
                        code=failure.code,
                        message=str(failure),
                        will_retry=will_retry,
                        delay_ms=int(delay * 1000),
                    )
                if not will_retry:
                    raise ModelError(str(failure)) from failure
                await asyncio.sleep(delay)
                continue
            return

    async def _attempt(self, turn: Turn, state: _Attempt) -> AsyncIterator[ModelEvent]:
        # Closed however the step ends: read to its end, failed, or closed by the runner
        # (a cancel), which stops the provider generating at once.
        async with self.provider.stream(self._request(turn)) as body:
            async for chunk in chat_stream.chunks(body, self.timeout_seconds):
                usage = chunk.get("usage")
                if isinstance(usage, dict):
                    state.usage = _usage(usage)
                choices = chunk.get("choices")
                if not choices:
                    continue
                choice = choices[0]
                delta = choice.get("delta") or {}
                reasoning = _reasoning(delta)
                if reasoning:
                    state.streamed = True
                    self._count(state, len(reasoning))
                    yield ReasoningDelta(reasoning)
                content = delta.get("content")
                if content:
                    state.streamed = True
                    self._count(state, len(content))
                    yield TextDelta(content)
                for fragment in delta.get("tool_calls") or ():
                    async for event in self._fragment(state, fragment):
                        yield event
                if choice.get("finish_reason"):
                    state.finish_reason = choice["finish_reason"]
        for index in sorted(state.calls):
            call = state.calls[index]
            if not call.announced:
                yield ToolCallStarted(call.id, call.name)
            yield _parsed(call)
        if state.finish_reason == "length":
            log.info("model reply cut at the length limit")
        yield StepFinish(
            phase="commentary" if state.calls else "final_answer", usage=state.usage
        )

    def _count(self, state: _Attempt, chars: int) -> None:
        """Characters the step streamed; past the cap the step stops here."""
        state.chars += chars
        if state.chars > self.max_reply_chars:
            raise ModelError(
                f"The model's reply passed {self.max_reply_chars:,} characters in one"
                " step (MODEL_MAX_REPLY_CHARS)"
            )

    async def _fragment(
        self, state: _Attempt, fragment: dict[str, Any]
    ) -> AsyncIterator[ModelEvent]:
        index = fragment.get("index")
        if not isinstance(index, int):
            index = len(state.calls)
        function = fragment.get("function") or {}
        call = state.calls.get(index)
        if call is None:
            if len(state.calls) >= self.max_tool_calls:
                raise ModelError(
                    f"The model asked for more than {self.max_tool_calls} tool calls"
                    " in one step (MODEL_MAX_TOOL_CALLS)"
                )
            call = state.calls[index] = _Call(id=_call_id(fragment, state), name="")
        name = function.get("name")
        if name:
            call.name += name
        if not call.announced and call.name:
            call.announced = True
            state.streamed = True
            yield ToolCallStarted(call.id, call.name)
        arguments = function.get("arguments")
        if arguments:
            self._count(state, len(arguments))
            call.arguments += arguments
            if call.announced:
                yield ToolInputDelta(call.id, arguments)


def _call_id(fragment: dict[str, Any], state: _Attempt) -> str:
    """The call's id as the provider gave it when that is a usable one: a non-empty
    string (a number is taken as its digits) of at most 255 characters, not already an
    id of the step's other calls. Anything else gets an id of ours: clients answer a
    call by its id, and two calls with one id could not both be answered."""
    given = fragment.get("id")
    if isinstance(given, int) and not isinstance(given, bool):
        given = str(given)
    taken = {call.id for call in state.calls.values()}
    if isinstance(given, str) and 0 < len(given) <= 255 and given not in taken:
        return given
    return f"call_{random.getrandbits(96):024x}"


def _parsed(call: _Call) -> ToolCall:
    text = call.arguments.strip() or "{}"
    try:
        # orjson, not json: it refuses what could not be stored or published again
        # (lone surrogates; numbers past a double), and reads integers past 64 bits
        # as floats.
        arguments = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return ToolCall(
            call.id,
            call.name,
            {},
            error=f"The tool's arguments are not valid JSON ({exc.msg} at character {exc.pos})",
        )
    if not isinstance(arguments, dict):
        return ToolCall(
            call.id, call.name, {}, error="The tool's arguments are not a JSON object"
        )
    return ToolCall(call.id, call.name, arguments)


def _summary_text(answer: Any) -> str:
    """The text of a non-streamed answer's first choice."""
    try:
        content = answer["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise stream_failed(f"an answer without a message ({exc!r})") from exc
    if not isinstance(content, str | None):
        raise stream_failed("an answer whose message content is not text")
    return (content or "").strip()
