"""Hand-written fan-out: a raw ASGI app that encodes each SSE frame once and hands the
same bytes to every subscriber's queue; each subscriber is one coroutine writing its
queue to its socket (plus one waiting for the disconnect). One shared heartbeat task
keeps idle streams open. The floor for what fan-out costs in Python on uvicorn.

    GET  /stream?shape=mutation|sse      subscribe
    POST /publish?n=N&interval_ms=20&shape=...&text=...   one turn; answers when done
"""

import asyncio
import contextlib
from typing import Any
from urllib.parse import unquote

import orjson

from bench.baselines import SSE_HEADERS, arguments, respond, serve, sse_frame
from bench.baselines.fanout import Hub, publish, query_params

HEARTBEAT_SECONDS = 30.0
hub: Hub[bytes] = Hub()


async def heartbeat() -> None:
    while True:
        await asyncio.sleep(HEARTBEAT_SECONDS)
        hub.offer(b": heartbeat\n\n")


async def stream(scope: dict[str, Any], receive: Any, send: Any) -> None:
    queue = hub.subscribe()
    shape = query_params(scope.get("query_string", b"")).get("shape", "mutation")

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        queue.put_nowait(None)

    watcher = asyncio.create_task(disconnected())
    try:
        await send(
            {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS}
        )
        if shape == "sse":
            await send(
                {
                    "type": "http.response.body",
                    "body": sse_frame("connected", b'{"status":"connected"}'),
                    "more_body": True,
                }
            )
        while True:
            frame = await queue.get()
            if frame is None:
                break
            await send({"type": "http.response.body", "body": frame, "more_body": True})
    except OSError:
        pass
    finally:
        hub.unsubscribe(queue)
        watcher.cancel()
    with contextlib.suppress(Exception):
        await send({"type": "http.response.body", "body": b""})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        task: asyncio.Task[None] | None = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                task = asyncio.create_task(heartbeat())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if task is not None:
                    task.cancel()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/health":
        await respond(send, 200, b'{"status":"ok"}')
    elif path == "/publish" and scope["method"] == "POST":
        params = query_params(scope.get("query_string", b""))
        text = params.get("text")
        result = await publish(
            hub,
            sse_frame,
            shape=params.get("shape", "mutation"),
            count=int(params.get("n", "1")),
            interval=int(params.get("interval_ms", "20")) / 1000,
            text=unquote(text) if text is not None else None,
        )
        await respond(send, 200, orjson.dumps(result))
    elif scope["method"] == "GET":
        await stream(scope, receive, send)
    else:
        await respond(send, 404, b'{"detail":"not found"}')


def main() -> None:
    args = arguments(__doc__ or "").parse_args()
    serve(app, args.port)


if __name__ == "__main__":
    main()
