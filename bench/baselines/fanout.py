"""What the two fan-out baselines share: the subscriber hub, the publisher (one turn of
`chunk<i> ` deltas at a fixed pace, each stamped with its send time) and frames shaped
like the service's, so every target puts the same bytes on the wire per delta.

Shapes: `mutation` (the Mutation stream's `delta` frame, plus `ts`) and `sse`
(upstream's `output.message.delta` envelope, whose `accumulated` grows with the turn).
"""

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import orjson

T = TypeVar("T")
QUEUE_SIZE = 100_000


def event_ts() -> str:
    """The service's event `ts`: RFC 3339 UTC, millisecond precision."""
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


@dataclass
class Turn:
    """The ids and text state of one published turn."""

    message_id: str = field(default_factory=lambda: f"message_{uuid.uuid4().hex}")
    session_id: str = field(default_factory=lambda: f"session_{uuid.uuid4().hex}")
    turn_id: str = field(default_factory=lambda: f"turn_{uuid.uuid4().hex}")
    accumulated: str = ""

    def delta(self, shape: str, text: str) -> tuple[str, bytes]:
        """(event name, JSON data) for the next delta."""
        offset = len(self.accumulated)
        self.accumulated += text
        ts = event_ts()
        if shape == "sse":
            body: dict[str, Any] = {
                "id": f"event_{uuid.uuid4().hex}",
                "type": "output.message.delta",
                "ts": ts,
                "session_id": self.session_id,
                "context": {"turn_id": self.turn_id},
                "data": {
                    "turn_id": self.turn_id,
                    "delta": text,
                    "accumulated": self.accumulated,
                    "message_id": self.message_id,
                },
            }
            return "output.message.delta", orjson.dumps(body)
        body = {
            "message_id": self.message_id,
            "revision": 1,
            "part_id": "agent-text:1",
            "offset": offset,
            "text": text,
            "ts": ts,
        }
        return "delta", orjson.dumps(body)


@dataclass
class Hub(Generic[T]):
    """Subscriber queues. A subscriber that falls a whole queue behind is dropped (its
    queue gets `None`), as the service drops a slow consumer."""

    queues: set["asyncio.Queue[T | None]"] = field(default_factory=set)

    def subscribe(self) -> "asyncio.Queue[T | None]":
        queue: asyncio.Queue[T | None] = asyncio.Queue(QUEUE_SIZE)
        self.queues.add(queue)
        return queue

    def unsubscribe(self, queue: "asyncio.Queue[T | None]") -> None:
        self.queues.discard(queue)

    def offer(self, item: T) -> None:
        for queue in tuple(self.queues):
            try:
                queue.put_nowait(item)
            except asyncio.QueueFull:
                self.queues.discard(queue)
                queue.get_nowait()
                queue.put_nowait(None)


async def publish(
    hub: Hub[T],
    encode: Callable[[str, bytes], T],
    *,
    shape: str,
    count: int,
    interval: float,
    text: str | None = None,
) -> dict[str, Any]:
    """One turn: `count` deltas, `interval` apart, each encoded once and offered to
    every subscriber. Delta i is due `interval` x (i + 1) after the start, as the
    scripted model paces its chunks (a provider's pace does not wait for its reader)."""
    turn = Turn()
    started = time.monotonic()
    for index in range(count):
        if interval > 0:
            due = started + interval * (index + 1)
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        event, data = turn.delta(shape, text if text is not None else f"chunk{index} ")
        hub.offer(encode(event, data))
    return {
        "published": count,
        "subscribers": len(hub.queues),
        "seconds": time.monotonic() - started,
    }


def query_params(raw: bytes) -> dict[str, str]:
    params: dict[str, str] = {}
    for pair in raw.decode().split("&"):
        key, _, value = pair.partition("=")
        if key:
            params[key] = value
    return params
