"""A small Server-Sent Events client for tests.

`open_stream` opens a streaming GET with httpx and, when the answer is a 200 event
stream, starts a background reader that parses frames into a queue. Every read has a
timeout and every wait a deadline, so a test that uses it always ends on its own:

    async with open_stream(client, f"/v1/sessions/{sid}/sse") as stream:
        frames = await stream.until(lambda f: f.event == "session.idled", within=10)

Frames keep what the wire said: `event`, `id`, `retry`, `data` (lines joined with
"\\n") and the comment lines (`: heartbeat`), with the monotonic time they arrived.
"""

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest


@dataclass
class Frame:
    """One dispatched block of the stream: an event, or a block of comment lines only."""

    event: str | None = None
    data: str | None = None
    id: str | None = None
    retry: int | None = None
    comments: list[str] = field(default_factory=list)
    received_at: float = 0.0

    @property
    def is_comment(self) -> bool:
        return self.event is None and self.data is None and self.id is None

    def json(self) -> Any:
        assert self.data is not None, f"frame without data: {self}"
        return json.loads(self.data)


class FrameParser:
    """Incremental parser for `text/event-stream` (WHATWG rules, minus the defaults a
    browser would fill in: a frame without `event:` keeps `event=None`)."""

    def __init__(self) -> None:
        self._buffer = ""
        self._current = Frame()
        self._data: list[str] = []
        self._touched = False

    def feed(self, text: str) -> list[Frame]:
        self._buffer += text
        out: list[Frame] = []
        while True:
            index = self._buffer.find("\n")
            if index < 0:
                break
            line = self._buffer[:index].removesuffix("\r")
            self._buffer = self._buffer[index + 1 :]
            frame = self._line(line)
            if frame is not None:
                out.append(frame)
        return out

    def _line(self, line: str) -> Frame | None:
        if line == "":
            if not self._touched:
                return None
            frame = self._current
            frame.data = "\n".join(self._data) if self._data else None
            frame.received_at = time.monotonic()
            self._current, self._data, self._touched = Frame(), [], False
            return frame
        self._touched = True
        if line.startswith(":"):
            self._current.comments.append(line[1:].strip())
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._current.event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._current.id = value
        elif name == "retry" and value.isdigit():
            self._current.retry = int(value)
        return None


def parse(text: str) -> list[Frame]:
    """Parse a complete stream body."""
    return FrameParser().feed(text)


class StreamClosed(Exception):
    """The server ended the stream before the awaited frame arrived."""


_END = object()


class SSEStream:
    """A live stream being read in the background. `frames` is everything read so far
    (including what `until` consumed); `closed` turns true when the server ended it."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.frames: list[Frame] = []
        self.closed = False
        self.error: BaseException | None = None
        self.opened_at = time.monotonic()
        self._queue: asyncio.Queue[Frame | object] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None

    @property
    def status_code(self) -> int:
        return self.response.status_code

    def start(self) -> None:
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        parser = FrameParser()
        try:
            async for chunk in self.response.aiter_text():
                for frame in parser.feed(chunk):
                    self._queue.put_nowait(frame)
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self._queue.put_nowait(_END)

    async def next(self, within: float) -> Frame | None:
        """The next frame, or None once the server has ended the stream. Raises
        TimeoutError when nothing arrives within `within` seconds."""
        if self.closed:
            return None
        item = await asyncio.wait_for(self._queue.get(), max(within, 0.0))
        if item is _END:
            self.closed = True
            return None
        assert isinstance(item, Frame)
        self.frames.append(item)
        return item

    def pending(self) -> list[Frame]:
        """Frames already received and not yet consumed, without waiting."""
        out: list[Frame] = []
        while not self.closed:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            if item is _END:
                self.closed = True
                break
            assert isinstance(item, Frame)
            self.frames.append(item)
            out.append(item)
        return out

    async def until(
        self, predicate: Callable[[Frame], bool], within: float
    ) -> list[Frame]:
        """Read frames up to and including the first one matching `predicate`.
        Raises TimeoutError after `within` seconds, StreamClosed if the stream ends."""
        deadline = time.monotonic() + within
        out: list[Frame] = []
        while True:
            frame = await self.next(deadline - time.monotonic())
            if frame is None:
                raise StreamClosed(f"stream ended before the awaited frame: {out}")
            out.append(frame)
            if predicate(frame):
                return out

    async def collect(self, duration: float) -> list[Frame]:
        """Everything that arrives within `duration` seconds (stops early if the
        stream ends)."""
        deadline = time.monotonic() + duration
        out: list[Frame] = []
        while True:
            try:
                frame = await self.next(deadline - time.monotonic())
            except TimeoutError:
                return out
            if frame is None:
                return out
            out.append(frame)

    async def drain(self, within: float) -> list[Frame]:
        """Read until the server ends the stream; TimeoutError if it does not within
        `within` seconds."""
        deadline = time.monotonic() + within
        out: list[Frame] = []
        while True:
            frame = await self.next(deadline - time.monotonic())
            if frame is None:
                return out
            out.append(frame)

    async def aclose(self) -> None:
        """Disconnect (closing the connection) and stop the reader."""
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.response.aclose(), 5)


@asynccontextmanager
async def open_stream(
    client: httpx.AsyncClient,
    url: str,
    *,
    params: Mapping[str, Any] | list[tuple[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
    connect_timeout: float = 10.0,
) -> AsyncIterator[SSEStream]:
    """Open a stream. For a 200 event stream the reader starts at once; for any other
    status the body is read (problem+json) and `stream.response` holds it."""
    timeout = httpx.Timeout(connect_timeout, read=None)
    request = client.build_request(
        "GET",
        url,
        params=params,
        headers={"Accept": "text/event-stream", **(headers or {})},
        timeout=timeout,
    )
    response = await asyncio.wait_for(
        client.send(request, stream=True), connect_timeout
    )
    stream = SSEStream(response)
    try:
        if response.status_code == 200:
            stream.start()
        else:
            await asyncio.wait_for(response.aread(), connect_timeout)
        yield stream
    finally:
        await stream.aclose()


def events(frames: list[Frame]) -> list[Frame]:
    """The frames that are events (not comment-only blocks)."""
    return [f for f in frames if not f.is_comment]


# ---- the session API calls the streaming tests drive ---------------------------------


async def create_session(client: httpx.AsyncClient) -> str:
    response = await client.post("/v1/sessions", json={"title": "live"})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


async def post_message(
    client: httpx.AsyncClient, session_id: str, text: str
) -> dict[str, Any]:
    response = await client.post(
        f"/v1/sessions/{session_id}/messages",
        json={"message": {"content": [{"type": "text", "text": text}]}},
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def list_messages(client: httpx.AsyncClient, session_id: str) -> dict[str, Any]:
    response = await client.get(
        f"/v1/sessions/{session_id}/messages", params={"limit": 200}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def list_events(
    client: httpx.AsyncClient, session_id: str
) -> list[dict[str, Any]]:
    response = await client.get(
        f"/v1/sessions/{session_id}/events", params={"limit": 1000}
    )
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


async def wait_idle(
    client: httpx.AsyncClient, session_id: str, within: float = 20.0
) -> dict[str, Any]:
    """Poll the session until no turn runs; returns the session."""
    deadline = time.monotonic() + within
    while True:
        response = await client.get(f"/v1/sessions/{session_id}")
        assert response.status_code == 200, response.text
        session: dict[str, Any] = response.json()
        if session["status"] == "idle":
            return session
        if time.monotonic() > deadline:
            raise TimeoutError(f"session {session_id} still {session['status']}")
        await asyncio.sleep(0.05)


def lane_database_url(request: pytest.FixtureRequest, directory: Path) -> str:
    """A migrated database on the lane `request.param` ("sqlite" or "postgresql"), for
    a server shared by the tests of one module (each test uses sessions of its own)."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = directory / "live.db"
        shutil.copy(template, path)
        return f"sqlite+aiosqlite:///{path}"
    url: str = request.getfixturevalue("pg_database")
    return url
