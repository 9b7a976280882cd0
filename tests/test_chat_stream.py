"""The Chat Completions stream reader: events split however the bytes arrive, and the
provider's failures as the `openai` package's errors."""

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
    assert [c async for c in chunks(response(body))] == [{"a": 1}]


async def drain(body: bytes, seen: list[dict[str, object]]) -> None:
    async for chunk in chunks(response(body)):
        seen.append(chunk)


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
