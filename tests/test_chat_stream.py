"""The Chat Completions stream reader: events split however the bytes arrive, the
provider's failures as the `openai` package's errors, a stream cut before its end, and
a deadline between chunks that a drip of bytes does not reset."""

import asyncio
import time
from collections.abc import AsyncIterator

import httpx2
import openai
import pytest

from app.runner.drivers.chat_stream import chunks, events


async def pieces(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def collect(*parts: bytes) -> list[bytes]:
    return [data async for data in events(pieces(*parts))]


async def test_events_are_whole_however_the_bytes_are_cut() -> None:
    body = b'data: {"a":1}\n\ndata: {"b":2}\n\n: a comment\n\ndata:[DONE]\n\n'
    whole = await collect(body)
    assert whole == [b'{"a":1}', b'{"b":2}', b"[DONE]"]
    for size in (1, 2, 3, 7, 16):
        cut = [body[i : i + size] for i in range(0, len(body), size)]
        assert await collect(*cut) == whole


async def test_crlf_multiline_data_other_fields_and_an_unterminated_last_event() -> (
    None
):
    body = b"event: x\r\nid: 3\r\ndata: one\r\ndata: two\r\n\r\ndata: last"
    assert await collect(body) == [b"one\ntwo", b"last"]


async def test_a_long_line_in_many_pieces() -> None:
    line = b"data: " + b"x" * 100_000 + b"\n\n"
    cut = [line[i : i + 1000] for i in range(0, len(line), 1000)]
    assert await collect(*cut) == [b"x" * 100_000]


def response(body: bytes) -> httpx2.Response:
    request = httpx2.Request("POST", "http://provider/v1/chat/completions")
    return httpx2.Response(200, content=body, request=request)


async def test_chunks_end_at_done_and_skip_what_is_not_an_object() -> None:
    body = b'data: {"a":1}\n\ndata: [1]\n\ndata: [DONE]\n\ndata: {"late":1}\n\n'
    assert [c async for c in chunks(response(body), 5)] == [{"a": 1}]


async def drain(body: bytes, seen: list[dict[str, object]]) -> None:
    async for chunk in chunks(response(body), 5):
        seen.append(chunk)


FINISHED = b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n'


async def test_a_stream_cut_before_its_end_is_an_api_error() -> None:
    """No `[DONE]` and no finished choice: cut, or not a stream at all (an HTML page
    answered 200). A finished choice without `[DONE]` is a whole reply."""
    seen: list[dict[str, object]] = []
    with pytest.raises(openai.APIError, match="ended before its end"):
        await drain(b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n', seen)
    assert len(seen) == 1
    with pytest.raises(openai.APIError, match="ended before its end"):
        await drain(b"<html><body>Welcome</body></html>", [])
    seen.clear()
    await drain(FINISHED, seen)
    assert len(seen) == 1


class Dripping(httpx2.AsyncByteStream):
    """A byte of an event that never ends, every `pause` seconds."""

    def __init__(self, pause: float) -> None:
        self.pause = pause

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
        while True:
            await asyncio.sleep(self.pause)
            yield b"d"


async def test_a_provider_dripping_bytes_times_out_between_chunks() -> None:
    """Every read of the drip is quick; the next chunk never comes: a timeout after
    `idle_seconds` from the step asking for it, not from the last byte."""
    request = httpx2.Request("POST", "http://provider/v1/chat/completions")
    dripping = httpx2.Response(200, stream=Dripping(0.02), request=request)
    seen: list[dict[str, object]] = []

    async def slow_step() -> None:
        async for chunk in chunks(dripping, 0.3):
            seen.append(chunk)
            # The step's own time with a chunk is not counted against the provider.
            await asyncio.sleep(0.4)

    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        await slow_step()
    assert len(seen) == 1
    assert 0.65 <= time.monotonic() - started < 3


async def test_an_error_object_mid_stream_is_the_packages_api_error() -> None:
    body = b'data: {"a":1}\n\ndata: {"error":{"message":"overloaded"}}\n\n'
    seen: list[dict[str, object]] = []
    with pytest.raises(openai.APIError, match="overloaded") as raised:
        await drain(body, seen)
    assert seen == [{"a": 1}]
    assert raised.value.body == {"message": "overloaded"}


async def test_a_chunk_that_is_not_json_is_an_api_error() -> None:
    with pytest.raises(openai.APIError, match="not JSON"):
        await drain(b"data: {nope\n\n", [])


async def test_bytes_that_are_not_utf8_are_an_api_error() -> None:
    """A chunk with bytes that are not UTF-8 is a failed attempt, not the runner's
    internal error."""
    body = b'data: {"choices":[{"delta":{"content":"\xff\xfe"}}]}\n\n'
    with pytest.raises(openai.APIError, match="not JSON"):
        await drain(body, [])
