"""A Chat Completions event stream, read as plain data.

The `openai` package turns every streamed chunk into a model object, which costs more
than everything else a token's way to its watchers does. Here the stream's bytes are
split into server-sent events and each chunk is decoded once, with orjson, into the
dicts the driver reads a handful of fields from. The `openai` package still makes the
request: configuration, authentication and its errors (a failed status raises before
the first byte is read here).

Failures while reading become the `openai` package's errors, so the driver classifies
them as it does the request's: an `error` object in the stream (the provider failed
mid-answer), a timeout, a dropped connection.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
import orjson

DONE = b"[DONE]"


async def events(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The `data` of each event of a text/event-stream body (lines end in LF or CRLF;
    several `data` lines of one event are joined with LF; other fields and comments
    are skipped)."""
    held: list[bytes] = []
    data: list[bytes] = []
    async for piece in body:
        if b"\n" not in piece:
            # Part of a long line: joined once its end arrives (linear in its length).
            held.append(piece)
            continue
        if held:
            held.append(piece)
            piece = b"".join(held)
            held = []
        lines = piece.split(b"\n")
        rest = lines.pop()
        if rest:
            held.append(rest)
        for line in lines:
            if line[-1:] == b"\r":
                line = line[:-1]
            if not line:
                if data:
                    yield data[0] if len(data) == 1 else b"\n".join(data)
                    data = []
            elif line[:5] == b"data:":
                data.append(line[6:] if line[5:6] == b" " else line[5:])
    # A body that ends without its last blank line still ends its last event.
    last = b"".join(held).rstrip(b"\r")
    if last[:5] == b"data:":
        data.append(last[6:] if last[5:6] == b" " else last[5:])
    if data:
        yield b"\n".join(data)


async def chunks(
    response: httpx2.Response, idle_seconds: float
) -> AsyncIterator[dict[str, Any]]:
    """Each chunk of a streamed completion, decoded, until `[DONE]`.

    Each chunk must arrive within `idle_seconds` of the step asking for it (else a
    timeout): the client's read timeout is per read, so a provider dripping a byte now
    and then would reset it forever. A stream that ends without `[DONE]` and without a chunk that
    finished the choice was cut (or was never a stream: an HTML page answered 200),
    and is a provider failure, tried again, not a complete reply."""
    loop = asyncio.get_running_loop()
    deadline = _Deadline(loop.time() + idle_seconds)
    finished = False
    try:
        async for data in events(_until(response.aiter_bytes(), deadline)):
            if data == DONE:
                return
            chunk = orjson.loads(data)
            if not isinstance(chunk, dict):
                continue
            error = chunk.get("error")
            if error:
                message = error.get("message") if isinstance(error, dict) else None
                raise openai.APIError(
                    str(message or error)[:MAX_ERROR_CHARS],
                    response.request,
                    body=error,
                )
            malformed = _malformed(chunk)
            if malformed is not None:
                raise openai.APIError(
                    f"a malformed chunk ({malformed})", response.request, body=None
                )
            choices = chunk.get("choices")
            if choices and choices[0].get("finish_reason"):
                finished = True
            yield chunk
            # The provider's time to the next chunk starts when it is asked for: the
            # time the step took with this one is not the provider's.
            deadline.at = loop.time() + idle_seconds
    except TimeoutError as exc:
        raise openai.APITimeoutError(response.request) from exc
    except httpx2.TimeoutException as exc:
        raise openai.APITimeoutError(response.request) from exc
    except httpx2.TransportError as exc:
        raise openai.APIConnectionError(request=response.request) from exc
    except orjson.JSONDecodeError as exc:
        raise openai.APIError(
            f"a chunk of the stream is not JSON ({exc})", response.request, body=None
        ) from exc
    if not finished:
        raise openai.APIError(
            "the stream ended before its end (no [DONE], no finish_reason)",
            response.request,
            body=None,
        )


class _Deadline:
    """When the next chunk is due (the loop's clock)."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at


async def _until(
    body: AsyncIterator[bytes], deadline: _Deadline
) -> AsyncIterator[bytes]:
    """The body's pieces, each read by `deadline.at` (TimeoutError otherwise). The
    timeout covers the read only, never the consumer's work between pieces."""
    pieces = aiter(body)
    while True:
        async with asyncio.timeout_at(deadline.at):
            try:
                piece = await anext(pieces)
            except StopAsyncIteration:
                return
        yield piece


# How much of a provider's error message is kept (stored in the error part, logged).
MAX_ERROR_CHARS = 1_000

_OPTIONAL_TEXT = (str, type(None))


def _malformed(chunk: dict[str, Any]) -> str | None:
    """What in `chunk` is not of the type the driver reads it as, if anything: the
    step then fails as a provider error (retried), not as the runner's."""
    if not isinstance(chunk.get("usage"), dict | None):
        return "usage is not an object"
    choices = chunk.get("choices")
    if not choices:
        return None
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        return "choices is not a list of objects"
    delta = choices[0].get("delta")
    if delta is None:
        return None
    if not isinstance(delta, dict):
        return "delta is not an object"
    for key in ("content", "reasoning_content", "reasoning"):
        if not isinstance(delta.get(key), _OPTIONAL_TEXT):
            return f"delta.{key} is not a string"
    calls = delta.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list):
        return "delta.tool_calls is not a list"
    for call in calls:
        if not isinstance(call, dict):
            return "a tool call is not an object"
        index, ids = call.get("index"), call.get("id")
        if not isinstance(index, int | None) or isinstance(index, bool):
            return "a tool call's index is not an integer"
        if not isinstance(ids, str | int | None) or isinstance(ids, bool):
            return "a tool call's id is not a string"
        function = call.get("function")
        if function is None:
            continue
        if not isinstance(function, dict):
            return "a tool call's function is not an object"
        for key in ("name", "arguments"):
            if not isinstance(function.get(key), _OPTIONAL_TEXT):
                return f"a tool call's function.{key} is not a string"
    return None
