"""The `openai` driver: streaming Chat Completions through the official `openai` package,
so it talks to OpenAI and to every server that speaks that protocol (vLLM, Ollama,
llama.cpp server, LM Studio, OpenRouter).

It sends what the Composer made (`Turn.model_input`) and reads the streamed chunks as
plain data (`chat_stream`: the package's per-chunk model objects cost more than the
rest of a token's way to its watchers), turning them into model events: text and reasoning deltas (`reasoning_content` or `reasoning`, as compatible
servers name it), tool calls whose arguments stream as they arrive, and the usage of
the step (`stream_options.include_usage`).

Retries are this driver's, not the client library's (its `max_retries` is 0): 429,
5xx, timeouts and dropped connections are tried again up to `MODEL_MAX_RETRIES` times
with exponential backoff, or after the provider's `Retry-After`, and each retry is an
event (`Retrying`) the runner announces live. A request that cannot succeed (400, 401,
403, 404, 422) is not retried. Closing the step's generator (the runner does on cancel)
closes the HTTP response at once: nothing more is generated for a cancelled turn.
"""

import asyncio
import logging
import random
import re
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, cast

import httpx2
import openai
import orjson
from openai.types.chat import ChatCompletion

from app.db.types import utcnow
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
from app.settings import Settings

log = logging.getLogger("app.runner.openai")

# Backoff between attempts: 0.5 s, 1 s, 2 s ... capped, with jitter; a Retry-After is
# honoured up to the cap.
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 30.0
RETRIED_STATUSES = frozenset({408, 409, 429})


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


class ProviderError(Exception):
    """A failed request: its status (or kind) and whether another attempt may succeed."""

    def __init__(
        self, code: str, message: str, retryable: bool, after: float | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable
        self.after = after


# How much of an error answer's body is read (its message is kept to 1,000 characters).
MAX_ERROR_BODY_BYTES = 64 * 1024


async def _cap_error_body(response: httpx2.Response) -> None:
    """An error answer's body, read up to MAX_ERROR_BODY_BYTES before the `openai`
    package reads and parses it: a provider, or a proxy in front of one, answering
    megabytes would otherwise be read into memory and parsed on the event loop."""
    if response.status_code < 400:
        return
    body = response.stream
    assert isinstance(body, httpx2.AsyncByteStream)
    kept = bytearray()
    async for piece in body:
        kept += piece
        if len(kept) >= MAX_ERROR_BODY_BYTES:
            break
    await body.aclose()
    response.stream = httpx2.ByteStream(bytes(kept[:MAX_ERROR_BODY_BYTES]))


# The start of an error's `message` in a body that is not whole JSON (cut at
# MAX_ERROR_BODY_BYTES): `{"error": {"message": "...`.
MESSAGE_TEXT = re.compile(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)')


def _message_in_text(body: Any) -> str | None:
    """An error message read from a body the `openai` package could not parse (it
    hands such a body over as text): the start of its `message`, else the text."""
    if not isinstance(body, str) or not body.strip():
        return None
    found = MESSAGE_TEXT.search(body)
    return found.group(1) if found else body.strip()


def _retry_after(headers: Any) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(value) - utcnow()).total_seconds())
    except (TypeError, ValueError):
        return None


def classify(exc: Exception) -> ProviderError:
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = status in RETRIED_STATUSES or status >= 500
        body = exc.body.get("error", exc.body) if isinstance(exc.body, dict) else None
        detail = (
            (body.get("message") if isinstance(body, dict) else None)
            or _message_in_text(exc.body)
            or exc.response.reason_phrase
        )
        # Stored in the error part and logged: a provider's page of HTML, or worse, is
        # cut to its start.
        detail = str(detail)[: chat_stream.MAX_ERROR_CHARS]
        return ProviderError(
            str(status),
            f"The model provider answered {status}: {detail}",
            retryable,
            _retry_after(exc.response.headers),
        )
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError(
            "timeout", "The model provider did not answer in time", True
        )
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return ProviderError(
            "connection_error",
            f"The connection to the model provider failed: {type(cause).__name__}",
            True,
        )
    if isinstance(exc, openai.APIError):
        # An `error` object inside the stream: the provider failed mid-answer.
        return ProviderError(
            "stream_error", f"The model provider failed: {exc.message}", True
        )
    raise exc


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


class OpenAIDriver:
    name = "openai"

    def __init__(self, settings: Settings) -> None:
        self.model = settings.openai_model or ""
        self.max_retries = settings.model_max_retries
        self.timeout_seconds = settings.model_timeout_seconds
        self.max_reply_chars = settings.model_max_reply_chars
        self.max_tool_calls = settings.model_max_tool_calls
        self.client = openai.AsyncOpenAI(
            base_url=settings.openai_base_url,
            # Local servers take any key; the client refuses to start without one.
            api_key=settings.openai_api_key or "none",
            timeout=settings.model_timeout_seconds,
            max_retries=0,
            # A redirect is an answer, not a hop: following one would send the
            # provider key to wherever it points.
            http_client=openai.DefaultAsyncHttpxClient(
                follow_redirects=False,
                event_hooks={"response": [_cap_error_body]},
            ),
        )

    async def aclose(self) -> None:
        await self.client.close()

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
                body: dict[str, Any] = {"model": self.model, "messages": messages}
                response = cast(
                    ChatCompletion, await self.client.chat.completions.create(**body)
                )
                return (response.choices[0].message.content or "").strip()
            except openai.APIError as exc:
                failure = classify(exc)
                log.warning("summary request failed (%s): %s", failure.code, failure)
                if not failure.retryable or attempt == attempts:
                    raise ModelError(str(failure)) from exc
                await asyncio.sleep(
                    min(
                        failure.after
                        if failure.after is not None
                        else BACKOFF_BASE_SECONDS * 2 ** (attempt - 1),
                        BACKOFF_CAP_SECONDS,
                    )
                )
        raise ModelError("no summary")

    async def step(self, turn: Turn) -> AsyncGenerator[ModelEvent, None]:
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            state = _Attempt()
            try:
                async for event in self._attempt(turn, state):
                    yield event
            except (openai.APIError, ModelError) as exc:
                if isinstance(exc, ModelError):
                    raise
                failure = classify(exc)
                will_retry = failure.retryable and attempt < attempts
                delay = (
                    min(
                        failure.after
                        if failure.after is not None
                        else BACKOFF_BASE_SECONDS
                        * 2 ** (attempt - 1)
                        * (0.8 + 0.4 * random.random()),
                        BACKOFF_CAP_SECONDS,
                    )
                    if will_retry
                    else 0.0
                )
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
                    raise ModelError(str(failure)) from exc
                await asyncio.sleep(delay)
                continue
            return

    async def _attempt(self, turn: Turn, state: _Attempt) -> AsyncIterator[ModelEvent]:
        request = self.client.chat.completions.with_streaming_response.create(
            **self._request(turn)
        )
        # Closed however the step ends: read to its end, failed, or closed by the runner
        # (a cancel), which stops the provider generating at once.
        async with request as response:
            async for chunk in chat_stream.chunks(
                response.http_response, self.timeout_seconds
            ):
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
