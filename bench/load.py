"""Load generators: wrk for HTTP (plain GETs and a Lua script for the writers), SSE
subscriber processes (`bench.sse_worker`), and the one probe connection on `/sse` that
timestamps the service's deltas for the Mutation stream, whose frames carry no `ts`."""

import asyncio
import contextlib
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.servers import BENCH_ROOT, BenchError, Proc, python_env, spawn
from bench.sse_worker import Dechunker, parse_ts

# ---- wrk -------------------------------------------------------------------------------


@dataclass
class WrkResult:
    requests_per_s: float
    requests: int
    p50_ms: float
    p99_ms: float
    errors: int
    non_2xx_3xx: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests_per_s": round(self.requests_per_s, 1),
            "requests": self.requests,
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "errors": self.errors,
            "non_2xx_3xx": self.non_2xx_3xx,
        }


# A model chunk of the measured turn's text (`/scenario long`).
CHUNK = re.compile(r"chunk\d+ ")
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _duration_ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not match:
        return math.nan
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(output: str) -> WrkResult:
    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if rate is None:
        raise BenchError(f"wrk printed no rate: {output.strip()[-300:]}")
    total = re.search(r"(\d+) requests in", output)
    percentiles = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", output, re.MULTILINE))
    errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    non_ok = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    return WrkResult(
        requests_per_s=float(rate.group(1)),
        requests=int(total.group(1)) if total else 0,
        p50_ms=_duration_ms(percentiles.get("50", "")),
        p99_ms=_duration_ms(percentiles.get("99", "")),
        errors=sum(int(g) for g in errors.groups()) if errors else 0,
        non_2xx_3xx=int(non_ok.group(1)) if non_ok else 0,
    )


async def run_wrk(
    url: str,
    *,
    pin: list[str],
    duration: float,
    connections: int = 32,
    threads: int = 1,
    headers: dict[str, str] | None = None,
    script: Path | None = None,
) -> WrkResult:
    argv = [
        *pin,
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(duration))}s",
        "--timeout",
        "10s",
        "--latency",
    ]
    for name, value in (headers or {}).items():
        argv += ["-H", f"{name}: {value}"]
    if script is not None:
        argv += ["-s", str(script)]
    argv.append(url)
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), duration + 30)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise BenchError("wrk did not finish in time") from None
    result = parse_wrk(out.decode(errors="replace"))
    if result.requests == 0:
        raise BenchError("wrk completed no request")
    return result


def lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def writers_script(
    directory: Path, sessions: list[str], authorization: str, text: str, run_id: str
) -> Path:
    """wrk with one thread per connection: `setup` gives thread i session i, so each of
    the connections posts to a session of its own; every request gets a unique
    `client_message_id` (never a duplicate)."""
    body_text = text.replace("\\", "\\\\").replace('"', '\\"')
    listed = ", ".join(lua_string(s) for s in sessions)
    script = f"""
local sessions = {{{listed}}}
local run = {lua_string(run_id)}
local text = {lua_string(body_text)}
local created = 0

function setup(thread)
  created = created + 1
  thread:set("index", created)
end

function init(args)
  path = "/v1/sessions/" .. sessions[index] .. "/messages"
  headers = {{}}
  headers["Content-Type"] = "application/json"
  headers["Authorization"] = {lua_string(authorization)}
  sent = 0
end

function request()
  sent = sent + 1
  local body = '{{"client_message_id":"' .. run .. '-' .. index .. '-' .. sent ..
    '","message":{{"content":[{{"type":"text","text":"' .. text .. '"}}]}}}}'
  return wrk.format("POST", path, headers, body)
end
"""
    path = directory / f"writers-{run_id}.lua"
    path.write_text(script)
    return path


# ---- SSE subscribers -------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


@dataclass
class FanoutResult:
    subscribers: int
    connected: int
    expected_per_subscriber: int
    received: int
    lost: int
    p50_ms: float
    p99_ms: float
    deltas_per_s: float
    seconds: float
    # The turn's first deltas (bench.sse_worker.EARLY): what its start costs.
    early_p50_ms: float = math.nan
    early_max_ms: float = math.nan
    # The turn's deltas per second over the pace its model set (1.0: kept up).
    pace: float = math.nan
    # Latency from each delta's place in its model's schedule, not from its `ts`: a
    # server that publishes late is not measured from its late stamps.
    scheduled_p50_ms: float = math.nan
    scheduled_p99_ms: float = math.nan

    def as_dict(self) -> dict[str, Any]:
        return {
            key: (round(value, 3) if isinstance(value, float) else value)
            for key, value in self.__dict__.items()
        }


@dataclass
class WorkerHandle:
    proc: Proc
    result_path: Path
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    reader: asyncio.Task[None] | None = None

    async def read_events(self) -> None:
        stream = self.proc.process.stdout
        assert stream is not None
        while True:
            line = await stream.readline()
            if not line:
                break
            with contextlib.suppress(orjson.JSONDecodeError):
                message = orjson.loads(line)
                self.events[message["event"]] = message
                self.arrived.set()
        self.arrived.set()


class Subscribers:
    """SSE subscribers spread over one or two worker processes on the load core."""

    def __init__(self, workers: list[WorkerHandle], total: int) -> None:
        self.workers = workers
        self.total = total

    @classmethod
    async def start(
        cls,
        *,
        url: str,
        path: str = "",
        headers: dict[str, str],
        total: int = 0,
        expected: int,
        pin: list[str],
        log_dir: Path,
        run_timeout: float,
        paths: list[str] | None = None,
        stamps: bool = False,
        interval_ms: int | None = None,
    ) -> "Subscribers":
        """`total` subscribers of `path`, or one of each of `paths`; with `stamps` they
        count the provider's send times in the text, with `interval_ms` latencies from
        the model's schedule too (see `bench.sse_worker`)."""
        host, _, port = url.removeprefix("http://").partition(":")
        if paths is not None:
            total = len(paths)
        processes = 2 if total >= 500 else 1
        workers: list[WorkerHandle] = []
        for index in range(processes):
            count = total // processes + (1 if index < total % processes else 0)
            first = index * (total // processes) + min(index, total % processes)
            result_path = Path(
                tempfile.mkstemp(prefix="sse-", suffix=".json", dir=log_dir)[1]
            )
            config = {
                "host": host,
                "port": int(port),
                "path": path,
                "paths": paths[first : first + count] if paths is not None else None,
                "headers": [f"{k}: {v}" for k, v in headers.items()],
                "count": count,
                "expected": expected,
                "stamps": stamps,
                "interval_ms": interval_ms,
                "connect_timeout": 30 + count / 20,
                "run_timeout": run_timeout,
                "result_path": str(result_path),
            }
            proc = await spawn(
                f"sse-worker-{index}",
                [
                    *pin,
                    sys.executable,
                    "-m",
                    "bench.sse_worker",
                    orjson.dumps(config).decode(),
                ],
                cwd=BENCH_ROOT,
                env=python_env(BENCH_ROOT),
                log=log_dir / "sse-workers.log",
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            handle = WorkerHandle(proc, result_path)
            handle.reader = asyncio.create_task(handle.read_events())
            workers.append(handle)
        return cls(workers, total)

    async def wait(self, event: str, within: float) -> bool:
        """Until every worker reported `event` (True) or the timeout (False)."""
        deadline = time.monotonic() + within
        for worker in self.workers:
            while event not in worker.events:
                if (
                    not worker.proc.alive()
                    and worker.reader is not None
                    and worker.reader.done()
                ):
                    raise BenchError(
                        f"subscriber worker exited: {worker.proc.log_tail()}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                worker.arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(worker.arrived.wait(), remaining)
        return True

    async def connect(self, within: float) -> None:
        """Until every subscriber has its response headers; all of them must."""
        if not await self.wait("connected", within):
            raise BenchError(f"subscribers did not connect within {within:.0f} s")
        if self.connected() < self.total:
            raise BenchError(
                f"{self.connected()}/{self.total} subscribers connected "
                f"(HTTP statuses {self.statuses()})"
            )

    def connected(self) -> int:
        return sum(
            int(w.events.get("connected", {}).get("ok", 0)) for w in self.workers
        )

    def statuses(self) -> dict[str, int]:
        merged: dict[str, int] = {}
        for worker in self.workers:
            for status, count in (
                worker.events.get("connected", {}).get("statuses", {}).items()
            ):
                merged[status] = merged.get(status, 0) + int(count)
        return merged

    async def finish(
        self, ts_map: Path | None = None, within: float = 120
    ) -> dict[str, Any]:
        command = orjson.dumps(
            {"cmd": "finish", "ts_map": str(ts_map) if ts_map else None}
        )
        for worker in self.workers:
            stdin = worker.proc.process.stdin
            if stdin is not None and worker.proc.alive():
                with contextlib.suppress(OSError):
                    stdin.write(command + b"\n")
                    await stdin.drain()
        if not await self.wait("done", within):
            raise BenchError("subscriber workers did not report their results in time")
        merged: dict[str, Any] = {
            "received": [],
            "latencies_ms": [],
            "early_ms": [],
            "scheduled_ms": [],
            "first_sent": None,
            "last_received": None,
            "connected": 0,
        }
        for worker in self.workers:
            result = orjson.loads(worker.result_path.read_bytes())
            merged["received"] += result["received"]
            merged["latencies_ms"] += result["latencies_ms"]
            merged["early_ms"] += result.get("early_ms", [])
            merged["scheduled_ms"] += result.get("scheduled_ms", [])
            merged["connected"] += result["connected"]
            for key, pick in (("first_sent", min), ("last_received", max)):
                if result[key] is not None:
                    current = merged[key]
                    merged[key] = (
                        result[key] if current is None else pick(current, result[key])
                    )
        await self.close()
        return merged

    async def close(self) -> None:
        for worker in self.workers:
            await worker.proc.stop(within=10)
            if worker.reader is not None:
                worker.reader.cancel()
            with contextlib.suppress(OSError):
                worker.result_path.unlink()


def fanout_result(
    merged: dict[str, Any], total: int, expected: int, pace: float
) -> FanoutResult:
    latencies: list[float] = merged["latencies_ms"]
    early: list[float] = merged["early_ms"]
    scheduled: list[float] = merged.get("scheduled_ms", [])
    received = sum(merged["received"])
    first, last = merged["first_sent"], merged["last_received"]
    seconds = (last - first) if first is not None and last is not None else math.nan
    return FanoutResult(
        subscribers=total,
        connected=int(merged["connected"]),
        expected_per_subscriber=expected,
        received=received,
        # Subscribers that never connected lose every delta.
        lost=total * expected - received,
        p50_ms=statistics.median(latencies) if latencies else math.nan,
        p99_ms=percentile(latencies, 99),
        deltas_per_s=received / seconds if seconds and seconds > 0 else math.nan,
        seconds=seconds,
        early_p50_ms=statistics.median(early) if early else math.nan,
        early_max_ms=max(early) if early else math.nan,
        pace=pace,
        scheduled_p50_ms=statistics.median(scheduled) if scheduled else math.nan,
        scheduled_p99_ms=percentile(scheduled, 99),
    )


# ---- the /sse probe --------------------------------------------------------------------


class Probe:
    """One connection on the service's `/sse` (deltas and turn outcomes): each delta's
    `ts` keyed by (message id, end of `accumulated`), which is where the same text ends
    in the Mutation stream's `delta` frames (`offset` + length)."""

    def __init__(self, url: str, path: str, headers: dict[str, str]) -> None:
        self.url = url
        self.path = path
        self.headers = headers
        self.deltas: dict[str, list[list[float]]] = {}
        self.completed = 0
        self.connected = asyncio.Event()
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def start(self, within: float = 30) -> None:
        host, _, port = self.url.removeprefix("http://").partition(":")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, int(port)), 10
        )
        self.writer = writer
        lines = [
            f"GET {self.path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Accept: text/event-stream",
            *(f"{k}: {v}" for k, v in self.headers.items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        self.task = asyncio.create_task(self._read(reader))
        await asyncio.wait_for(self.connected.wait(), within)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        chunks = Dechunker() if b"chunked" in head.lower() else None
        text = b""
        while True:
            data = await reader.read(65536)
            if not data:
                return
            payload = chunks.feed(data) if chunks is not None else data
            text += payload.replace(b"\r\n", b"\n")
            *frames, text = text.split(b"\n\n")
            for frame in frames:
                self._frame(frame)
            self.changed.set()

    def _frame(self, frame: bytes) -> None:
        event, data = b"", b""
        for line in frame.split(b"\n"):
            if line.startswith(b"event:"):
                event = line[6:].strip()
            elif line.startswith(b"data:"):
                data = line[5:].strip()
        if event == b"connected":
            self.connected.set()
        elif event == b"output.message.delta":
            body = orjson.loads(data)
            delta = body["data"]
            text = delta.get("delta", "")
            if "chunk" in text:
                # One entry per model chunk (`chunk<i> `), also when a process that
                # heard the turn over the bus joined several into one delta: where
                # each ends, and the delta's `ts`.
                ts = parse_ts(body["ts"].encode())
                start = len(delta["accumulated"]) - len(text)
                pairs = self.deltas.setdefault(delta["message_id"], [])
                for piece in CHUNK.finditer(text):
                    pairs.append([start + piece.end(), ts])
        elif event in (b"turn.completed", b"turn.failed", b"turn.cancelled"):
            self.completed += 1

    async def wait_completed(self, count: int, within: float) -> bool:
        deadline = time.monotonic() + within
        while self.completed < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self.task is not None and self.task.done()):
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return True

    def delta_count(self) -> int:
        return sum(len(v) for v in self.deltas.values())

    def pace(self, interval: float) -> float:
        """The turn's deltas per second (from their `ts`, stamped as the runner
        published them) over the 1 / `interval` its model streamed at."""
        stamps = sorted(ts for pairs in self.deltas.values() for _, ts in pairs)
        if len(stamps) < 2 or stamps[-1] <= stamps[0]:
            return math.nan
        return (len(stamps) - 1) / (stamps[-1] - stamps[0]) * interval

    def write_map(self, directory: Path) -> Path:
        path = Path(tempfile.mkstemp(prefix="tsmap-", suffix=".json", dir=directory)[1])
        path.write_bytes(orjson.dumps(self.deltas))
        return path

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        if self.writer is not None:
            self.writer.close()
