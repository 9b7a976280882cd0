"""Slow and malformed clients against a real server process, over raw sockets: a request
whose header or body does not arrive within its deadline is answered 408 and its socket
closed; streams are not cut by the deadlines; what uvicorn answers itself (a malformed
request, an oversized header) is problem+json."""

import asyncio
import socket
import time

import httpx
import orjson

from tests.support.api import create_session
from tests.support.problems import PROBLEM_JSON
from tests.support.servers import Server, api_fixture, live_server_fixture
from tests.support.sse import expect_connected, open_stream

DEADLINE = 1.0
MAX_HEADER = 4096
live_server = live_server_fixture(
    "slow-clients",
    HEADER_READ_TIMEOUT_SECONDS=str(DEADLINE),
    BODY_READ_TIMEOUT_SECONDS=str(DEADLINE),
    MAX_HEADER_BYTES=str(MAX_HEADER),
)
api = api_fixture()


class Raw:
    """One raw TCP connection to the server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.opened_at = time.monotonic()

    @classmethod
    async def open(cls, server: Server) -> "Raw":
        host, port = server.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def until_closed(self, within: float = 10.0) -> tuple[bytes, float]:
        """Everything the server sends until it closes the connection, and how long
        after the connection was opened it closed; TimeoutError if it stays open."""
        received = await asyncio.wait_for(self.reader.read(), within)
        return received, time.monotonic() - self.opened_at

    def close(self) -> None:
        self.writer.close()


def problem(raw: bytes, status: int) -> dict[str, object]:
    """The one HTTP response in `raw`: problem+json with `status`, connection closed."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} "), raw
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert headers["content-type"] == PROBLEM_JSON, raw
    assert headers["connection"] == "close", raw
    assert int(headers["content-length"]) == len(body), raw
    parsed: dict[str, object] = orjson.loads(body)
    assert parsed["status"] == status, parsed
    assert isinstance(parsed["detail"], str), parsed
    assert parsed["detail"], parsed
    assert parsed["type"] == f"https://docs.everruns.com/errors/{parsed['code']}"
    return parsed


async def test_partial_header_then_silence_is_408_within_the_deadline(
    live_server: Server,
) -> None:
    conn = await Raw.open(live_server)
    try:
        await conn.send(b"GET /health HTTP/1.1\r\nHost: test\r\nX-Slow: ")
        raw, after = await conn.until_closed()
    finally:
        conn.close()
    assert DEADLINE * 0.9 <= after < DEADLINE + 1.5, after
    assert problem(raw, 408)["code"] == "request_timeout"


async def test_a_header_dribbled_a_byte_at_a_time_is_408(live_server: Server) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: test\r\nX-Pad: " + b"a" * 100
    conn = await Raw.open(live_server)
    closed = asyncio.create_task(conn.until_closed())
    try:
        for byte in request:
            if closed.done():
                break
            await conn.send(bytes([byte]))
            await asyncio.sleep(0.05)
        raw, after = await closed
    finally:
        conn.close()
    assert after < DEADLINE + 1.5, after
    problem(raw, 408)


async def test_a_connection_that_sends_nothing_is_closed_without_an_answer(
    live_server: Server,
) -> None:
    conn = await Raw.open(live_server)
    try:
        raw, after = await conn.until_closed()
    finally:
        conn.close()
    assert raw == b""
    assert DEADLINE * 0.9 <= after < DEADLINE + 1.5, after


async def test_a_dribbling_body_is_408_and_writes_nothing(
    live_server: Server, api: httpx.AsyncClient
) -> None:
    before = (await api.get("/v1/sessions")).json()["total"]
    body = b'{"title": "never stored"}'
    conn = await Raw.open(live_server)
    closed = asyncio.create_task(conn.until_closed())
    try:
        await conn.send(
            b"POST /v1/sessions HTTP/1.1\r\nHost: test\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        started = time.monotonic()
        for byte in body[:-1]:
            if closed.done():
                break
            await conn.send(bytes([byte]))
            await asyncio.sleep(0.1)
        raw, _ = await closed
        body_time = time.monotonic() - started
    finally:
        conn.close()
    assert DEADLINE * 0.9 <= body_time < DEADLINE + 1.5, body_time
    assert problem(raw, 408)["code"] == "request_timeout"
    assert (await api.get("/v1/sessions")).json()["total"] == before


async def test_a_refused_request_is_half_closed_and_its_late_bytes_dropped(
    live_server: Server,
) -> None:
    """A request refused mid-way is answered, then half-closed: the client reads the
    answer and the end of it, and bytes it still sends are dropped for a while. (Closed
    at once, the server reset the connection at the client's next bytes, and under load,
    with some of them unread at the close, the reset dropped the answer itself.)"""

    def client() -> tuple[bytes, bool]:
        host, port = live_server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/sessions HTTP/1.1\r\nHost: test\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            )
            received = b""
            while chunk := sock.recv(65536):  # the 408, then the server's FIN
                received += chunk
            try:
                for _ in range(3):
                    sock.sendall(b'"title": "late"')
                    time.sleep(0.2)
            except OSError:  # reset: the server had closed for good
                return received, False
            return received, True

    raw, accepted = await asyncio.to_thread(client)
    assert problem(raw, 408)["code"] == "request_timeout"
    assert accepted, "the late bytes were answered with a reset"


async def test_the_header_deadline_starts_at_each_request_of_a_connection(
    live_server: Server,
) -> None:
    """On a kept-alive connection the deadline counts from the next request's first
    byte: a connection older than the deadline still gets its requests answered."""
    conn = await Raw.open(live_server)
    try:
        for _ in range(3):
            await conn.send(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
            status = await asyncio.wait_for(conn.reader.readline(), 5)
            assert status.startswith(b"HTTP/1.1 200 "), status
            head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), 5)
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await asyncio.wait_for(conn.reader.readexactly(length), 5)
            # Idle for longer than the header deadline (less than the keep-alive).
            await asyncio.sleep(DEADLINE * 1.5)
    finally:
        conn.close()


async def test_streams_outlive_the_read_deadlines(
    live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await create_session(api, "long stream")
    url = f"/v1/sessions/{session_id}/sse"
    async with open_stream(api, url) as stream:
        await expect_connected(stream)
        # Heartbeats every second (the test server's setting) for three deadlines.
        frames = await stream.collect(DEADLINE * 3.5)
        assert not stream.closed, frames
        assert sum(1 for f in frames if "heartbeat" in f.comments) >= 2, frames


async def test_a_malformed_request_is_a_400_problem(live_server: Server) -> None:
    conn = await Raw.open(live_server)
    try:
        await conn.send(b"NOT HTTP AT ALL\r\n\r\n")
        raw, _ = await conn.until_closed()
    finally:
        conn.close()
    assert problem(raw, 400)["code"] == "invalid_http"


async def test_an_oversized_header_is_a_431_problem(live_server: Server) -> None:
    for request in (
        # Many headers, each small.
        b"GET /health HTTP/1.1\r\nHost: test\r\n"
        + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 100) for i in range(60))
        + b"\r\n",
        # One header larger than the cap, still arriving.
        b"GET /health HTTP/1.1\r\nHost: test\r\nX-Big: " + b"a" * (MAX_HEADER * 2),
    ):
        conn = await Raw.open(live_server)
        try:
            await conn.send(request)
            raw, after = await conn.until_closed()
        finally:
            conn.close()
        assert after < DEADLINE, after
        assert problem(raw, 431)["code"] == "header_too_large"


async def test_many_slow_sockets_are_all_closed_and_the_server_keeps_answering(
    live_server: Server, api: httpx.AsyncClient
) -> None:
    conns = await asyncio.gather(*(Raw.open(live_server) for _ in range(100)))
    try:
        await asyncio.gather(
            *(c.send(b"GET /health HTTP/1.1\r\nHost: test\r\n") for c in conns)
        )
        # While they hang, others are served.
        assert (await api.get("/health")).status_code == 200
        results = await asyncio.gather(*(c.until_closed() for c in conns))
    finally:
        for conn in conns:
            conn.close()
    assert max(after for _, after in results) < DEADLINE + 2.0
    for raw, _ in results:
        problem(raw, 408)
    assert (await api.get("/health")).status_code == 200
