"""A small Server-Sent Events client for tests.

`open_stream` opens a streaming GET with httpx and, when the answer is a 200 event
stream, starts a background reader that parses frames into a queue, and returns once
the stream's first frame has arrived: both streams send it once they are subscribed
(`/sse` its `connected`, the Mutation stream a block with `retry:` only), so whatever
the test does next reaches the stream. Every read has a timeout and every wait a
deadline, so a test that uses it always ends on its own:

    async with open_stream(client, f"/v1/sessions/{sid}/sse") as stream:
        frames = await stream.until(lambda f: f.event == "session.idled", within=10)

Frames keep what the wire said: `event`, `id`, `retry`, `data` (lines joined with
"\\n") and the comment lines (`: heartbeat`), with the monotonic time they arrived.

`SSEReader` instead records every event frame in the background, for tests that poll
what has arrived so far (`wait_for`) rather than consume the stream.

The parser is the tests' own rather than the one the Python client reads with
(httpx-sse's): that one drops comment lines (`: heartbeat`), keeps the last `id:` on
every later block, and names a block without `event:` "message", where these tests
assert what each block of the wire said.
"""

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx


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
        self._first = asyncio.Event()

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
                    self._first.set()
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self._queue.put_nowait(_END)
            self._first.set()

    async def arrived(self, within: float) -> None:
        """Until the first frame has arrived (or the stream ended), without consuming
        it; TimeoutError after `within` seconds."""
        await asyncio.wait_for(self._first.wait(), within)

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
    """Open a stream. For a 200 event stream the reader starts at once and the stream is
    returned once its first frame arrived (it is subscribed; the frame is still there
    to read); for any other status the body is read (problem+json) and
    `stream.response` holds it."""
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
            await stream.arrived(connect_timeout)
        else:
            await asyncio.wait_for(response.aread(), connect_timeout)
        yield stream
    finally:
        await stream.aclose()


@asynccontextmanager
async def session_streams(
    client: httpx.AsyncClient, session_id: str
) -> AsyncIterator[tuple[SSEStream, SSEStream]]:
    """Both streams of a session, open together and subscribed: upstream's `/sse`, its
    `connected` frame read, and the Mutation stream, its opening `retry:` read."""
    async with (
        open_stream(client, f"/v1/sessions/{session_id}/sse") as sse,
        open_stream(client, f"/v1/sessions/{session_id}/messages/stream") as mutations,
    ):
        await expect_connected(sse)
        await expect_subscribed(mutations)
        yield sse, mutations


def frame_names(chunk: bytes) -> list[str]:
    """The event names of the SSE frames in one chunk a stream wrote (a chunk holds
    every frame that was queued when it was written)."""
    return [
        frame.split(b"\n", 1)[0].decode().removeprefix("event: ")
        for frame in chunk.split(b"\n\n")
        if frame.startswith(b"event: ")
    ]


def events(frames: list[Frame]) -> list[Frame]:
    """The frames that are events (not comment-only blocks)."""
    return [f for f in frames if not f.is_comment]


def durable(frames: list[Frame]) -> list[Frame]:
    """The frames of durable events (those with an `id:`)."""
    return [f for f in events(frames) if f.id is not None]


# ---- the frames tests wait for --------------------------------------------------------


DELTA = "output.message.delta"


def is_delta(frame: Frame) -> bool:
    """`/sse`: a live (never durable) delta of the streaming message."""
    return frame.event == DELTA


def is_idled(frame: Frame) -> bool:
    """`/sse`: the turn is over and the session idles."""
    return frame.event == "session.idled"


def agent_done(frame: Frame) -> bool:
    """The Mutation stream: a snapshot of an agent message that is done."""
    if frame.event != "message":
        return False
    message = frame.json()["message"]
    return bool(message["role"] == "agent" and message["state"] == "done")


def merge_snapshots(state: dict[str, dict[str, Any]], frames: list[Frame]) -> None:
    """The seed's client rule on the Mutation stream: keep the newest revision of each
    message snapshot in `state` (message id -> message)."""
    for frame in frames:
        if frame.event == "message":
            message = frame.json()["message"]
            current = state.get(message["id"])
            if current is None or message["revision"] > current["revision"]:
                state[message["id"]] = message


async def expect_connected(stream: SSEStream, within: float = 5.0) -> Frame:
    """The first frame of `/sse`, which is `connected`."""
    first = await stream.next(within)
    assert first is not None
    assert first.event == "connected"
    return first


async def expect_subscribed(stream: SSEStream, within: float = 5.0) -> Frame:
    """The first frame of the Mutation stream: a block with `retry:` only, sent once the
    stream is subscribed (whatever commits from then on reaches it)."""
    first = await stream.next(within)
    assert first is not None
    assert first.is_comment, first
    assert first.retry is not None, first
    assert not first.comments, first
    return first


# ---- a recorder, for tests that poll what arrived ---------------------------------------

READER_WAIT = 15.0


@dataclass
class SSEReader:
    """Reads one stream in a background task and records its event frames in `frames`
    (comment blocks are dropped; a frame without `event:` is a "message"). `start`
    returns once the stream's first block arrived (it is subscribed). `ended` turns
    true when the connection ends, whichever side ended it."""

    client: httpx.AsyncClient
    url: str
    frames: list[Frame] = field(default_factory=list)
    status: int | None = None
    # The response's headers, once it began.
    headers: httpx.Headers | None = None
    error: BaseException | None = None
    ended: bool = False
    _task: asyncio.Task[None] | None = None
    _opened: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> "SSEReader":
        self._task = asyncio.create_task(self._run())
        async with asyncio.timeout(READER_WAIT):
            await self._opened.wait()
        assert self.status == 200, f"{self.url}: status {self.status} ({self.error})"
        return self

    async def _run(self) -> None:
        parser = FrameParser()
        try:
            async with self.client.stream(
                "GET", self.url, timeout=httpx.Timeout(10.0, read=30.0)
            ) as response:
                self.status = response.status_code
                self.headers = response.headers
                if self.status != 200:
                    self._opened.set()
                async for chunk in response.aiter_text():
                    for frame in parser.feed(chunk):
                        self._opened.set()
                        if frame.event is None and frame.data is None:
                            continue  # comment lines only
                        frame.event = frame.event or "message"
                        self.frames.append(frame)
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self.ended = True
            self._opened.set()

    def events(self, name: str) -> list[dict[str, Any]]:
        """The payloads of the recorded `name` frames."""
        return [f.json() for f in self.frames if f.event == name]

    def has(self, name: str) -> bool:
        return any(f.event == name for f in self.frames)

    async def wait_for(
        self,
        predicate: Callable[[list[Frame]], bool],
        what: str,
        within: float = READER_WAIT,
    ) -> None:
        """Until `predicate(frames)` holds; AssertionError after `within` seconds."""
        deadline = time.monotonic() + within
        while not predicate(self.frames):
            if time.monotonic() > deadline:
                ended = f"ended ({self.error!r})" if self.ended else "open"
                raise AssertionError(
                    f"timed out after {within}s waiting for {what}; the stream is "
                    f"{ended}; {len(self.frames)} frames: "
                    f"{[f.event for f in self.frames][-20:]}"
                )
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
