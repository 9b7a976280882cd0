"""Fan-out benchmark: one turn streaming N deltas to S subscribers of the upstream /sse
stream, against a real server process on loopback. Prints delivered deltas/s and the
delivery latency (server timestamp -> client receipt), for 1 subscriber and for S side by
side, and their ratio.

    .venv/bin/python scripts/fanout_bench.py [--subscribers 200] [--deltas 500]
        [--delay-ms 2] [--database-url postgresql+asyncpg://postgres@127.0.0.1:5432/<scratch db>]

The server migrates the database it is given: point it at a scratch database.
"""

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    database_url: str, delay_ms: int
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "SCRIPTED_DELAY_MS": str(delay_ms),
        "SSE_MAX_PER_SESSION": "100000",
        "SSE_MAX_PER_PROCESS": "100000",
        "SSE_QUEUE_SIZE": "100000",
        "RATE_LIMIT_PER_SECOND": "0",
        "AUTO_MIGRATE": "true",
        "LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port)], cwd=ROOT, env=env
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start")


async def subscriber(
    url: str, path: str, ready: asyncio.Event, out: list[float], counts: list[int]
) -> None:
    """A minimal SSE reader on a raw socket, so the measuring client costs little CPU
    next to the server on the same machine."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    query = "types=output.message.delta&types=turn.completed"
    writer.write(
        f"GET {path}?{query} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    buffer = b""
    event = None
    deltas = 0
    done = False
    while not done:
        chunk = await reader.read(65536)
        if not chunk:
            break
        now = time.time()
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw.rstrip(b"\r")
            if line.startswith(b"event: "):
                event = line[7:]
                if event == b"connected":
                    ready.set()
            elif line.startswith(b"data: ") and event == b"output.message.delta":
                at = line.find(b'"ts":"') + 6
                ts = line[at : at + 24].decode()
                sent = (
                    datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ")
                    .replace(tzinfo=UTC)
                    .timestamp()
                )
                out.append(now - sent)
                deltas += 1
            elif line.startswith(b"data: ") and event == b"turn.completed":
                done = True
    writer.close()
    counts.append(deltas)


async def run_round(url: str, subscribers: int, deltas: int) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(120)) as client:
        sid = (await client.post(f"{url}/v1/sessions", json={"title": "bench"})).json()[
            "id"
        ]
        latencies: list[float] = []
        counts: list[int] = []
        readies = [asyncio.Event() for _ in range(subscribers)]
        tasks = [
            asyncio.create_task(
                subscriber(
                    url, f"/v1/sessions/{sid}/sse", readies[i], latencies, counts
                )
            )
            for i in range(subscribers)
        ]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
        started = time.monotonic()
        body = {
            "message": {
                "content": [{"type": "text", "text": f"/scenario long {deltas}"}]
            }
        }
        await client.post(f"{url}/v1/sessions/{sid}/messages", json=body)
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
        elapsed = time.monotonic() - started
    latencies.sort()
    delivered = sum(counts)
    return {
        "subscribers": subscribers,
        "delivered": delivered,
        "complete": float(all(c == deltas for c in counts)),
        "deltas_per_s": delivered / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "seconds": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--deltas", type=int, default=500)
    parser.add_argument("--delay-ms", type=int, default=2)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url_db = args.database_url or f"sqlite+aiosqlite:///{tmp}/bench.db"
        proc, url = start_server(url_db, args.delay_ms)
        try:
            one = asyncio.run(run_round(url, 1, args.deltas))
            many = asyncio.run(run_round(url, args.subscribers, args.deltas))
        finally:
            proc.terminate()
            proc.wait(10)
    lane = "postgresql" if url_db.startswith("postgresql") else "sqlite"
    print(
        f"fan-out on {lane}: one turn of {args.deltas} deltas, {args.delay_ms} ms apart"
    )
    for row in (one, many):
        print(
            f"  {row['subscribers']:>5} subscribers: {row['deltas_per_s']:>9.0f} deltas/s delivered, "
            f"latency p50 {row['p50_ms']:.1f} ms p99 {row['p99_ms']:.1f} ms, "
            f"all deltas to all subscribers: {'yes' if row['complete'] else 'NO'}"
        )
    print(
        f"  delivered-throughput ratio {args.subscribers}:1 = {many['deltas_per_s'] / one['deltas_per_s']:.1f}x"
    )
    print(
        f"  p99 latency ratio {args.subscribers}:1 = {many['p99_ms'] / max(one['p99_ms'], 0.001):.1f}x"
    )


if __name__ == "__main__":
    main()
