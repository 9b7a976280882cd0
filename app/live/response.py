"""The SSE transport: an ASGI response that writes pre-encoded frames as they come.

Each write is one `send` of bytes the fan-out already encoded, with no per-frame
timeout scope or task. A client that disconnects is noticed by one waiter on
`receive()`; a client whose socket stops accepting data is noticed by the fan-out's
process timer. Either way the response's task is cancelled where it waits, its stream
generator is closed (releasing its subscription and slot), and it returns.

The response releases the stream's slot itself too, as it ends: a generator closed
before it ever ran (the client left before the first frame) runs none of its own
cleanup, and its slot would otherwise wait for the garbage collector.

A client dropped for not reading is one INFO line: it is expected (it resumes from its
cursor when it reads again), and nothing failed.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.errors import session_in_path
from app.live.fanout import Fanout
from app.live.writer import StreamWriter
from app.telemetry import logs

log = logging.getLogger("app.live.response")

HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"connection", b"keep-alive"),
    # Proxies such as nginx would otherwise buffer the stream.
    (b"x-accel-buffering", b"no"),
]


class EventStreamResponse(Response):
    # The content type is in HEADERS. The class declares none, so FastAPI documents
    # the route's problem+json answers as their own, not as event streams.
    media_type = None

    def __init__(
        self,
        stream: AsyncIterator[bytes],
        fanout: Fanout,
        status_code: int = 200,
        *,
        release: Callable[[], None] = lambda: None,
        writer: StreamWriter | None = None,
    ) -> None:
        # No Response.__init__: a stream has no body and so no Content-Length.
        # (`status_code` is here for FastAPI, which reads its default for the OpenAPI.)
        self.stream = stream
        self.fanout = fanout
        self.status_code = status_code
        self.background = None
        self.raw_headers = list(HEADERS)
        # Frees the stream's connection slot; idempotent (the generator calls it too).
        self.release = release
        # Shared with the stream, which writes live deltas through it directly.
        self.writer = writer if writer is not None else StreamWriter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._stream(scope, receive, send)
        finally:
            self.release()

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": self.status_code,
                "headers": self.raw_headers,
            }
        )
        if scope["method"] == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            return
        task = asyncio.current_task()
        writer = self.writer
        writer.task = task
        writer.send = send
        gone = False

        async def until_disconnect() -> None:
            nonlocal gone
            # The first message is the (empty) request body; then the disconnect.
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            if task is not None:
                task.cancel()

        watcher = asyncio.create_task(until_disconnect())
        self.fanout.writers.add(writer)
        stream = self.stream
        try:
            async for chunk in stream:
                if writer.unfinished is not None:
                    # A frame the stream wrote directly is waiting for the socket.
                    await writer.finish()
                if not chunk:
                    continue
                writer.send_started = time.monotonic()
                await send(
                    {"type": "http.response.body", "body": chunk, "more_body": True}
                )
                writer.send_started = None
        except asyncio.CancelledError:
            if not (gone or writer.stuck):
                raise
            # Ours: the client left, or stopped reading. Nothing more can be sent.
            if task is not None:
                task.uncancel()
            if writer.stuck and not gone:
                self._dropped(scope)
            return
        finally:
            writer.abandon()
            self.fanout.writers.discard(writer)
            watcher.cancel()
            if isinstance(stream, AsyncGenerator):
                with contextlib.suppress(Exception):
                    await stream.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _dropped(self, scope: Scope) -> None:
        """The response ends unfinished: uvicorn closes the connection (after what its
        buffers hold), which `ABANDONED` tells its error log is on purpose."""
        logs.ABANDONED.set(True)
        request_id = next(
            (v.decode() for k, v in self.raw_headers if k == b"x-request-id"),
            scope.get("state", {}).get("request_id"),
        )
        log.info(
            "dropped a slow consumer: one write waited over %g s; it resumes from its "
            "cursor when it reads again",
            self.fanout.send_timeout_seconds,
            extra={
                "request_id": request_id,
                "session_id": session_in_path(scope.get("path", "")),
            },
        )
