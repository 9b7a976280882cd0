"""A hostile model provider: the service's `openai` driver against a local server that
answers Chat Completions in every broken way a provider (or whatever sits in front of
it) can, one mode per turn. For each mode it prints what the turn became, how long
`/health` stalled meanwhile, the server's peak memory, the size of the stored agent
message and how much the server logged.

    python scripts/fault_provider.py --database sqlite|postgresql [--modes a,b]

It fails (exit 1) if a turn is left running, `/health` stalled past 100 ms, a stored
message passed 1.2 MB (the reply cap is 1,000,000 characters) or a mode logged more than
200 KB. The provider runs in this process (its own thread and event loop); the service
is a server process of its own on loopback, with MODEL_TIMEOUT_SECONDS=5 and
MODEL_MAX_RETRIES=1 so that every mode ends within seconds; the provider is a process
of its own too, so that building its 30 MB answers does not stall this one's timing.
"""

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from faultkit import ServerProcess, add_database_options, free_port, run_with_server
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

Chunks = Callable[[], AsyncIterator[bytes]]


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    body = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "hostile",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _call(index: int, call_id: Any, arguments: str) -> dict[str, Any]:
    return {
        "tool_calls": [
            {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": "lookup", "arguments": arguments},
            }
        ]
    }


DONE = b"data: [DONE]\n\n"


async def _lines(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _tool_calls(*calls: dict[str, Any]) -> Chunks:
    return lambda: _lines(*(_chunk(c) for c in calls), _chunk({}, "tool_calls"), DONE)


async def _drip() -> AsyncIterator[bytes]:
    yield _chunk({"role": "assistant", "content": "Starting"})
    for _ in range(60):
        await asyncio.sleep(2)
        yield b"d"


async def _endless() -> AsyncIterator[bytes]:
    piece = _chunk({"content": "x" * 1000})
    while True:
        yield piece
        await asyncio.sleep(0)


def _many_calls(count: int) -> Chunks:
    return lambda: _lines(
        *(_chunk(_call(i, f"call_{i}", "{}")) for i in range(count)),
        _chunk({}, "tool_calls"),
        DONE,
    )


# Mode -> what the provider answers while the conversation has no tool results yet
# (a Response, or a stream of SSE bytes); with results it always answers "Handled.".
MODES: dict[str, Callable[[], Response | Chunks]] = {
    "lone surrogate in tool arguments": lambda: _tool_calls(
        _call(0, "a", '{"q": "\\ud800"}')
    ),
    "integer past 64 bits in tool arguments": lambda: _tool_calls(
        _call(0, "a", '{"q": 123456789012345678901234567890}')
    ),
    "duplicate and integer tool-call ids": lambda: _tool_calls(
        _call(0, "dup", "{}"), _call(1, "dup", "{}"), _call(2, 7, "{}")
    ),
    "token usage past 64 bits": lambda: (
        lambda: _lines(
            _chunk({"content": "Counted."}, "stop"),
            _chunk({}, None, usage={"prompt_tokens": 10**30, "completion_tokens": -5}),
            DONE,
        )
    ),
    "text of the wrong type": lambda: lambda: _lines(_chunk({"content": 5}), DONE),
    "a chunk that is not JSON": lambda: lambda: _lines(b"data: {nope\n\n", DONE),
    "bytes that are not UTF-8": lambda: (
        lambda: _lines(
            b'data: {"choices":[{"delta":{"content":"\xff\xfe"}}]}\n\n', DONE
        )
    ),
    "HTML answered 200": lambda: Response(
        "<html><body>Welcome</body></html>", media_type="text/html"
    ),
    "cut before [DONE]": lambda: lambda: _lines(_chunk({"content": "Half an "})),
    "a byte every 2 s": lambda: _drip,
    "one 20 MB chunk": lambda: (
        lambda: _lines(_chunk({"content": "x" * 20_000_000}, "stop"), DONE)
    ),
    "an endless reply": lambda: _endless,
    "10,000 tool calls in one step": lambda: _many_calls(10_000),
    "a 30 MB error body": lambda: JSONResponse(
        {"error": {"message": "E" * 30_000_000, "type": "server_error"}},
        status_code=500,
    ),
    "307 to another address": lambda: Response(
        status_code=307, headers={"location": "http://127.0.0.1:9/v1/chat/completions"}
    ),
}


def _mode_of(body: dict[str, Any]) -> tuple[str, bool]:
    """The mode named by the newest user message, and whether tool results followed."""
    answered = False
    for message in reversed(body["messages"]):
        if message["role"] == "tool":
            answered = True
        if message["role"] == "user":
            content = message["content"]
            text = (
                content
                if isinstance(content, str)
                else " ".join(c.get("text", "") for c in content)
            )
            return text, answered
    return "", answered


async def completions(request: Request) -> Response:
    mode, answered = _mode_of(await request.json())
    if answered or mode not in MODES:
        return StreamingResponse(
            _lines(_chunk({"content": "Handled."}, "stop"), DONE),
            media_type="text/event-stream",
        )
    answer = MODES[mode]()
    if isinstance(answer, Response):
        return answer
    return StreamingResponse(answer(), media_type="text/event-stream")


def serve_provider(port: int) -> None:
    app = Starlette(
        routes=[Route("/v1/chat/completions", completions, methods=["POST"])]
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")


def start_provider(port: int) -> subprocess.Popen[bytes]:
    """The provider in a process of its own: building a 30 MB answer must not stall
    this process's own /health timing."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve-provider", str(port)]
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the hostile provider did not start") from None
            time.sleep(0.05)


@dataclass
class Outcome:
    mode: str
    ended: str
    seconds: float
    health_max_ms: float
    peak_rss_mb: float
    message_kb: float
    logged_kb: float

    def ok(self) -> bool:
        return (
            self.ended != "still running"
            and self.health_max_ms <= 100
            and self.message_kb <= 1_200
            and self.logged_kb <= 200
        )


async def _watch_health(
    client: httpx.AsyncClient, server: ServerProcess, stop: asyncio.Event
) -> tuple[float, float]:
    """The slowest /health answer (ms) and the peak RSS (MB) until `stop`."""
    slowest = 0.0
    peak = 0
    while not stop.is_set():
        started = time.perf_counter()
        await client.get("/health")
        slowest = max(slowest, (time.perf_counter() - started) * 1000)
        peak = max(peak, server.rss_kb())
        await asyncio.sleep(0.02)
    return slowest, peak / 1024


async def run_mode(
    client: httpx.AsyncClient, server: ServerProcess, mode: str
) -> Outcome:
    logged = server.log_path.stat().st_size
    session = (await client.post("/v1/sessions", json={"title": mode})).json()["id"]
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch_health(client, server, stop))
    started = time.monotonic()
    posted = await client.post(
        f"/v1/sessions/{session}/messages",
        json={"message": {"content": [{"type": "text", "text": mode}]}},
    )
    assert posted.status_code == 201, posted.text
    ended = "still running"
    while time.monotonic() - started < 90:
        status = (await client.get(f"/v1/sessions/{session}")).json()["status"]
        if status != "active":
            break
        await asyncio.sleep(0.1)
    seconds = time.monotonic() - started
    stop.set()
    health_max_ms, peak_rss_mb = await watcher
    events = (await client.get(f"/v1/sessions/{session}/events")).json()["data"]
    outcome = next((e for e in reversed(events) if e["type"].startswith("turn.")), None)
    if status == "waitingfortoolresults":
        ended = "waiting for tool results"
    elif outcome is not None and outcome["type"] != "turn.started":
        data = outcome["data"]
        ended = outcome["type"].removeprefix("turn.")
        if "error" in data:
            ended += f" ({data.get('error_code')}: {str(data['error'])[:70]})"
    page = (await client.get(f"/v1/sessions/{session}/messages")).json()["data"]
    message_kb = max((len(json.dumps(m)) for m in page), default=0) / 1024
    return Outcome(
        mode,
        ended,
        seconds,
        health_max_ms,
        peak_rss_mb,
        message_kb,
        (server.log_path.stat().st_size - logged) / 1024,
    )


def print_table(outcomes: list[Outcome]) -> None:
    print(
        "| mode | the turn | s | /health max ms | peak RSS MB | message KB | logged KB |"
    )
    print("|---|---|---|---|---|---|---|")
    for o in outcomes:
        print(
            f"| {o.mode} | {o.ended} | {o.seconds:.1f} | {o.health_max_ms:.0f} |"
            f" {o.peak_rss_mb:.0f} | {o.message_kb:.1f} | {o.logged_kb:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_options(parser)
    parser.add_argument("--modes", help="comma-separated names (default: all)")
    parser.add_argument("--serve-provider", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_provider:
        serve_provider(args.serve_provider)
        return
    modes = args.modes.split(",") if args.modes else list(MODES)
    port = free_port()
    provider = start_provider(port)

    async def scenario(server: ServerProcess, _sqlite: Path | None) -> bool:
        outcomes = []
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            for mode in modes:
                outcome = await run_mode(client, server, mode)
                print(f"{'ok  ' if outcome.ok() else 'FAIL'} {mode}: {outcome.ended}")
                outcomes.append(outcome)
        print_table(outcomes)
        return all(o.ok() for o in outcomes)

    try:
        run_with_server(
            args,
            prefix="evm_fault_provider_",
            env={
                "MODEL_DRIVER": "openai",
                "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
                "OPENAI_MODEL": "hostile",
                "MODEL_TIMEOUT_SECONDS": "5",
                "MODEL_MAX_RETRIES": "1",
                "DEMO_TOOLS": "true",
            },
            scenario=scenario,
        )
    finally:
        provider.terminate()
        provider.wait(10)


if __name__ == "__main__":
    main()
