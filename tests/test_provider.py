"""The provider's HTTP answers as ProviderErrors (which are retried and when, the
message kept from an error body whatever its shape), and a proxy from the environment."""

import asyncio
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from app.db.types import utcnow
from app.runner.drivers.chat_stream import chunks
from app.runner.drivers.provider import (
    MAX_ERROR_CHARS,
    Provider,
    retry_after,
    status_error,
)


def headers(**values: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(
        CIMultiDict({k.replace("_", "-"): v for k, v in values.items()})
    )


def test_retry_after_in_seconds_milliseconds_or_a_date() -> None:
    assert retry_after(headers(retry_after="3")) == 3.0
    assert retry_after(headers(retry_after_ms="1500", retry_after="9")) == 1.5
    later = utcnow().timestamp() + 30
    dated = retry_after(
        headers(retry_after=format_datetime(datetime.fromtimestamp(later, UTC), True))
    )
    assert dated is not None
    assert 25 <= dated <= 31
    assert retry_after(headers(retry_after="-4")) == 0.0
    assert retry_after(headers(retry_after="soon")) is None
    assert retry_after(headers()) is None


def test_which_statuses_are_tried_again() -> None:
    retried = {
        status: status_error(status, None, headers(), b"").retryable
        for status in (400, 401, 403, 404, 408, 409, 422, 429, 500, 503, 307)
    }
    assert retried == {
        400: False,
        401: False,
        403: False,
        404: False,
        408: True,
        409: True,
        422: False,
        429: True,
        500: True,
        503: True,
        307: False,
    }
    limited = status_error(429, "Too Many Requests", headers(retry_after="2"), b"")
    assert (limited.code, limited.after) == ("429", 2.0)


def test_the_message_of_an_error_body_whatever_its_shape() -> None:
    def message(body: bytes, reason: str | None = "Bad Request") -> str:
        return str(status_error(400, reason, headers(), body))

    prefix = "The model provider answered 400: "
    assert (
        message(b'{"error": {"message": "no such model"}}') == prefix + "no such model"
    )
    assert message(b'{"error": "quota exceeded"}') == prefix + "quota exceeded"
    assert message(b'{"message": "flat"}') == prefix + "flat"
    # JSON without a message, or not an object: the status's reason.
    assert message(b'{"error": {"code": 7}}') == prefix + "Bad Request"
    assert message(b"[1, 2]") == prefix + "Bad Request"
    # A body cut before its end (at 64 KB): the start of its message.
    assert message(b'{"error": {"message": "cut \\"here') == prefix + 'cut \\"here'
    assert message(b"<html>Gateway</html>") == prefix + "<html>Gateway</html>"
    assert message(b"", None) == prefix
    long = status_error(500, None, headers(), b"E" * 5000)
    assert len(str(long)) == len("The model provider answered 500: ") + MAX_ERROR_CHARS


async def test_http_proxy_from_the_environment_carries_the_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP_PROXY is honoured: the request reaches the proxy in absolute form (here the
    proxy answers it itself), and the stream reads through it."""
    seen: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n")[0])
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        body = (
            b'data: {"choices":[{"delta":{"content":"via proxy"},'
            b'"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
        )
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    for name in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    provider = Provider("http://provider.invalid/v1", "sk-test", 5)
    try:
        async with provider.stream({"model": "m", "messages": []}) as body:
            got = [chunk async for chunk in chunks(body, 5)]
    finally:
        await provider.aclose()
        server.close()
        await server.wait_closed()
    assert seen == [b"POST http://provider.invalid/v1/chat/completions HTTP/1.1"]
    assert got[0]["choices"][0]["delta"]["content"] == "via proxy"
