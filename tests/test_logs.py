"""Structured logs, read line by line from real server processes: with LOG_FORMAT unset
and no terminal every line is one JSON object; access lines carry the request id the
client got back (the caller's X-Request-Id when it is valid, on the hot path and
FastAPI's alike); a turn's lines name its session and turn; LOG_FORMAT=text writes the
same context for people; and a client dropped for not reading is one INFO line, with no
error and no traceback."""

import asyncio
import json
import logging
import re
import socket
import sys
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from app.errors import incoming_request_id
from app.settings import Settings
from app.telemetry import logs
from tests.support.api import create_session, post_message, text_of
from tests.support.servers import Server, start_own_server
from tests.support.sse import expect_subscribed, open_stream
from tests.support.waits import wait_idle, wait_until

GENERATED = re.compile(r"[0-9a-f]{32}")
ORIGIN = "https://app.example"


def records(server: Server) -> list[dict[str, Any]]:
    """Every line of the server's log, parsed: each must be one JSON object with the
    four fields every line has."""
    parsed = []
    for line in server.log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"a log line that is not JSON: {line!r}")
        assert isinstance(record, dict), line
        assert {"timestamp", "level", "logger", "message"} <= record.keys(), line
        assert re.fullmatch(
            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["timestamp"]
        )
        parsed.append(record)
    return parsed


def access(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in found if r["logger"] == "uvicorn.access"]


async def stop(server: Server) -> None:
    await asyncio.to_thread(server.stop)


async def test_every_line_is_json_and_access_lines_carry_the_request_id(
    settings: Settings, tmp_path: Path
) -> None:
    server = await start_own_server(settings.database_url, tmp_path)
    sent: list[tuple[str, str, str]] = []  # (method, path, the id the client got)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:

            async def call(
                method: str, path: str, request_id: str | bytes | None = None, **kw: Any
            ) -> httpx.Response:
                headers = {} if request_id is None else {"X-Request-Id": request_id}
                # A bytes value is sent as it is (httpx's types say str).
                response = await client.request(
                    method, path, headers=cast(Any, headers), **kw
                )
                sent.append((method, path, response.headers["x-request-id"]))
                return response

            created = await call("POST", "/v1/sessions", json={"title": "logs"})
            sid = created.json()["id"]
            messages = f"/v1/sessions/{sid}/messages"
            session_path = f"/v1/sessions/{sid}"
            # The caller's id is kept and echoed, on FastAPI's path and the hot one.
            kept = {
                "framework-1": await call("GET", session_path, "framework-1"),
                "hot-1": await call("GET", messages, "hot-1"),
                "with spaces (ok)": await call("GET", messages, "with spaces (ok)"),
                "x" * 128: await call("GET", session_path, "x" * 128),
            }
            for request_id, response in kept.items():
                assert response.status_code == 200, response.text
                assert response.headers["x-request-id"] == request_id
            # An id that may not be kept (too long, not printable ASCII) is replaced.
            for bad in ("y" * 129, b"caf\xe9", b"tab\there"):
                for path in (messages, session_path):
                    response = await call("GET", path, bad)
                    assert response.status_code == 200, response.text
                    assert GENERATED.fullmatch(response.headers["x-request-id"])
            # Without one, each request gets one of ours.
            plain = await call("GET", messages)
            assert GENERATED.fullmatch(plain.headers["x-request-id"])
            # A stream echoes it too.
            async with open_stream(
                client, f"{messages}/stream", headers={"X-Request-Id": "stream-1"}
            ) as stream:
                assert stream.status_code == 200
                assert stream.response.headers["x-request-id"] == "stream-1"
            posted = await post_message(client, sid, "hello logs")
            await wait_idle(client, sid)
            page = (await client.get(messages)).json()
            # A credential put in the query by mistake is not logged.
            leaked = await client.get(
                f"{messages}?limit=5&api_key=sk-misplaced&Access_Token=tok-misplaced"
            )
            assert leaked.status_code in (200, 400)
    finally:
        await stop(server)
    assert "misplaced" not in server.log.read_text()
    found = records(server)
    assert any(
        r.get("path")
        == f"{messages}?limit=5&api_key=[redacted]&Access_Token=[redacted]"
        for r in access(found)
    ), access(found)
    assert not [r for r in found if r["level"] in ("ERROR", "CRITICAL")], found
    lines = access(found)
    for method, path, request_id in sent:
        matching = [
            r
            for r in lines
            if r["method"] == method
            and r["path"] == path
            and r.get("request_id") == request_id
        ]
        assert len(matching) == 1, (method, path, request_id, lines)
        line = matching[0]
        assert isinstance(line["status"], int)
        assert line["client"].startswith("127.0.0.1")
        if path.startswith(f"/v1/sessions/{sid}"):
            assert line.get("session_id") == sid, line
    stream_lines = [r for r in lines if r["path"].endswith("/stream")]
    assert [r.get("request_id") for r in stream_lines] == ["stream-1"]
    # The turn's line names its session and turn.
    agent = next(m for m in page["data"] if m["role"] == "agent")
    assert text_of(agent) == "hello logs"
    turns = [r for r in found if r["logger"] == "app.runner"]
    ended = [r for r in turns if r["message"].startswith("turn completed")]
    assert len(ended) == 1, turns
    assert ended[0]["session_id"] == sid
    assert ended[0]["turn_id"] == posted["turn_id"] == agent["turn_id"]
    # Not the request's: the runner is no part of the POST that started it.
    assert "request_id" not in ended[0]


async def test_text_format_writes_the_same_context(
    settings: Settings, tmp_path: Path
) -> None:
    server = await start_own_server(settings.database_url, tmp_path, LOG_FORMAT="text")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            sid = await create_session(client, "text logs")
            response = await client.get(
                f"/v1/sessions/{sid}/messages", headers={"X-Request-Id": "text-1"}
            )
            assert response.headers["x-request-id"] == "text-1"
    finally:
        await stop(server)
    lines = server.log.read_text().splitlines()
    for line in lines:
        with pytest.raises(json.JSONDecodeError):
            json.loads(line)
    (hit,) = [line for line in lines if "request_id=text-1" in line]
    assert " INFO uvicorn.access " in hit
    assert f'"GET /v1/sessions/{sid}/messages HTTP/1.1" 200' in hit
    assert f"session_id={sid}" in hit


# ---- a client that stops reading ----------------------------------------------------

# Five parts of 190,000 characters: a user message just under MAX_BODY_BYTES, whose
# snapshot the Mutation stream sends whole. On loopback the kernel buffers about 3 MB
# for a socket that is not read; eight of these fill that and more.
BIG_MESSAGE = {
    "message": {
        "content": [
            {"type": "text", "text": "/scenario citations"},
            *({"type": "text", "text": "x" * 190_000} for _ in range(5)),
        ]
    }
}
BIG_MESSAGES = 8
SEND_TIMEOUT = 1.0


def unread_stream(server: Server, path: str, headers: dict[str, str]) -> socket.socket:
    """A raw GET of a Mutation stream (with a small receive buffer) read up to its
    first frame, the `retry:` block it sends once subscribed, and never again."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect((host, int(port)))
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n{head}\r\n".encode())
    received = b""
    while b"\n\n" not in received.partition(b"retry: ")[2]:
        chunk = sock.recv(4096)
        assert chunk, f"the stream ended before its first frame: {received!r}"
        received += chunk
    return sock


async def test_a_dropped_slow_consumer_is_one_info_line(
    settings: Settings, tmp_path: Path
) -> None:
    """Two clients stop reading their Mutation streams: one served by the hot path,
    one (it sends an Origin) by FastAPI's. Each is dropped once a write has waited
    SSE_SEND_TIMEOUT_SECONDS, and each drop is a single INFO line naming its request
    and session; nothing is logged as an error."""
    server = await start_own_server(
        settings.database_url,
        tmp_path,
        SSE_SEND_TIMEOUT_SECONDS=str(SEND_TIMEOUT),
        CORS_ORIGINS=ORIGIN,
        RATE_LIMIT_PER_SECOND="0",
    )
    sockets: list[socket.socket] = []
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            sid = await create_session(client, "slow")
            path = f"/v1/sessions/{sid}/messages/stream"
            for request_id, extra in (
                ("slow-hot", {}),
                ("slow-framework", {"Origin": ORIGIN}),
            ):
                sockets.append(
                    await asyncio.to_thread(
                        unread_stream,
                        server,
                        path,
                        {"X-Request-Id": request_id, **extra},
                    )
                )
            for _ in range(BIG_MESSAGES):
                posted = await client.post(
                    f"/v1/sessions/{sid}/messages", json=BIG_MESSAGE
                )
                assert posted.status_code == 201, posted.text
                await wait_idle(client, sid)

            def dropped() -> list[dict[str, Any]]:
                return [
                    r
                    for r in records(server)
                    if "dropped a slow consumer" in r["message"]
                ]

            await wait_until(lambda: len(dropped()) >= 2, "both drops logged", 20)
            # The server still serves, streams included.
            async with open_stream(client, path, params={"after": "0"}) as stream:
                assert stream.status_code == 200
                await expect_subscribed(stream)
                frame = await stream.next(10)
                assert frame is not None
                assert frame.event == "message"
    finally:
        for sock in sockets:
            sock.close()
        await stop(server)
    found = records(server)
    drops = [r for r in found if "dropped a slow consumer" in r["message"]]
    assert sorted(r["request_id"] for r in drops) == ["slow-framework", "slow-hot"], (
        drops
    )
    for drop in drops:
        assert drop["level"] == "INFO"
        assert drop["session_id"] == sid
        assert "exception" not in drop
    assert not [r for r in found if r["level"] in ("ERROR", "CRITICAL")], [
        r for r in found if r["level"] != "INFO"
    ]
    assert "Traceback" not in server.log.read_text()


# ---- the formatters, in process -----------------------------------------------------


def test_incoming_request_ids() -> None:
    assert incoming_request_id(b"abc-123") == b"abc-123"
    assert incoming_request_id(b" " * 3) == b"   "
    assert incoming_request_id(b"~" * 128) == b"~" * 128
    for refused in (b"", b"~" * 129, b"a\tb", b"a\x7fb", b"caf\xe9", b"a\nb"):
        assert incoming_request_id(refused) is None, refused


def record_of(message: str, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord(
        "app.test", logging.WARNING, __file__, 1, message, (), None
    )
    record.__dict__.update(extra)
    return record


def test_json_formatter_takes_ids_from_the_record_then_the_context() -> None:
    formatter = logs.JsonFormatter()
    token = logs.TURN_ID.set("turn_" + "a" * 32)
    try:
        line = json.loads(
            formatter.format(record_of("hello %s", args=("world",), request_id="r-1"))
        )
    finally:
        logs.TURN_ID.reset(token)
    assert line["message"] == "hello world"
    assert line["request_id"] == "r-1"
    assert line["turn_id"] == "turn_" + "a" * 32
    assert "session_id" not in line
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failed = record_of("failed")
        failed.exc_info = sys.exc_info()
    line = json.loads(formatter.format(failed))
    assert line["level"] == "WARNING"
    assert "Traceback" in line["exception"]
    assert "RuntimeError: boom" in line["exception"]
    # One line, whatever the message holds.
    assert "\n" not in formatter.format(record_of("two\nlines"))


def test_the_abandoned_response_record_alone_is_dropped() -> None:
    keep = logs.AbandonedResponseFilter()
    incomplete = record_of(logs.INCOMPLETE_RESPONSE)
    assert keep.filter(incomplete)  # not marked: a real error
    token = logs.ABANDONED.set(True)
    try:
        assert not keep.filter(incomplete)
        assert keep.filter(record_of("Exception in ASGI application"))
    finally:
        logs.ABANDONED.reset(token)


def test_default_format_follows_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    monkeypatch.setattr(sys, "stderr", Terminal(True))
    assert logs.resolve_format(None) == "text"
    assert logs.resolve_format("json") == "json"
    monkeypatch.setattr(sys, "stderr", Terminal(False))
    assert logs.resolve_format(None) == "json"
    assert logs.resolve_format("text") == "text"
