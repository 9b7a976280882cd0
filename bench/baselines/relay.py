"""The `turns` row's baseline: a minimal relay of a model's stream to the people
watching, with the service's uvicorn flags and the same `openai` package the service's
driver uses. Nothing is stored.

    GET  /sessions/{id}/stream            subscribe: one `delta` frame per model chunk
    POST /sessions/{id}/messages?wait=true   start the model's streamed answer; the
                                          response comes when it ended

Each chunk's text becomes one SSE frame shaped like the Mutation stream's `delta`,
encoded once and handed to every subscriber's queue; each subscriber is one coroutine
writing its queue to its socket.

    python -m bench.baselines.relay --port P --provider http://127.0.0.1:Q/v1
"""

import asyncio
import contextlib
import uuid
from typing import Any

import openai
import orjson

from bench.baselines import SSE_HEADERS, arguments, respond, serve, sse_frame

watchers: dict[str, set["asyncio.Queue[bytes | None]"]] = {}
client: openai.AsyncOpenAI | None = None


def offer(session: str, data: bytes) -> None:
    for queue in watchers.get(session, ()):
        queue.put_nowait(data)


async def stream(session: str, receive: Any, send: Any) -> None:
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    watchers.setdefault(session, set()).add(queue)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        queue.put_nowait(None)

    watcher = asyncio.create_task(disconnected())
    try:
        await send(
            {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS}
        )
        # As the Mutation stream opens: the reconnection time, once subscribed.
        opening = b"retry: 2000\n\n"
        await send({"type": "http.response.body", "body": opening, "more_body": True})
        while (data := await queue.get()) is not None:
            await send({"type": "http.response.body", "body": data, "more_body": True})
    except OSError:
        pass
    finally:
        watchers[session].discard(queue)
        watcher.cancel()
    with contextlib.suppress(Exception):
        await send({"type": "http.response.body", "body": b""})


async def relay(session: str, text: str) -> None:
    """One model answer, chunk by chunk, to the session's watchers."""
    assert client is not None
    message_id = f"message_{uuid.uuid4().hex}"
    offset = 0
    answer = await client.chat.completions.create(
        model="bench",
        messages=[{"role": "user", "content": text}],
        stream=True,
        stream_options={"include_usage": True},
    )
    async with answer:
        async for chunk in answer:
            for choice in chunk.choices[:1]:
                content = choice.delta.content if choice.delta is not None else None
                if not content:
                    continue
                body = {
                    "message_id": message_id,
                    "revision": 1,
                    "part_id": "agent-text:1",
                    "offset": offset,
                    "text": content,
                }
                offset += len(content)
                offer(session, sse_frame("delta", orjson.dumps(body)))


async def read_body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        chunk: bytes = message.get("body", b"")
        body += chunk
        if not message.get("more_body"):
            return body


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global client
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if client is not None:
                    await client.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    parts = scope["path"].strip("/").split("/")
    if parts == ["health"]:
        await respond(send, 200, b'{"status":"ok"}')
    elif len(parts) == 3 and parts[0] == "sessions" and parts[2] == "stream":
        await stream(parts[1], receive, send)
    elif len(parts) == 3 and parts[2] == "messages" and scope["method"] == "POST":
        body = orjson.loads(await read_body(receive))
        await relay(parts[1], str(body["message"]["content"][0]["text"]))
        await respond(send, 200, b'{"status":"completed"}')
    else:
        await respond(send, 404, b'{"detail":"not found"}')


def main() -> None:
    global client
    parser = arguments(__doc__ or "")
    parser.add_argument("--provider", required=True)
    args = parser.parse_args()
    client = openai.AsyncOpenAI(base_url=args.provider, api_key="none", max_retries=0)
    serve(app, args.port)


if __name__ == "__main__":
    main()
