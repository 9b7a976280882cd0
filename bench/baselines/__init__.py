"""The baseline apps the service is measured against, each a process of its own started
by the bench (`python -m bench.baselines.<name> --port P ...`) and served with the
service's uvicorn flags (see `serve`)."""

import argparse
from typing import Any

import uvicorn

# The headers of every baseline's SSE response, as the service sends them.
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def sse_frame(event: str, data: bytes) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


async def respond(send: Any, status: int, body: bytes) -> None:
    """A whole JSON response of a raw ASGI baseline."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, required=True)
    return parser


def serve(app: Any, port: int) -> None:
    """`python -m app serve` runs uvicorn with these flags (app/cli.py); the baselines
    pin the loop and parser the service gets by default (uvloop, httptools)."""
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        proxy_headers=True,
        timeout_graceful_shutdown=5,
        loop="uvloop",
        http="httptools",
    )
