"""The fan-out's order and writes, driven item by item: a live item goes out behind a
wake-up whose read is in progress and to the subscribers on the loop's next turn when
nothing is ahead of it, a stream writes every item it has queued in one chunk, a
channel's first read covers what its live subscribers lack, and a new stream's live
parts never run ahead of the checkpoints they build on. A fan-out of its own on the
test's database, fed directly (no bus), so both lanes see the same timing."""

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest

from app.db.rows import MessageRow
from app.db.session import Database
from app.ids import format_id, uuid7
from app.journal import checkpoint
from app.journal.sessions import lock_session
from app.live import streams
from app.live.fanout import SLOW_PASS_SECONDS, Fanout
from app.live.items import PartStarted, Resync, Wakeup
from app.live.outputs import RESYNC, Deltas, EventOut
from app.live.streams import StreamConfig, message_mutations
from app.live.subscription import Subscription
from app.live.writer import StreamWriter
from tests.support.api import create_session, uuid_of
from tests.support.in_process import Running
from tests.support.live import text_delta
from tests.support.sse import frame_names, parse
from tests.support.waits import wait_until


async def append(state: Any, session_id: uuid.UUID, text: str) -> MessageRow:
    """A user message committed to the session (no turn): its row, at its sequence."""
    async with state.database.write() as db:
        session = await lock_session(db, session_id)
        assert session is not None
        written, _ = await checkpoint.append_user_message(
            db,
            session,
            content=[{"type": "text", "text": text}],
            visibility="visible",
            extra={},
            client_message_id=None,
            start_turn=False,
        )
    assert written.message is not None
    return written.message


def live_text(
    session_id: uuid.UUID, message_id: uuid.UUID, revision: int
) -> PartStarted:
    return PartStarted(
        session_id,
        message_id,
        revision,
        None,
        {"type": "text", "part_id": "agent-text:1", "text": "The "},
    )


def mutations(
    state: Any,
    fanout: Fanout,
    session_id: uuid.UUID,
    after: int | None = 0,
    writer: StreamWriter | None = None,
) -> AsyncIterator[bytes]:
    """The session's Mutation stream from `after` (None: no cursor), on `fanout`."""
    return message_mutations(
        database=state.database,
        fanout=fanout,
        session_id=session_id,
        after=after,
        include_internal=False,
        config=StreamConfig(retry_ms=100, cycle_seconds=30),
        release=lambda: None,
        writer=writer,
    )


async def close_stream(
    pending: "asyncio.Future[bytes] | None",
    stream: AsyncIterator[bytes],
    fanout: Fanout,
) -> None:
    """End a test's stream: its read in progress, the stream, and its fan-out."""
    if pending is not None and not pending.done():
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pending
    await stream.aclose()  # type: ignore[attr-defined]
    await fanout.close()


async def parked(fanout: Fanout, session_id: uuid.UUID) -> Subscription:
    """The stream's subscription, once the stream waits on it with nothing queued."""
    channel = fanout.channels[session_id]
    (sub,) = channel.subscribers
    await wait_until(
        lambda: sub.waiter is not None and not channel.busy,
        "the stream to wait for items",
        within=5,
        interval=0.005,
    )
    return sub


async def test_live_items_queue_behind_a_read_and_skip_the_pump_otherwise(
    running: Running,
) -> None:
    state = running.app.state.app
    session_id = uuid_of(await create_session(running.client, "fan-out order"))
    fanout = Fanout(state.reads, 100)
    stream = mutations(state, fanout, session_id, after=None)
    pending: asyncio.Future[bytes] | None = None
    try:
        assert await asyncio.wait_for(anext(stream), 5) == b"retry: 100\n\n"
        pending = asyncio.ensure_future(anext(stream))
        sub = await parked(fanout, session_id)

        # A checkpoint commits; its wake-up arrives, then the next step's part and
        # first delta, before the channel has read anything.
        sequence = (await append(state, session_id, "hello")).changed_sequence
        message_id = uuid7()
        fanout.deliver(Wakeup(session_id, sequence))
        fanout.deliver(
            PartStarted(
                session_id,
                message_id,
                1,
                None,
                {"type": "text", "part_id": "agent-text:1", "text": ""},
            )
        )
        fanout.deliver(text_delta(session_id, message_id, 0, "hi"))
        channel = fanout.channels[session_id]
        assert channel.inbox.qsize() == 3, "live items overtook the wake-up's read"
        seen = frame_names(await asyncio.wait_for(pending, 5))
        while "delta" not in seen:
            seen += frame_names(await asyncio.wait_for(anext(stream), 5))
        assert seen == ["message", "part", "delta"]

        # Nothing ahead: a delta goes to the subscriber on the loop's next turn,
        # without the pump (the publisher does not wait for the subscribers).
        pending = asyncio.ensure_future(anext(stream))
        sub = await parked(fanout, session_id)
        fanout.deliver(text_delta(session_id, message_id, 2, " there"))
        assert channel.inbox.empty()
        assert (len(channel.live), len(sub.pending)) == (1, 0)
        await asyncio.sleep(0)
        assert (len(channel.live), len(sub.pending)) == (0, 1)
        assert frame_names(await asyncio.wait_for(pending, 5)) == ["delta"]

        # After a slow pass the next waits one turn more, for the publisher's next
        # deltas: the three published by then are one item for the subscriber, and
        # one chunk on the wire, in order.
        pending = asyncio.ensure_future(anext(stream))
        sub = await parked(fanout, session_id)
        channel.last_pass = SLOW_PASS_SECONDS
        fanout.deliver(text_delta(session_id, message_id, 8, "a"))
        await asyncio.sleep(0)
        assert (len(channel.live), len(sub.pending)) == (1, 0)
        for offset, text in ((9, "b"), (10, "c")):
            fanout.deliver(text_delta(session_id, message_id, offset, text))
        await asyncio.sleep(0)
        assert (len(channel.live), [type(item) for item in sub.pending]) == (
            0,
            [Deltas],
        )
        chunk = await asyncio.wait_for(pending, 5)
        assert frame_names(chunk) == ["delta", "delta", "delta"]
        assert re.findall(rb'"text":"(\w)"', chunk) == [b"a", b"b", b"c"]
    finally:
        await close_stream(pending, stream, fanout)


async def test_deltas_of_one_pass_go_to_the_socket_in_one_write(
    running: Running,
) -> None:
    """A stream waiting with nothing queued is written from the fan-out's pass, not
    by its own task: the deltas the publisher had by the pass are one write."""
    state = running.app.state.app
    session_id = uuid_of(await create_session(running.client, "one write"))
    fanout = Fanout(state.reads, 100)
    writes: list[bytes] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        writes.append(message["body"])

    writer = StreamWriter()
    writer.send = send
    stream = mutations(state, fanout, session_id, after=None, writer=writer)
    pending: asyncio.Future[bytes] | None = None
    try:
        assert await asyncio.wait_for(anext(stream), 5) == b"retry: 100\n\n"
        pending = asyncio.ensure_future(anext(stream))
        await parked(fanout, session_id)
        message_id = uuid7()
        fanout.deliver(live_text(session_id, message_id, 1))
        assert frame_names(await asyncio.wait_for(pending, 5)) == ["part"]

        pending = asyncio.ensure_future(anext(stream))
        await parked(fanout, session_id)
        for offset, text in ((4, "a"), (5, "b"), (6, "c")):
            fanout.deliver(text_delta(session_id, message_id, offset, text))
        await wait_until(lambda: bool(writes), "the pass to write", within=5)
        (chunk,) = writes
        assert frame_names(chunk) == ["delta", "delta", "delta"]
        assert re.findall(rb'"text":"(\w)"', chunk) == [b"a", b"b", b"c"]
        # Written from the pass: the stream's own task had nothing to write.
        assert not pending.done()
    finally:
        await close_stream(pending, stream, fanout)


async def test_a_waiter_for_a_turns_end_takes_no_live_items(running: Running) -> None:
    """A durable-only subscription (a `?wait=true`) is not handed the reply's parts and
    deltas, which it would wake for only to skip; a stream beside it is."""
    state = running.app.state.app
    session_id = uuid_of(await create_session(running.client, "waiter"))
    fanout = Fanout(state.reads, 100)
    try:
        waiter = fanout.subscribe(session_id, durable_only=True)
        stream = fanout.subscribe(session_id)
        message_id = uuid7()
        fanout.deliver(live_text(session_id, message_id, 1))
        fanout.deliver(text_delta(session_id, message_id, 4, "a"))
        fanout.deliver(Resync())
        await wait_until(
            lambda: len(stream.pending) == 3, "the stream's three items", within=5
        )
        assert waiter.pending == [RESYNC]
    finally:
        await fanout.close()


async def test_the_first_read_covers_every_subscriber_that_went_live(
    running: Running,
) -> None:
    """Two commits, and only the second's wake-up reaches the new channel: its one read
    begins where its subscriber went live, so the subscriber gets both commits' events
    in order and has no gap to read for itself (a thousand subscribers would each have
    read theirs at the start of a turn)."""
    state = running.app.state.app
    session_id = uuid_of(await create_session(running.client, "first read"))
    fanout = Fanout(state.reads, 100)
    try:
        sub = fanout.subscribe(session_id)
        sequences: list[int] = []
        for text in ("one", "two"):
            async with state.database.write() as db:
                session = await lock_session(db, session_id)
                assert session is not None
                if not sequences:
                    sub.started_at = session.last_sequence
                await checkpoint.append_user_message(
                    db,
                    session,
                    content=[{"type": "text", "text": text}],
                    visibility="visible",
                    extra={},
                    client_message_id=None,
                    start_turn=False,
                )
                sequences.append(session.last_sequence)
        fanout.deliver(Wakeup(session_id, sequences[-1]))

        def events() -> list[int]:
            return [i.sequence for i in sub.pending if isinstance(i, EventOut)]

        await wait_until(lambda: events()[-1:] == sequences[-1:], "the read", within=5)
        assert sub.started_at is not None
        assert events() == list(range(sub.started_at + 1, sequences[-1] + 1))
        assert sequences[0] in events()
    finally:
        await fanout.close()


async def test_a_new_streams_live_part_never_runs_ahead_of_its_checkpoint(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint commits while a new stream reads where it starts, and the next
    step's part is published before the stream replayed anything: the stream sends the
    checkpoint's message, then the part. (Sent the other way round, a frontend ends the
    step's text at the checkpoint's new parts: the rest of the text is lost to it.)"""
    state = running.app.state.app
    session_id = uuid_of(await create_session(running.client, "live after replay"))
    fanout = Fanout(state.reads, 100)
    original = streams._last_sequence
    raced: list[MessageRow] = []

    async def racing(database: Database, sid: uuid.UUID) -> int:
        last = await original(database, sid)
        if not raced:
            raced.append(await append(state, session_id, "the checkpoint"))
            fanout.deliver(Wakeup(session_id, raced[0].changed_sequence))
            fanout.deliver(live_text(session_id, uuid7(), 1))
        return last

    monkeypatch.setattr(streams, "_last_sequence", racing)
    stream = mutations(state, fanout, session_id)
    try:
        seen: list[str] = []
        while "part" not in seen:
            seen += frame_names(await asyncio.wait_for(anext(stream), 5))
        assert raced
        assert [name for name in seen if name in ("message", "part")] == [
            "message",
            "part",
        ]
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        await fanout.close()


async def test_a_new_stream_leaves_out_live_parts_a_replayed_checkpoint_replaced(
    running: Running,
) -> None:
    """Live parts of a message whose replayed revision is past the one they extend are
    not sent (the snapshot holds them already); another message's live parts are."""
    state = running.app.state.app
    session_id = uuid_of(await create_session(running.client, "replaced parts"))
    fanout = Fanout(state.reads, 100)
    stored = await append(state, session_id, "committed")
    streaming = uuid7()
    fanout.deliver(live_text(session_id, stored.id, stored.revision - 1))
    fanout.deliver(live_text(session_id, streaming, 1))
    stream = mutations(state, fanout, session_id)
    try:
        chunks = b""
        while b"event: part" not in chunks:
            chunks += await asyncio.wait_for(anext(stream), 5)
        names = [n for n in frame_names(chunks) if n in ("message", "part")]
        assert names == ["message", "part"]
        part = chunks[chunks.index(b"event: part") :]
        assert format_id("message", streaming).encode() in part
        assert format_id("message", stored.id).encode() not in part
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        await fanout.close()


async def test_a_resync_ahead_of_a_read_sends_each_snapshot_once(
    running: Running,
) -> None:
    """A resync reaches the stream after a checkpoint committed and before its
    wake-up's read does (the bus was heard again, or a read failed): the stream's own
    read sends the message, and the read that follows does not send it again."""
    state = running.app.state.app
    session_id = uuid_of(await create_session(running.client, "resync"))
    fanout = Fanout(state.reads, 100)
    stream = mutations(state, fanout, session_id, after=0)
    try:
        assert await asyncio.wait_for(anext(stream), 5) == b"retry: 100\n\n"
        pending = asyncio.ensure_future(anext(stream))
        await parked(fanout, session_id)
        hello = await append(state, session_id, "hello")
        fanout.deliver(Resync())
        fanout.deliver(Wakeup(session_id, hello.changed_sequence))
        # The next checkpoint marks where the first one's frames end.
        then = await append(state, session_id, "then")
        fanout.deliver(Wakeup(session_id, then.changed_sequence))
        snapshots: list[str] = []
        chunk = await asyncio.wait_for(pending, 5)
        while True:
            snapshots += [
                f.json()["message"]["id"]
                for f in parse(chunk.decode())
                if f.event == "message"
            ]
            if format_id("message", then.id) in snapshots:
                break
            chunk = await asyncio.wait_for(anext(stream), 5)
        assert snapshots == [
            format_id("message", hello.id),
            format_id("message", then.id),
        ]
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        await fanout.close()
