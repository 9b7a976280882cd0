"""A Chat Completions event stream, read as plain data.

The body's bytes (`provider.Provider.stream`) are split into server-sent events and
each chunk is decoded once, with orjson, into the dicts the driver reads a handful of
fields from: a client library's model object per chunk costs more than everything else
a token's way to its watchers does.

Failures while reading are `ProviderError`s, as the request's are, so the driver
retries them alike: an `error` object in the stream (the provider failed mid-answer),
a chunk that is not JSON or not of the shape read, a stream cut before its end, a
timeout, a dropped connection.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from app.runner.drivers.provider import stream_failed, timed_out

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
    body: AsyncIterator[bytes], idle_seconds: float
) -> AsyncIterator[dict[str, Any]]:
    """Each chunk of a streamed completion, decoded, until `[DONE]`.

    Each chunk must arrive within `idle_seconds` of the step asking for it (else a
    timeout): a deadline per read would let a provider dripping a byte now and then
    reset it forever. A stream that ends without `[DONE]` and without a chunk that
    finished the choice was cut (or was never a stream: an HTML page answered 200),
    and is a provider failure, tried again, not a complete reply."""
    loop = asyncio.get_running_loop()
    deadline = _Deadline(loop.time() + idle_seconds)
    finished = False
    try:
        async for data in events(_until(body, deadline)):
            if data == DONE:
                return
            chunk = orjson.loads(data)
            if not isinstance(chunk, dict):
                continue
            error = chunk.get("error")
            if error:
                message = error.get("message") if isinstance(error, dict) else None
                raise stream_failed(str(message or error))
            malformed = _malformed(chunk)
            if malformed is not None:
                raise stream_failed(f"a malformed chunk ({malformed})")
            choices = chunk.get("choices")
            if choices and choices[0].get("finish_reason"):
                finished = True
            yield chunk
            # The provider's time to the next chunk starts when it is asked for: the
            # time the step took with this one is not the provider's.
            deadline.at = loop.time() + idle_seconds
    except TimeoutError as exc:
        raise timed_out() from exc
    except orjson.JSONDecodeError as exc:
        raise stream_failed(f"a chunk of the stream is not JSON ({exc})") from exc
    if not finished:
        raise stream_failed(
            "the stream ended before its end (no [DONE], no finish_reason)"
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
