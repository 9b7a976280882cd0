"""The Chat Completions stream reader: events split however the bytes arrive, the
provider's failures as ProviderErrors the driver retries, a stream cut before its end,
and a deadline between chunks that a drip of bytes does not reset."""

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from app.runner.drivers.chat_stream import chunks, events
from app.runner.drivers.provider import ProviderError


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


async def test_chunks_end_at_done_and_skip_what_is_not_an_object() -> None:
    body = b'data: {"a":1}\n\ndata: [1]\n\ndata: [DONE]\n\ndata: {"late":1}\n\n'
    assert [c async for c in chunks(pieces(body), 5)] == [{"a": 1}]


async def drain(body: bytes, seen: list[dict[str, object]]) -> None:
    async for chunk in chunks(pieces(body), 5):
        seen.append(chunk)


FINISHED = b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n'


async def test_a_stream_cut_before_its_end_is_a_retried_failure() -> None:
    """No `[DONE]` and no finished choice: cut, or not a stream at all (an HTML page
    answered 200). A finished choice without `[DONE]` is a whole reply."""
    seen: list[dict[str, object]] = []
    with pytest.raises(ProviderError, match="ended before its end") as raised:
        await drain(b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n', seen)
    assert (raised.value.code, raised.value.retryable) == ("stream_error", True)
    assert len(seen) == 1
    with pytest.raises(ProviderError, match="ended before its end"):
        await drain(b"<html><body>Welcome</body></html>", [])
    seen.clear()
    await drain(FINISHED, seen)
    assert len(seen) == 1


async def dripping(pause: float) -> AsyncIterator[bytes]:
    """A byte of an event that never ends, every `pause` seconds."""
    yield b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
    while True:
        await asyncio.sleep(pause)
        yield b"d"


async def test_a_provider_dripping_bytes_times_out_between_chunks() -> None:
    """Every read of the drip is quick; the next chunk never comes: a timeout after
    `idle_seconds` from the step asking for it, not from the last byte."""
    seen: list[dict[str, object]] = []

    async def slow_step() -> None:
        async for chunk in chunks(dripping(0.02), 0.3):
            seen.append(chunk)
            # The step's own time with a chunk is not counted against the provider.
            await asyncio.sleep(0.4)

    started = time.monotonic()
    with pytest.raises(ProviderError) as raised:
        await slow_step()
    assert raised.value.code == "timeout"
    assert len(seen) == 1
    assert 0.65 <= time.monotonic() - started < 3


async def test_an_error_object_mid_stream_is_a_retried_failure() -> None:
    body = b'data: {"a":1}\n\ndata: {"error":{"message":"overloaded"}}\n\n'
    seen: list[dict[str, object]] = []
    with pytest.raises(ProviderError, match="overloaded") as raised:
        await drain(body, seen)
    assert seen == [{"a": 1}]
    assert str(raised.value) == "The model provider failed: overloaded"
    assert (raised.value.code, raised.value.retryable) == ("stream_error", True)


async def test_a_chunk_that_is_not_json_is_a_failure() -> None:
    with pytest.raises(ProviderError, match="not JSON"):
        await drain(b"data: {nope\n\n", [])


async def test_bytes_that_are_not_utf8_are_a_failure() -> None:
    """A chunk with bytes that are not UTF-8 is a failed attempt, not the runner's
    internal error."""
    body = b'data: {"choices":[{"delta":{"content":"\xff\xfe"}}]}\n\n'
    with pytest.raises(ProviderError, match="not JSON"):
        await drain(body, [])
