"""A model provider for the `turns` row: an OpenAI-compatible Chat Completions endpoint
that streams a fixed reply at a fixed pace, as a hosted model does.

Every streamed request gets `--chunks` content chunks, one every `--interval-ms`, each
shaped like OpenAI's (`chat.completion.chunk`, with role, finish and usage chunks around
them) and carrying its own send time as its text, `@<unix seconds>; `, so a client that
sees the text on any stream knows how long it took to get there. Chunks follow an
absolute schedule from the request's arrival: a slow reader delays what it reads, never
the schedule of the next request.

It is a raw asyncio protocol (uvloop when present) so that what it costs stays small
next to the servers measured; HTTP/1.1 keep-alive, because the `openai` package pools
its connections.

    python -m bench.baselines.provider --port P [--chunks 40] [--interval-ms 40]
"""

import argparse
import asyncio
import contextlib
import time
import uuid
from typing import Any, cast

import orjson

STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(body: dict[str, Any]) -> bytes:
    return chunked(b"data: " + orjson.dumps(body) + b"\n\n")


class Reply:
    """The chunks of one streamed completion, OpenAI's shape."""

    def __init__(self, model: str) -> None:
        self.base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_bench",
        }

    def chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return event({**self.base, "choices": [choice]})

    def usage(self, completion_tokens: int) -> bytes:
        usage = {
            "prompt_tokens": 20,
            "completion_tokens": completion_tokens,
            "total_tokens": 20 + completion_tokens,
        }
        return event({**self.base, "choices": [], "usage": usage})


class Connection(asyncio.Protocol):
    def __init__(self, chunks: int, interval: float) -> None:
        self.chunks = chunks
        self.interval = interval
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.next_request()

    def next_request(self) -> None:
        """Parse one whole request off the buffer (one at a time: the client waits for
        a streamed answer before it sends the next on this connection)."""
        if self.busy:
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        body = bytes(self.buffer[end + 4 : end + 4 + length])
        del self.buffer[: end + 4 + length]
        self.busy = True
        asyncio.get_running_loop().create_task(self.answer(head, body))

    async def answer(self, head: str, body: bytes) -> None:
        try:
            request = orjson.loads(body) if body else {}
            if head.startswith("GET /health "):
                self.write_plain(200, b'{"status":"ok"}')
            elif not head.startswith("POST ") or not request.get("stream"):
                self.write_plain(
                    404, b'{"error":{"message":"streamed completions only"}}'
                )
            else:
                await self.stream(str(request.get("model", "bench")))
        finally:
            self.busy = False
            self.next_request()

    def write_plain(self, status: int, body: bytes) -> None:
        if self.transport is None:
            return
        self.transport.write(
            b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (status, len(body), body)
        )

    async def stream(self, model: str) -> None:
        loop = asyncio.get_running_loop()
        reply = Reply(model)
        if self.transport is None:
            return
        self.transport.write(
            STREAM_HEAD + reply.chunk({"role": "assistant", "content": ""})
        )
        start = loop.time()
        for index in range(1, self.chunks + 1):
            await asyncio.sleep(max(0.0, start + index * self.interval - loop.time()))
            if self.transport is None:
                return
            text = f"@{time.time():.6f}; "
            self.transport.write(reply.chunk({"content": text}))
        if self.transport is None:
            return
        self.transport.write(
            reply.chunk({}, "stop")
            + reply.usage(self.chunks)
            + chunked(b"data: [DONE]\n\n")
            + b"0\r\n\r\n"
        )


async def main(port: int, chunks: int, interval: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Connection(chunks, interval), "127.0.0.1", port, backlog=4096
    )
    async with server:
        await server.serve_forever()


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--interval-ms", type=float, default=40.0)
    args = parser.parse_args()
    coroutine = main(args.port, args.chunks, args.interval_ms / 1000)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coroutine)
    else:
        with contextlib.suppress(KeyboardInterrupt):
            uvloop.run(coroutine)


if __name__ == "__main__":
    run()
