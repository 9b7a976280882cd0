"""Live deltas written straight from the fan-out's pass (`Subscription.direct`): while a
stream waits with nothing queued, a delta goes to its client without waking the
stream's task; anything else is queued and written by the task, in order. A direct
write that has to wait for the socket is finished by the task before anything after it,
and a client that stops reading is still dropped after the send timeout.

In process, against the real fan-out, streams and response; only the client side is a
recorder of what the response sends."""

import asyncio
import uuid
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import pytest

from app.live import frames
from app.live.fanout import Channel, Fanout
from app.live.items import PartStarted, TextDelta
from app.live.outputs import DeltaOut, MessageOut, PartOut
from app.live.response import EventStreamResponse
from app.live.streams import StreamConfig, message_mutations, upstream_events
from app.live.subscription import Subscription
from app.live.writer import StreamWriter
from tests.support.live import text_delta

PART = "agent-text:1"


class Statements:
    """What a stream reads of the database before its live tail: the session's last
    sequence (0 here: nothing to replay)."""

    @asynccontextmanager
    async def statements(self) -> AsyncIterator[Any]:
        class Connection:
            async def scalar(self, *args: Any, **kwargs: Any) -> int:
                return 0

        yield Connection()


class Client:
    """The response's `send`: records each body chunk; while `stalled` is set, every
    write waits until it is cleared (a socket whose buffer is full)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.writable = asyncio.Event()
        self.writable.set()
        self.in_task = 0
        self.outside_task = 0
        self.disconnected: asyncio.Future[None] = (
            asyncio.get_running_loop().create_future()
        )
        self.task: asyncio.Task[None] | None = None

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if not self.writable.is_set():
            await self.writable.wait()
        if message["type"] == "http.response.body" and message.get("body"):
            self.chunks.append(message["body"])
            if asyncio.current_task() is self.task:
                self.in_task += 1
            else:
                self.outside_task += 1

    async def receive(self) -> dict[str, Any]:
        await self.disconnected
        return {"type": "http.disconnect"}

    def frames(self) -> list[bytes]:
        joined = b"".join(self.chunks)
        return [frame + b"\n\n" for frame in joined.split(b"\n\n") if frame]


class Deltas:
    """Consecutive deltas of the live part, offered to the session's channel, and every
    frame its client is owed so far."""

    def __init__(self, channel: Channel, session_id: uuid.UUID) -> None:
        self.channel = channel
        self.session_id = session_id
        self.message_id = uuid.uuid4()
        self.offset = 0
        self.expected: list[bytes] = []

    def offer(self) -> None:
        offset = self.offset
        text = f"d{offset:03d}"
        item = TextDelta(
            self.session_id,
            self.message_id,
            1,
            None,
            PART,
            offset,
            text,
            "output.message.delta",
            f"event_{offset}",
            "2026-12-02T00:00:00.000Z",
        )
        frame = f"event: delta\ndata: {text}\n\n".encode()
        self.offset = offset + len(text)
        self.expected.append(frame)
        self.channel.offer(DeltaOut(item, frame, frame, self.offset))


async def open_stream(fanout: Fanout, kind: str) -> tuple[Client, Subscription, Deltas]:
    """A stream of `kind` subscribed to a new session, past its start, holding a live
    part; the deltas that extend it."""
    session_id = uuid.uuid4()
    client = Client()
    writer = StreamWriter()
    common: dict[str, Any] = {
        "database": Statements(),
        "fanout": fanout,
        "session_id": session_id,
        "config": StreamConfig(retry_ms=100, cycle_seconds=3600),
        "release": lambda: None,
        "writer": writer,
    }
    if kind == "mutation":
        stream = message_mutations(after=None, include_internal=False, **common)
    else:
        stream = upstream_events(cursor=None, accept=lambda event_type: True, **common)
    response = EventStreamResponse(stream, fanout, writer=writer)
    scope = {"type": "http", "method": "GET", "path": "/stream", "headers": []}
    client.task = asyncio.create_task(response(scope, client.receive, client.send))
    channel = None
    for _ in range(100):
        await asyncio.sleep(0.01)
        channel = fanout.channels.get(session_id)
        if channel is not None and channel.subscribers:
            break
    assert channel is not None
    (sub,) = channel.subscribers
    channel.offer(PartOut(PART, 0, b"event: part\ndata: p\n\n"))
    await settle()
    return client, sub, Deltas(channel, session_id)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def stop(client: Client) -> None:
    assert client.task is not None
    client.task.cancel()
    await asyncio.gather(client.task, return_exceptions=True)


@pytest.mark.parametrize("kind", ["mutation", "sse"])
async def test_deltas_go_out_in_the_fanouts_pass_and_in_order(kind: str) -> None:
    fanout = Fanout(Statements(), queue_size=1000)  # type: ignore[arg-type]
    client, _, deltas = await open_stream(fanout, kind)
    try:
        before = len(client.chunks)
        for round_ in range(5):
            # Deltas while the stream waits: written at once, by the fan-out's pass.
            for _ in range(10):
                outside = client.outside_task
                deltas.offer()
                assert client.outside_task == outside + 1
            # A snapshot is the stream's own to write: it wakes the task, and the
            # deltas offered before the task runs queue behind it.
            snapshot = f"event: message\ndata: m{round_}\n\n".encode()
            deltas.channel.offer(MessageOut(round_ + 1, True, snapshot))
            if kind == "mutation":
                deltas.expected.append(snapshot)
            for _ in range(3):
                deltas.offer()
            await settle()
        assert client.frames()[before:] == deltas.expected
        assert client.in_task > 0
    finally:
        await stop(client)
    assert fanout.count(deltas.session_id) == 0


@pytest.mark.parametrize("kind", ["mutation", "sse"])
async def test_a_direct_write_that_waits_is_finished_first(kind: str) -> None:
    fanout = Fanout(Statements(), queue_size=1000)  # type: ignore[arg-type]
    client, sub, deltas = await open_stream(fanout, kind)
    try:
        before = len(client.chunks)
        for _ in range(3):
            deltas.offer()
        # The socket stops taking data: the next direct write waits, and what comes
        # after it queues behind it.
        client.writable.clear()
        for _ in range(5):
            deltas.offer()
        assert sub.direct is None
        await settle()
        assert len(client.chunks) == before + 3
        client.writable.set()
        await settle()
        # Direct writes again once the task caught up.
        outside = client.outside_task
        deltas.offer()
        assert client.outside_task == outside + 1
        assert client.frames()[-len(deltas.expected) :] == deltas.expected
    finally:
        await stop(client)


async def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout() -> None:
    fanout = Fanout(
        Statements(),  # type: ignore[arg-type]
        queue_size=1000,
        heartbeat_seconds=0.5,
        send_timeout_seconds=0.3,
    )
    fanout.start()
    client, _, deltas = await open_stream(fanout, "mutation")
    task = client.task
    assert task is not None
    try:
        client.writable.clear()
        deltas.offer()
        # The task finishes nothing (the socket never drains): the process timer
        # stops the stream, which ends without an error.
        await asyncio.wait_for(task, 5)
        assert task.exception() is None
        assert fanout.count(deltas.session_id) == 0
    finally:
        await fanout.close()


async def test_a_session_with_no_stream_here_is_projected_without_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every streaming message is projected (a stream that opens later starts from its
    live parts), but frames are made only for a session with a stream here: a delta
    nobody here watches costs no encoding."""
    made: list[str] = []
    for name in ("part_mutation", "delta_mutation"):
        encode = getattr(frames, name)

        def counted(*args: Any, _name: str = name, _encode: Any = encode) -> bytes:
            made.append(_name)
            return bytes(_encode(*args))

        monkeypatch.setattr(frames, name, counted)
    fanout = Fanout(Statements(), queue_size=1000)  # type: ignore[arg-type]
    session_id, message_id = uuid.uuid4(), uuid.uuid4()
    fanout.deliver(
        PartStarted(
            session_id,
            message_id,
            1,
            None,
            {"type": "text", "part_id": PART, "text": ""},
        )
    )
    for offset, word in enumerate("abc"):
        fanout.deliver(text_delta(session_id, message_id, offset, word))
    assert made == []
    [(_, parts)] = fanout.live_parts(session_id)
    assert parts[0]["text"] == "abc"
    sub = fanout.subscribe(session_id)
    try:
        fanout.deliver(text_delta(session_id, message_id, 3, "d"))
        assert made == ["delta_mutation"]
    finally:
        fanout.unsubscribe(sub)
