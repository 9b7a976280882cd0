"""A live delta's cost does not grow with the reply: the fan-out and the runner append
each delta's text in O(1) and join it only when someone needs the whole text, and the
`/sse` frame (which carries the part's whole text so far) is encoded only when a
stream asks for it, with the text as it stood at that delta.

In process, against the real fan-out and the runner's step projection."""

import asyncio
import uuid

import orjson
import pytest

from app.live import frames
from app.live.fanout import Fanout
from app.live.items import PartStarted, TextDelta
from app.live.outputs import DeltaOut, Deltas, Out
from app.runner.drivers.base import ToolCall
from app.runner.progress import LiveStep
from app.runner.streaming import StepConsumer

PART = "agent-text:1"


def delta(
    session_id: uuid.UUID, message_id: uuid.UUID, offset: int, text: str
) -> TextDelta:
    return TextDelta(
        session_id,
        message_id,
        1,
        "turn_1",
        PART,
        offset,
        text,
        "output.message.delta",
        f"event_{offset}",
        "2026-12-03T00:00:00.000Z",
    )


def started(session_id: uuid.UUID, message_id: uuid.UUID, text: str) -> PartStarted:
    part = {"part_id": PART, "sequence": 1, "type": "text", "text": text}
    return PartStarted(session_id, message_id, 1, "turn_1", part)


def delta_outs(pending: list[Out]) -> list[DeltaOut]:
    """The deltas a subscriber has queued, those of one pass's run each on its own."""
    outs: list[DeltaOut] = []
    for item in pending:
        if isinstance(item, Deltas):
            outs += item.items
        elif isinstance(item, DeltaOut):
            outs.append(item)
    return outs


def accumulated(out: DeltaOut) -> str:
    data = orjson.loads(out.sse_frame.split(b"data: ", 1)[1])
    text: str = data["data"]["accumulated"]
    return text


@pytest.fixture
def ids() -> tuple[uuid.UUID, uuid.UUID]:
    return uuid.uuid4(), uuid.uuid4()


async def test_an_sse_frame_built_late_carries_the_text_as_it_stood_at_its_delta(
    ids: tuple[uuid.UUID, uuid.UUID],
) -> None:
    session_id, message_id = ids
    fanout = Fanout(None, 100)  # type: ignore[arg-type]
    sub = fanout.subscribe(session_id)
    fanout.deliver(started(session_id, message_id, "Hi"))
    for offset, text in ((2, " there"), (8, ", you"), (13, "!")):
        fanout.deliver(delta(session_id, message_id, offset, text))
    await asyncio.sleep(0)  # live items reach the subscribers on the next turn
    outs = delta_outs(sub.pending)
    assert len(outs) == 3
    # Read last to first: each frame is built after every delta has arrived.
    assert [accumulated(out) for out in reversed(outs)] == [
        "Hi there, you!",
        "Hi there, you",
        "Hi there",
    ]
    fanout.unsubscribe(sub)


async def test_no_sse_frame_is_encoded_when_no_stream_asks(
    ids: tuple[uuid.UUID, uuid.UUID], monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, message_id = ids
    encoded: list[str] = []
    real = frames.delta_event

    def counting(item: TextDelta, text: str, retry_ms: int) -> bytes:
        encoded.append(text)
        return real(item, text, retry_ms)

    monkeypatch.setattr(frames, "delta_event", counting)
    fanout = Fanout(None, 1000)  # type: ignore[arg-type]
    sub = fanout.subscribe(session_id)
    fanout.deliver(started(session_id, message_id, ""))
    for index in range(200):
        fanout.deliver(delta(session_id, message_id, index, "x"))
    await asyncio.sleep(0)
    outs = delta_outs(sub.pending)
    assert len(outs) == 200
    assert all(out.mutation_frame for out in outs)
    assert encoded == []
    frame = outs[-1].sse_frame
    assert outs[-1].sse_frame is frame
    assert encoded == ["x" * 200]
    fanout.unsubscribe(sub)


async def test_a_part_started_again_replaces_what_its_deltas_added(
    ids: tuple[uuid.UUID, uuid.UUID],
) -> None:
    """A runner republishes its parts (a process joined mid-stream, or an Action moved
    the step on): the part then carries its whole text, and later deltas extend it."""
    session_id, message_id = ids
    fanout = Fanout(None, 100)  # type: ignore[arg-type]
    fanout.deliver(started(session_id, message_id, ""))
    fanout.deliver(delta(session_id, message_id, 0, "abc"))
    fanout.deliver(started(session_id, message_id, "abc"))
    fanout.deliver(delta(session_id, message_id, 3, "def"))
    [(_, parts)] = fanout.live_parts(session_id)
    assert [part["text"] for part in parts] == ["abcdef"]


class Published:
    """The fence's publish, recorded."""

    def __init__(self) -> None:
        self.items: list[object] = []

    async def publish(self, session_id: uuid.UUID, item: object) -> None:
        self.items.append(item)


def new_step() -> LiveStep:
    return LiveStep(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), 1, 1)


async def test_the_runner_joins_a_parts_text_when_it_is_read() -> None:
    step = new_step()
    published = Published()
    consumer = StepConsumer(published, step, "scripted")  # type: ignore[arg-type]
    part = await consumer.start({"type": "text", "text": ""})
    for piece in ("one ", "two ", "three"):
        await consumer.delta(part, piece, "output.message.delta")
    assert step.settled()[0]["text"] == "one two three"
    # Announced again (a republish): the part carries its whole text.
    assert step.part_started(part).part["text"] == "one two three"
    await consumer.delta(part, "!", "output.message.delta")
    assert step.settled()[0]["text"] == "one two three!"
    offsets = [item.offset for item in published.items if hasattr(item, "offset")]
    assert offsets == [0, 4, 8, 13]


async def test_a_completed_tool_call_keeps_its_arguments_not_its_streamed_input() -> (
    None
):
    step = new_step()
    consumer = StepConsumer(Published(), step, "scripted")  # type: ignore[arg-type]
    part = await consumer.start(
        {
            "type": "tool_call",
            "id": "call_1",
            "name": "lookup",
            "arguments": {},
            "status": "input_streaming",
            "input_text": "",
        }
    )
    consumer.tool_parts["call_1"] = part
    await consumer.delta(part, '{"query": ', "tool.input.delta", tool_call_id="call_1")
    await consumer.tool_call(ToolCall("call_1", "lookup", {"query": "x"}))
    step.joined()
    [streamed] = step.parts
    assert "input_text" not in streamed
    assert streamed["arguments"] == {"query": "x"}
    assert streamed["status"] == "ready"
