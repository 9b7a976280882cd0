"""Fan-out as it is usually wired with sse-starlette: a FastAPI route returning an
`EventSourceResponse` over an async generator that reads the subscriber's queue and
yields each event as a dict (the JSON data serialized once by the publisher, the frame
encoded per subscriber by sse-starlette), with `ping=` keep-alives.

    GET  /stream?shape=mutation|sse      subscribe
    POST /publish?n=N&interval_ms=20&shape=...&text=...   one turn; answers when done
"""

from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from sse_starlette import EventSourceResponse

from bench.baselines import arguments, serve
from bench.baselines.fanout import Hub, publish

PING_SECONDS = 30

hub: Hub[dict[str, str]] = Hub()
app = FastAPI()


def encode(event: str, data: bytes) -> dict[str, str]:
    return {"event": event, "data": data.decode()}


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.get("/stream")
async def stream(shape: str = "mutation") -> EventSourceResponse:
    queue = hub.subscribe()

    async def events() -> AsyncIterator[dict[str, str]]:
        try:
            if shape == "sse":
                yield {"event": "connected", "data": '{"status":"connected"}'}
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item
        finally:
            hub.unsubscribe(queue)

    return EventSourceResponse(events(), ping=PING_SECONDS)


@app.post("/publish")
async def publish_turn(
    n: int = 1,
    interval_ms: int = 20,
    shape: str = "mutation",
    text: str | None = None,
) -> dict[str, Any]:
    return await publish(
        hub, encode, shape=shape, count=n, interval=interval_ms / 1000, text=text
    )


def main() -> None:
    args = arguments(__doc__ or "").parse_args()
    serve(app, args.port)


if __name__ == "__main__":
    main()
