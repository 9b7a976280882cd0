"""`python -m bench.long_reply`: what a live delta costs as a reply grows, in process.

A reply of N chunks of 1 KB is streamed through the runner's step projection (each
delta appended to its part and published to a recording fence) and through the
fan-out's projection (each delta projected and encoded for the Mutation stream; the
`/sse` frame, which carries the whole text so far, only when a stream asks). Linear
cost reads 8.0x from 1,000 to 8,000 chunks; each delta re-copying the text so far
reads about 64x.

    python -m bench.long_reply [--sizes 1000,2000,4000,8000] [--chunk 1024]
"""

import argparse
import asyncio
import sys
import time
import uuid

from app.live.fanout import Fanout
from app.live.items import PartStarted, TextDelta
from app.runner.progress import LiveStep
from app.runner.streaming import StepConsumer


class Recorded:
    """The runner's fence: publishing only counts."""

    def __init__(self) -> None:
        self.count = 0

    async def publish(self, session_id: uuid.UUID, item: object) -> None:
        self.count += 1


def fanout_seconds(chunks: int, size: int) -> float:
    fanout = Fanout(None, 100)  # type: ignore[arg-type]
    session_id, message_id = uuid.uuid4(), uuid.uuid4()
    part = {"part_id": "agent-text:1", "sequence": 1, "type": "text", "text": ""}
    fanout.deliver(PartStarted(session_id, message_id, 1, "turn_1", part))
    text = "x" * size
    began = time.perf_counter()
    for index in range(chunks):
        fanout.deliver(
            TextDelta(
                session_id,
                message_id,
                1,
                "turn_1",
                "agent-text:1",
                index * size,
                text,
                "output.message.delta",
                "event_1",
                "2026-12-03T00:00:00.000Z",
            )
        )
    return time.perf_counter() - began


async def runner_seconds(chunks: int, size: int) -> float:
    step = LiveStep(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), 1, 1)
    consumer = StepConsumer(Recorded(), step, "bench")  # type: ignore[arg-type]
    part = await consumer.start({"type": "text", "text": ""})
    text = "x" * size
    began = time.perf_counter()
    for _ in range(chunks):
        await consumer.delta(part, text, "output.message.delta")
    step.joined()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,2000,4000,8000")
    parser.add_argument("--chunk", type=int, default=1024)
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    rows = []
    for chunks in sizes:
        rows.append(
            (
                chunks,
                fanout_seconds(chunks, args.chunk),
                asyncio.run(runner_seconds(chunks, args.chunk)),
            )
        )
    first = rows[0]
    lines = [
        f"| chunks of {args.chunk} B | fan-out s | vs first | runner s | vs first |",
        "|---|---|---|---|---|",
    ]
    for chunks, fanout, runner in rows:
        lines.append(
            f"| {chunks:,} | {fanout:.3f} | {fanout / first[1]:.1f}x "
            f"| {runner:.3f} | {runner / first[2]:.1f}x |"
        )
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
