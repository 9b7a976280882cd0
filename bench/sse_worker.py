"""An SSE subscriber load generator: one process holding many raw sockets, run by
`bench.load.Subscribers` as `python -m bench.sse_worker '<json config>'`.

It costs little next to the server it measures: asyncio protocols (uvloop when present)
instead of streams. Once a subscriber has its first frame, a receipt costs a time stamp,
an append of the bytes as read and a count of the delta frames in them (for `complete`):
one core's worth of subscribers must not be what the latencies measure. De-chunking, SSE
framing and the fields of each frame (by byte search, no JSON parse) come after the run,
from the bytes and their receipt times, as do the latencies.

With `interval_ms` (the model's pace), each delta's latency is also counted from when
its model had it (`scheduled`): delta i of a turn is due `interval_ms` x i after the
turn's start, the earliest that every delta's `ts` allows. A server that publishes late
keeps its deltas' `ts` close to their receipt, but not their schedule.

With `stamps`, each subscriber has its own path (`paths`) and counts instead the send
times the model provider wrote into the text (`@<unix seconds>; `, see
`bench.baselines.provider`): each stamp's first arrival in any frame.

Protocol with the parent, one JSON object per line: the worker prints `connected`
(every connection answered or failed), `ready` (every connected subscriber received its
first frame), `complete` (every subscriber counted `expected` deltas), and `done` (after
the parent's `{"cmd": "finish"}` on stdin, or its own deadline) with the results.
"""

import asyncio
import bisect
import contextlib
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import orjson

# Frames that carry a streamed delta, on the Mutation stream and on upstream's /sse.
DELTA_EVENTS = (b"event: delta\n", b"event: output.message.delta\n")
# Bytes kept from one read to count a delta frame's line split between two.
SPLIT_TAIL = max(len(e) for e in DELTA_EVENTS) - 1
# Only deltas of the measured turn are counted: its chunks are `chunk<i> `.
MARKER = b"chunk"

Record = tuple[float, bytes, int, int, bytes | None, bytes | None, int]
# The deltas whose latency is also reported on its own: a turn's first ones, which
# wait behind whatever the start of the turn costs.
EARLY = 50
STAMP = re.compile(rb"@(\d+\.\d+); ")


def _field(frame: bytes, name: bytes) -> bytes | None:
    """The raw value of a JSON string field `"name":"..."` (no escapes expected)."""
    at = frame.find(name)
    if at < 0:
        return None
    start = at + len(name)
    return frame[start : frame.find(b'"', start)]


def _int_field(frame: bytes, name: bytes) -> int:
    at = frame.find(name)
    if at < 0:
        return -1
    start = at + len(name)
    end = start
    while end < len(frame) and 48 <= frame[end] <= 57:
        end += 1
    return int(frame[start:end]) if end > start else -1


class Dechunker:
    """HTTP/1.1 chunked transfer decoding, incremental."""

    def __init__(self) -> None:
        self.raw = bytearray()
        self.remaining = 0

    def feed(self, data: bytes) -> bytes:
        raw = self.raw
        raw += data
        out: list[bytes] = []
        while raw:
            if self.remaining == 0:
                line_end = raw.find(b"\r\n")
                if line_end < 0:
                    break
                line = bytes(raw[:line_end])
                del raw[: line_end + 2]
                if not line:
                    continue  # the CRLF that ends a chunk's data
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    break
                self.remaining = size
            take = min(self.remaining, len(raw))
            out.append(bytes(raw[:take]))
            del raw[:take]
            self.remaining -= take
        return b"".join(out)


class Subscriber(asyncio.Protocol):
    def __init__(self, worker: "Worker", request: bytes) -> None:
        self.worker = worker
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.status = 0
        self.chunks: Dechunker | None = None
        self.text = b""
        self.ready = False
        self.counted = 0
        self.records: list[Record] = []
        # Once ready (counting frames, not stamps): each read as received, parsed after
        # the run, and the end of the last read (a delta line split across two).
        self.received: list[tuple[float, bytes]] = []
        self.tail = b""
        self.live_count = 0
        # Parsing after the run: the worker was told what it had to be told.
        self.late = False
        # stamps mode: each stamp's first arrival.
        self.stamps: dict[bytes, float] = {}
        self.answered = asyncio.get_running_loop().create_future()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.answered.done():
            self.answered.set_result(0)

    def data_received(self, data: bytes) -> None:
        now = time.time()
        if self.ready and not self.worker.stamps:
            self.received.append((now, data))
            window, tail = self.tail + data, self.tail
            self.tail = window[-SPLIT_TAIL:]
            before = self.counted + self.live_count
            for event in DELTA_EVENTS:
                # A line that ends in this read but began in the last one counts now.
                self.live_count += window.count(event) - tail.count(event)
            if before < self.worker.expected <= self.counted + self.live_count:
                self.worker.on_complete()
            return
        self.process(data, now)

    def parse_received(self) -> None:
        """After the run: what was received once ready, parsed as it would have been."""
        received, self.received = self.received, []
        self.live_count = 0
        self.late = True
        for now, data in received:
            self.process(data, now)

    def process(self, data: bytes, now: float) -> None:
        if not self.status:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.head[:end].lower(), self.head[end + 4 :]
            self.head = b""
            try:
                self.status = int(head.split(b" ", 2)[1])
            except (IndexError, ValueError):
                self.status = -1
            if b"transfer-encoding: chunked" in head:
                self.chunks = Dechunker()
            if not self.answered.done():
                self.answered.set_result(self.status)
            if not data:
                return
        payload = self.chunks.feed(data) if self.chunks is not None else data
        if not payload:
            return
        text = self.text + payload
        if b"\r" in text:
            # sse-starlette separates lines with CRLF.
            text = text.replace(b"\r\n", b"\n")
        frames = text.split(b"\n\n")
        self.text = frames.pop()
        for frame in frames:
            if not frame or frame[0] == 58:  # ":" a comment (heartbeat, ping)
                continue
            if not self.ready:
                # The Mutation stream's opening `retry:` block is not the warm-up frame.
                if frame.startswith(b"retry:"):
                    continue
                self.ready = True
                self.worker.on_ready()
            if self.worker.stamps:
                self.count_stamps(frame, now)
            elif MARKER in frame and (
                DELTA_EVENTS[0] in frame or DELTA_EVENTS[1] in frame
            ):
                piece = _field(frame, b'"text":"')
                delta = _field(frame, b'"delta":"')
                self.records.append(
                    (
                        now,
                        _field(frame, b'"message_id":"') or b"",
                        _int_field(frame, b'"offset":'),
                        len(piece or b""),
                        _field(frame, b'"ts":"'),
                        delta,
                        # The delta's index in its turn: `chunk<i> `.
                        _int_field(delta or piece or b"", MARKER),
                    )
                )
                self.counted += 1
                if self.counted == self.worker.expected and not self.late:
                    self.worker.on_complete()

    def count_stamps(self, frame: bytes, now: float) -> None:
        stamps = self.stamps
        for stamp in STAMP.findall(frame):
            if stamp not in stamps:
                stamps[stamp] = now
                self.counted += 1
                if self.counted == self.worker.expected:
                    self.worker.on_complete()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()


@dataclass
class Worker:
    host: str
    port: int
    paths: list[str]
    headers: list[str]
    expected: int
    stamps: bool
    connect_timeout: float
    run_timeout: float
    # The model's pace (seconds between deltas), for latencies from its schedule.
    interval: float | None = None
    subscribers: list[Subscriber] = field(default_factory=list)
    ready_count: int = 0
    complete_count: int = 0
    connected_ok: int = 0
    connecting: bool = True
    announced_ready: bool = False
    announced_complete: bool = False

    def emit(self, event: str, **values: Any) -> None:
        sys.stdout.write(orjson.dumps({"event": event, **values}).decode() + "\n")
        sys.stdout.flush()

    def on_ready(self) -> None:
        self.ready_count += 1
        self.check()

    def on_complete(self) -> None:
        self.complete_count += 1
        self.check()

    def check(self) -> None:
        if self.connecting or self.connected_ok == 0:
            return
        if not self.announced_ready and self.ready_count >= self.connected_ok:
            self.announced_ready = True
            self.emit("ready", ready=self.ready_count)
        if (
            not self.announced_complete
            and self.expected > 0
            and self.complete_count >= self.connected_ok
        ):
            self.announced_complete = True
            self.emit("complete", complete=self.complete_count)

    def request(self, path: str) -> bytes:
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            "Accept: text/event-stream",
            "Cache-Control: no-cache",
            *self.headers,
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.connect_timeout
        statuses: dict[str, int] = {}
        failed = 0

        async def one(path: str) -> None:
            nonlocal failed
            sub = Subscriber(self, self.request(path))
            self.subscribers.append(sub)
            try:
                remaining = max(0.1, deadline - time.monotonic())
                await asyncio.wait_for(
                    loop.create_connection(lambda: sub, self.host, self.port), remaining
                )
                status = await asyncio.wait_for(
                    asyncio.shield(sub.answered), max(0.1, deadline - time.monotonic())
                )
            except (OSError, TimeoutError):
                status = 0
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if status == 200:
                self.connected_ok += 1
            else:
                failed += 1
                sub.close()

        # Opened in batches so the server's accept queue never overflows.
        batch = 50
        for start in range(0, len(self.paths), batch):
            if time.monotonic() > deadline:
                failed += len(self.paths) - start
                break
            await asyncio.gather(*(one(p) for p in self.paths[start : start + batch]))
        self.connecting = False
        self.emit("connected", ok=self.connected_ok, failed=failed, statuses=statuses)
        # Subscribers whose first frame arrived while others were still connecting.
        self.check()

    async def wait_for_finish(self) -> dict[str, Any]:
        """Until the parent says finish (with the probe's timestamp map, if any) or the
        run deadline passes."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
        )
        try:
            line = await asyncio.wait_for(reader.readline(), self.run_timeout)
        except TimeoutError:
            return {"cmd": "finish", "timed_out": True}
        if not line:
            return {"cmd": "finish", "parent_gone": True}
        command: dict[str, Any] = orjson.loads(line)
        return command


_TS_CACHE: dict[bytes, float] = {}


def parse_ts(value: bytes) -> float:
    """Event `ts` (RFC 3339, UTC, millisecond or finer) to epoch seconds."""
    cached = _TS_CACHE.get(value)
    if cached is None:
        text = value.decode().rstrip("Z")
        cached = datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
        _TS_CACHE[value] = cached
    return cached


def summarize(
    subscribers: list[Subscriber],
    ts_map: dict[str, list[list[float]]] | None,
    interval: float | None = None,
) -> dict[str, Any]:
    """Per (subscriber, delta): receipt time minus the delta's server timestamp, taken
    from the frame itself or, for frames without one (the Mutation stream), from the
    probe's map of (message, text end offset) -> ts. A frame that covers several deltas
    (coalesced text) delivers each of them. With `interval` (seconds), receipt time
    minus the delta's place in its model's schedule too (`scheduled_ms`)."""
    ends: dict[bytes, tuple[list[int], list[float]]] = {}
    for name, pairs in (ts_map or {}).items():
        ordered = sorted(pairs)
        ends[name.encode()] = (
            [int(e) for e, _ in ordered],
            [t for _, t in ordered],
        )
    # Where each turn's schedule begins: the earliest start its deltas' `ts` allow (no
    # delta is published before it is due, so a late first delta does not move it).
    anchors: dict[bytes, float] = {}
    if interval is not None:
        for message, (_, ts_list) in ends.items():
            if ts_list:
                anchors[message] = min(t - interval * i for i, t in enumerate(ts_list))
        for sub in subscribers:
            for _, message_id, _, _, ts, _, chunk in sub.records:
                if ts is not None and chunk >= 0:
                    start = parse_ts(ts) - interval * chunk
                    if start < anchors.get(message_id, start + 1):
                        anchors[message_id] = start
    latencies: list[float] = []
    early: list[float] = []
    scheduled: list[float] = []
    received: list[int] = []
    first_sent = float("inf")
    last_received = 0.0
    for sub in subscribers:
        if sub.status != 200:
            continue
        seen: set[tuple[bytes, object]] = set()
        for now, message_id, offset, length, ts, delta, chunk in sub.records:
            if ts is not None:
                key: tuple[bytes, object] = (
                    message_id,
                    delta if delta is not None else offset,
                )
                if key in seen:
                    continue
                seen.add(key)
                sent = parse_ts(ts)
                latencies.append(now - sent)
                anchor = anchors.get(message_id)
                if interval is not None and anchor is not None and chunk >= 0:
                    scheduled.append(now - (anchor + interval * chunk))
                if 0 <= chunk < EARLY:
                    early.append(now - sent)
                first_sent = min(first_sent, sent)
                last_received = max(last_received, now)
                continue
            known = ends.get(message_id)
            if known is None or offset < 0:
                continue
            end_list, ts_list = known
            low = bisect.bisect_right(end_list, offset)
            high = bisect.bisect_right(end_list, offset + length)
            for index in range(low, high):
                key = (message_id, end_list[index])
                if key in seen:
                    continue
                seen.add(key)
                latencies.append(now - ts_list[index])
                if interval is not None:
                    scheduled.append(now - (anchors[message_id] + interval * index))
                if index < EARLY:
                    early.append(now - ts_list[index])
                first_sent = min(first_sent, ts_list[index])
                last_received = max(last_received, now)
        received.append(len(seen))
    return {
        "received": received,
        "latencies_ms": [round(value * 1000, 3) for value in latencies],
        "early_ms": [round(value * 1000, 3) for value in early],
        "scheduled_ms": [round(value * 1000, 3) for value in scheduled],
        "first_sent": first_sent if latencies else None,
        "last_received": last_received if latencies else None,
    }


def stamp_summary(subscribers: list[Subscriber]) -> dict[str, Any]:
    """Per (subscriber, stamp): its first arrival minus the send time it carries."""
    latencies: list[float] = []
    received: list[int] = []
    for sub in subscribers:
        if sub.status != 200:
            continue
        received.append(len(sub.stamps))
        latencies += [now - float(stamp) for stamp, now in sub.stamps.items()]
    return {
        "received": received,
        "latencies_ms": [round(value * 1000, 3) for value in latencies],
        "early_ms": [],
        "scheduled_ms": [],
        "first_sent": None,
        "last_received": None,
    }


async def main(config: dict[str, Any]) -> None:
    paths = config.get("paths") or [config["path"]] * int(config["count"])
    worker = Worker(
        host=config["host"],
        port=int(config["port"]),
        paths=list(paths),
        headers=list(config.get("headers", [])),
        expected=int(config.get("expected", 0)),
        stamps=bool(config.get("stamps")),
        connect_timeout=float(config.get("connect_timeout", 60)),
        run_timeout=float(config.get("run_timeout", 300)),
        interval=(
            float(config["interval_ms"]) / 1000 if config.get("interval_ms") else None
        ),
    )
    await worker.connect()
    command = await worker.wait_for_finish()
    for sub in worker.subscribers:
        sub.close()
        sub.parse_received()
    ts_map = None
    if command.get("ts_map"):
        with open(command["ts_map"], "rb") as handle:  # noqa: ASYNC230  # after the run: blocking is harmless
            ts_map = orjson.loads(handle.read())
    result = (
        stamp_summary(worker.subscribers)
        if worker.stamps
        else summarize(worker.subscribers, ts_map, worker.interval)
    )
    result["connected"] = worker.connected_ok
    result["ready"] = worker.ready_count
    result["timed_out"] = bool(command.get("timed_out"))
    out_path = config["result_path"]
    with open(out_path, "wb") as handle:  # noqa: ASYNC230
        handle.write(orjson.dumps(result))
    worker.emit("done", connected=worker.connected_ok)
    await asyncio.sleep(0)


def run() -> None:
    config = orjson.loads(sys.argv[1])
    try:
        import uvloop
    except ImportError:
        asyncio.run(main(config))
    else:
        with contextlib.suppress(KeyboardInterrupt):
            uvloop.run(main(config))


if __name__ == "__main__":
    run()
