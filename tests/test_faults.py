"""Faults a deployment meets under load, against real server processes, on both lanes.

* Concurrent writers: fifty HTTP writers post while a second process writes to the same
  database through the application's own code (and the `keys create` CLI runs). On
  SQLite that second process competes for the one write lock: nothing may surface as
  `database is locked` (in a response or the server log) and nothing may be a 5xx.
* A slow SSE consumer: a client that connects and stops reading must not slow down the
  producer (the turn) or another subscriber, must be dropped once its bounded buffer is
  full (SSE_QUEUE_SIZE, SSE_SEND_TIMEOUT_SECONDS), and must catch up when it reconnects
  from the cursor it had.
* A model chunk larger than a PostgreSQL NOTIFY payload reaches both streams whole.

The long-running fault scripts (PostgreSQL restart, SIGKILL under load, soak) live in
scripts/ and are described in docs/reliability.md.
"""

import asyncio
import os
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from app.settings import Settings
from tests.support.api import all_messages, list_events
from tests.support.lanes import ROOT
from tests.support.servers import Server, server_process
from tests.support.waits import wait_idle

pytestmark = pytest.mark.e2e

TEST_DEADLINE = 60.0
HTTP_WRITERS = 50
POSTS_PER_WRITER = 4
LOCKED = "database is locked"


def body(text: str, client_message_id: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"message": {"content": [{"type": "text", "text": text}]}}
    if client_message_id is not None:
        out["client_message_id"] = client_message_id
    return out


# ---- (a) concurrent writers, one of them another process ----------------------------


def second_writer() -> None:
    """Run in a separate process (see below): write through the application's own
    Database (same engines, pragmas, BEGIN IMMEDIATE, busy timeout) as fast as it can
    until the stop file appears. Prints how many transactions committed."""
    from app import auth
    from app.db.session import Database

    async def main() -> int:
        stop = os.environ["STOP_FILE"]
        database = Database.from_settings(Settings())
        committed = 0
        try:
            while not os.path.exists(stop):  # noqa: ASYNC240 (a stat per write)
                async with database.write() as db:
                    await auth.create_key(
                        db, organization_id=uuid.uuid4(), name=f"bg-{committed}"
                    )
                committed += 1
        finally:
            await database.dispose()
        return committed

    print(asyncio.run(main()))


async def run_cli(database_url: str, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        *args,
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_concurrent_writers_and_a_second_writer_process(
    settings: Settings, tmp_path: Path
) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        url = settings.database_url
        code, out = await run_cli(
            url, "keys", "create", "--org", "org_" + uuid.uuid4().hex
        )
        assert code == 0, out
        key = out.splitlines()[0].strip()
        stop_file = tmp_path / "stop-writer"
        writer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from tests.test_faults import second_writer; second_writer()",
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": url, "STOP_FILE": str(stop_file)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with (
                server_process(url, tmp_path, RATE_LIMIT_PER_SECOND="0") as server,
                httpx.AsyncClient(
                    base_url=server.url,
                    timeout=httpx.Timeout(45.0),
                    headers={"Authorization": f"Bearer {key}"},
                    limits=httpx.Limits(max_connections=HTTP_WRITERS),
                ) as http,
            ):
                sessions = []
                for i in range(10):
                    created = await http.post("/v1/sessions", json={"title": f"w{i}"})
                    assert created.status_code == 201, created.text
                    sessions.append(created.json()["id"])
                responses: list[httpx.Response] = []

                latencies: list[float] = []

                async def post(index: int) -> None:
                    sid = sessions[index % len(sessions)]
                    for n in range(POSTS_PER_WRITER):
                        started = time.monotonic()
                        responses.append(
                            await http.post(
                                f"/v1/sessions/{sid}/messages",
                                json=body(f"writer {index} post {n}", f"{index}-{n}"),
                            )
                        )
                        latencies.append(time.monotonic() - started)

                async def cli_writes() -> list[tuple[int, str]]:
                    return [
                        await run_cli(
                            url, "keys", "create", "--org", "org_" + uuid.uuid4().hex
                        )
                        for _ in range(3)
                    ]

                cli_task = asyncio.create_task(cli_writes())
                await asyncio.gather(*(post(i) for i in range(HTTP_WRITERS)))
                cli_results = await cli_task
                for sid in sessions:
                    await wait_idle(http, sid, 30)
                events = [
                    (await http.get(f"/v1/sessions/{sid}/events")).json()["data"]
                    for sid in sessions
                ]
        finally:
            stop_file.touch()
            writer_out, _ = await asyncio.wait_for(writer.communicate(), 20)
        statuses = [r.status_code for r in responses]
        assert len(statuses) == HTTP_WRITERS * POSTS_PER_WRITER
        assert all(s == 201 for s in statuses), sorted(set(statuses))
        assert not [r.text for r in responses if LOCKED in r.text]
        server_log = server.log.read_text()
        assert LOCKED not in server_log, server_log[-3000:]
        assert "Traceback" not in server_log, server_log[-3000:]
        assert writer.returncode == 0, writer_out.decode()[-3000:]
        committed = int(writer_out.decode().split()[-1])
        assert committed > 0
        print(
            f"{len(responses)} posts from {HTTP_WRITERS} writers: max "
            f"{max(latencies):.2f} s, median {statistics.median(latencies):.3f} s; "
            f"the second process committed {committed} write transactions meanwhile"
        )
        for code, out in cli_results:
            assert code == 0, out
            assert LOCKED not in out
        # The writes interleaved without disturbing the per-session sequences.
        for session_events in events:
            sequences = [e["sequence"] for e in session_events]
            assert sequences == list(range(1, len(sequences) + 1))


# ---- (b) a slow SSE consumer ---------------------------------------------------------

QUEUE_SIZE = 16
SEND_TIMEOUT = 3.0
# On loopback the kernel alone buffers about 3 MB for a socket that is not read (its
# send buffer starts at 2 x initial cwnd x 64 kB MSS), so a consumer must be sent more
# than that before it is stuck. Each prefill turn is a ~950 kB user message (five
# 190 kB text parts) answered by the short citations scenario: ~1 MB on the Mutation
# stream (the snapshot), ~3 MB on /sse (input.message and turn.started carry it too).
PREFILL_TURNS = 5
PREFILL_BODY = {
    "message": {
        "content": [
            {"type": "text", "text": "/scenario citations"},
            *({"type": "text", "text": "x" * 190_000} for _ in range(5)),
        ]
    }
}
CITATION_DELTAS = 6
DELTAS = 600
DELTA = b"output.message.delta"


@dataclass
class Received:
    """What a raw-socket SSE reader saw: frames as (event, id, data) and, for upstream
    deltas, the delay from the server's `ts` to their arrival here."""

    frames: list[tuple[bytes, str | None, bytes]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    nbytes: int = 0
    eof: bool = False

    def count(self, event: bytes) -> int:
        return sum(1 for f in self.frames if f[0] == event)


def parse_frames(buffer: bytes, out: Received, now: float) -> bytes:
    """Move the complete frames of `buffer` into `out`; return the incomplete rest.
    Chunked-encoding size lines are skipped (they are neither fields nor blank)."""
    while True:
        end = buffer.find(b"\n\n")
        if end < 0:
            return buffer
        block, buffer = buffer[:end], buffer[end + 2 :]
        event, event_id, data = b"", None, b""
        for line in block.split(b"\n"):
            line = line.rstrip(b"\r")
            if line.startswith(b"event: "):
                event = line[7:]
            elif line.startswith(b"id: "):
                event_id = line[4:].decode()
            elif line.startswith(b"data: "):
                data = line[6:]
        if not event:
            continue
        out.frames.append((event, event_id, data))
        if event == DELTA:
            at = data.find(b'"ts":"') + 6
            sent = (
                datetime.strptime(data[at : at + 24].decode(), "%Y-%m-%dT%H:%M:%S.%fZ")
                .replace(tzinfo=UTC)
                .timestamp()
            )
            out.latencies.append(now - sent)


@dataclass
class RawStream:
    """A plain-socket SSE GET that reads only when asked (no background reader), so a
    client that stops reading really stops. With `rcvbuf`, a small receive buffer."""

    sock: socket.socket
    out: Received = field(default_factory=Received)
    rest: bytes = b""

    @classmethod
    async def open(
        cls,
        server: Server,
        path: str,
        headers: dict[str, str] | None = None,
        rcvbuf: int = 0,
    ) -> "RawStream":
        loop = asyncio.get_running_loop()
        host, port = server.url.removeprefix("http://").split(":")
        sock = socket.socket()
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, int(port)))
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        await loop.sock_sendall(
            sock,
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\n"
            f"Accept: text/event-stream\r\n{extra}\r\n".encode(),
        )
        head = b""
        async with asyncio.timeout(10):
            while b"\r\n\r\n" not in head:
                chunk = await loop.sock_recv(sock, 4096 if rcvbuf else 65536)
                assert chunk, f"connection closed before the response head: {head!r}"
                head += chunk
        head, _, rest = head.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        stream = cls(sock)
        stream.out.nbytes = len(rest)
        stream.rest = parse_frames(rest, stream.out, time.time())
        return stream

    async def read_until(self, done: Callable[[Received], bool], within: float) -> None:
        """Read and parse until `done(out)` or the end of the stream; TimeoutError
        after `within` seconds."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(within):
            while not done(self.out):
                chunk = await loop.sock_recv(self.sock, 1 << 20)
                if not chunk:
                    self.out.eof = True
                    return
                self.out.nbytes += len(chunk)
                self.rest = parse_frames(self.rest + chunk, self.out, time.time())

    def close(self) -> None:
        self.sock.close()


def counted(event: bytes, n: int) -> Callable[[Received], bool]:
    return lambda out: out.count(event) >= n


@dataclass
class Run:
    seconds: float  # from the first post to the end of the long turn
    turn_ms: int  # the long turn's own duration (turn.completed duration_ms)
    observer: Received


async def observed_workload(
    server: Server,
    http: httpx.AsyncClient,
    session_id: str,
) -> Run:
    """With an upstream-stream subscriber reading normally: PREFILL_TURNS turns of a
    ~950 kB user message, then a `/scenario long DELTAS` turn. Returns the wall time of the
    whole workload, the long turn's own duration and what the subscriber saw."""
    observer = await RawStream.open(server, f"/v1/sessions/{session_id}/sse")
    try:
        await observer.read_until(counted(b"connected", 1), 10)
        started = time.monotonic()
        for turn in range(1, PREFILL_TURNS + 1):
            posted = await http.post(
                f"/v1/sessions/{session_id}/messages", json=PREFILL_BODY
            )
            assert posted.status_code == 201, posted.text
            await observer.read_until(counted(b"session.idled", turn), 20)
        posted = await http.post(
            f"/v1/sessions/{session_id}/messages", json=body(f"/scenario long {DELTAS}")
        )
        assert posted.status_code == 201, posted.text
        await observer.read_until(counted(b"session.idled", PREFILL_TURNS + 1), 30)
        seconds = time.monotonic() - started
    finally:
        observer.close()
    completed = [f for f in observer.out.frames if f[0] == b"turn.completed"][-1]
    return Run(seconds, orjson.loads(completed[2])["data"]["duration_ms"], observer.out)


def stream_path(kind: str, session_id: str) -> str:
    if kind == "sse":
        return f"/v1/sessions/{session_id}/sse?after_sequence=0"
    return f"/v1/sessions/{session_id}/messages/stream?after=0"


def merged(frames: list[tuple[bytes, str | None, bytes]]) -> dict[str, Any]:
    """The Mutation-stream client rule: keep the highest revision of each message."""
    view: dict[str, dict[str, Any]] = {}
    for event, _, data in frames:
        if event == b"message":
            message = orjson.loads(data)["message"]
            held = view.get(message["id"])
            if held is None or held["revision"] < message["revision"]:
                view[message["id"]] = message
    return view


def durable_ids(frames: list[tuple[bytes, str | None, bytes]]) -> list[str]:
    seen: list[str] = []
    for _, event_id, _ in frames:
        if event_id is not None and event_id not in seen:
            seen.append(event_id)
    return seen


async def catch_up(
    server: Server, http: httpx.AsyncClient, kind: str, session_id: str, got: Received
) -> None:
    """Reconnect from the last cursor the slow client received and read until it holds
    what the API lists (durable events for /sse, message snapshots for the Mutation
    stream); TimeoutError if it never does."""
    cursor = next((f[1] for f in reversed(got.frames) if f[1] is not None), None)
    assert cursor is not None, "the slow client got no durable frame before the drop"
    if kind == "sse":
        path, headers = f"/v1/sessions/{session_id}/sse", {"Last-Event-ID": cursor}
        stored_ids: list[str] = [e["id"] for e in await list_events(http, session_id)]

        def converged(o: Received) -> bool:
            return durable_ids(got.frames + o.frames) == stored_ids
    else:
        path, headers = f"/v1/sessions/{session_id}/messages/stream?after={cursor}", {}
        listed = await all_messages(http, session_id)
        stored: dict[str, Any] = {m["id"]: m for m in listed}

        def converged(o: Received) -> bool:
            return merged(got.frames + o.frames) == stored

    assert not converged(Received()), "the slow client was sent everything"
    resumed = await RawStream.open(server, path, headers)
    try:
        await resumed.read_until(converged, 15)
    finally:
        resumed.close()
    assert converged(resumed.out)
    if kind == "sse":
        again = [f[1] for f in resumed.out.frames if f[1] is not None]
        assert len(again) == len(set(again)), "the resume repeated events"
        assert not set(again) & {f[1] for f in got.frames}, "the resume overlapped"


@pytest.mark.parametrize("kind", ["sse", "mutation"])
async def test_slow_consumer_is_dropped_without_slowing_anyone(
    settings: Settings, tmp_path: Path, kind: str
) -> None:
    async with (
        asyncio.timeout(TEST_DEADLINE),
        server_process(
            settings.database_url,
            tmp_path,
            SCRIPTED_DELAY_MS="5",
            SSE_QUEUE_SIZE=str(QUEUE_SIZE),
            SSE_SEND_TIMEOUT_SECONDS=str(SEND_TIMEOUT),
            RATE_LIMIT_PER_SECOND="0",
        ) as server,
        httpx.AsyncClient(base_url=server.url, timeout=20) as http,
    ):
        baseline_sid = (await http.post("/v1/sessions", json={})).json()["id"]
        baseline = await observed_workload(server, http, baseline_sid)

        sid = (await http.post("/v1/sessions", json={})).json()["id"]
        # The slow client connects and then reads nothing while the workload runs.
        slow = await RawStream.open(server, stream_path(kind, sid), rcvbuf=4096)
        # Its first frame, which the server sends once the stream is subscribed.
        await slow.read_until(lambda out: out.nbytes > 0, 10)
        try:
            with_slow = await observed_workload(server, http, sid)
            ended = time.monotonic()
            # The server gave up on it: reading now drains what the socket buffers
            # held and then meets the end of the stream.
            await slow.read_until(lambda _: False, SEND_TIMEOUT + 15)
            drained_in = time.monotonic() - ended
        finally:
            slow.close()
        got = slow.out
        await catch_up(server, http, kind, sid, got)

    # It was cut off (catch_up checked it lacked the end of the stream) after what the
    # socket buffers held, about 3 MB on loopback, not the whole stream.
    assert got.eof
    assert got.nbytes < 5_000_000, got.nbytes
    assert drained_in < SEND_TIMEOUT + 15
    # Nobody waited for it: the other subscriber saw every delta, promptly, and the
    # workload took about as long as without the slow client. A producer that waited
    # on the stuck client would stall for SEND_TIMEOUT seconds.
    for run in (baseline, with_slow):
        assert len(run.observer.latencies) == PREFILL_TURNS * CITATION_DELTAS + DELTAS
    base_p50 = statistics.median(baseline.observer.latencies)
    slow_p50 = statistics.median(with_slow.observer.latencies)
    assert slow_p50 <= 3 * base_p50 + 0.05, (base_p50, slow_p50)
    worst = max(with_slow.observer.latencies)
    print(
        f"{kind}: other subscriber's delta latency p50 {base_p50 * 1000:.1f} -> "
        f"{slow_p50 * 1000:.1f} ms, max {max(baseline.observer.latencies) * 1000:.0f} -> "
        f"{worst * 1000:.0f} ms; workload {baseline.seconds:.2f} -> "
        f"{with_slow.seconds:.2f} s, long turn {baseline.turn_ms} -> "
        f"{with_slow.turn_ms} ms; slow client got {got.nbytes / 1e6:.2f} MB, then "
        f"end of stream {drained_in:.2f} s after the workload"
    )
    assert worst < SEND_TIMEOUT / 2, f"a delta waited {worst:.2f} s"
    assert with_slow.seconds <= 1.5 * baseline.seconds + 1.5, (
        baseline.seconds,
        with_slow.seconds,
    )
    assert with_slow.turn_ms <= 1.5 * baseline.turn_ms + 1500, (
        baseline.turn_ms,
        with_slow.turn_ms,
    )


# ---- (c) a live item larger than one NOTIFY payload -----------------------------------

BIG_WORD = "y" * 20_000


async def test_a_delta_larger_than_a_notify_payload_reaches_subscribers(
    settings: Settings, tmp_path: Path
) -> None:
    """PostgreSQL refuses NOTIFY payloads of 8000 bytes or more; the bus splits a
    larger delta into pieces whose offsets continue one another. A model chunk of
    20 kB (one echoed word) must reach both streams whole, on either bus."""
    async with (
        asyncio.timeout(TEST_DEADLINE),
        server_process(settings.database_url, tmp_path) as server,
        httpx.AsyncClient(base_url=server.url, timeout=20) as http,
    ):
        sid = (await http.post("/v1/sessions", json={})).json()["id"]
        sse = await RawStream.open(server, f"/v1/sessions/{sid}/sse")
        mutations = await RawStream.open(server, f"/v1/sessions/{sid}/messages/stream")
        try:
            await sse.read_until(counted(b"connected", 1), 10)
            posted = await http.post(
                f"/v1/sessions/{sid}/messages", json=body(BIG_WORD)
            )
            assert posted.status_code == 201, posted.text
            await sse.read_until(counted(b"session.idled", 1), 20)
            await mutations.read_until(
                lambda o: any(
                    f[0] == b"message"
                    and b'"role":"agent"' in f[2]
                    and b'"state":"done"' in f[2]
                    for f in o.frames
                ),
                20,
            )
        finally:
            sse.close()
            mutations.close()
    streamed = "".join(
        orjson.loads(f[2])["data"]["delta"] for f in sse.out.frames if f[0] == DELTA
    )
    assert streamed == BIG_WORD
    live = "".join(
        orjson.loads(f[2])["text"] for f in mutations.out.frames if f[0] == b"delta"
    ) + "".join(
        orjson.loads(f[2])["part"].get("text", "")
        for f in mutations.out.frames
        if f[0] == b"part"
    )
    assert live == BIG_WORD
