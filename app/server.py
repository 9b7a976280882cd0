"""The server `serve` runs: uvicorn's, draining first when it stops (`DrainingServer`),
and its HTTP protocol: uvicorn's httptools protocol with read deadlines and a
header size cap, and problem+json for the answers uvicorn writes itself.

uvicorn has no header or body read deadline: a client that sends half a request line, or
dribbles a body a byte at a time, holds its socket (and a file descriptor) for as long as
it likes, so a few hundred such clients exhaust a server. Here every request must bring
its complete header within `header_timeout` seconds of its first byte (or of the
connection, for the first request), and its complete body within `body_timeout` seconds
of its header; otherwise it is answered `408` and the connection closed. Nothing runs
while a response streams: the deadlines cover reading requests only, so an SSE response
lasts as long as its stream. A connection idle between requests is closed by uvicorn's
own keep-alive timeout (`KEEP_ALIVE_SECONDS`).
"""

import asyncio
import functools
import gc
import logging
import signal
import socket
import sys
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, cast

from starlette.responses import Response
from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.protocols.http.httptools_impl import (
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import Server, ServerState
from uvicorn.supervisors import multiprocess
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from app.errors import problem_response
from app.ops import drain
from app.settings import Settings


class HeaderTooLarge(Exception):
    """Raised from a parser callback: httptools stops parsing and reports a parser error
    (HttpParserCallbackError), which uvicorn answers through `send_400_response`."""


def _raw(response: Response, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A complete HTTP/1.1 response, written straight to the transport: uvicorn's own
    answers are written that way, outside any request cycle."""
    status = response.status_code
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    lines += [name + b": " + value for name, value in default_headers]
    lines += [name + b": " + value for name, value in response.raw_headers]
    lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + bytes(response.body)


class Deadlines:
    """The read deadlines of every connection of the process, checked by one timer every
    TICK seconds: arming or clearing a deadline, twice per request, is a dict store
    rather than a timer of its own (measured: a TimerHandle per deadline cost 22 % of
    the newest-page throughput). A deadline fires up to TICK late."""

    TICK = 0.25

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[object, tuple[float, Callable[[], None]]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, owner: object, at: float, handler: Callable[[], None]) -> None:
        self.pending[owner] = (at, handler)
        if self._timer is None:
            self._timer = self.loop.call_later(self.TICK, self._tick)

    def disarm(self, owner: object) -> None:
        self.pending.pop(owner, None)

    def _tick(self) -> None:
        now = self.loop.time()
        due = [(o, h) for o, (at, h) in self.pending.items() if at <= now]
        for owner, handler in due:
            del self.pending[owner]
            handler()
        self._timer = (
            self.loop.call_later(self.TICK, self._tick) if self.pending else None
        )


_by_loop: dict[asyncio.AbstractEventLoop, Deadlines] = {}


def _deadlines(loop: asyncio.AbstractEventLoop) -> Deadlines:
    deadlines = _by_loop.get(loop)
    if deadlines is None:
        deadlines = _by_loop[loop] = Deadlines(loop)
    return deadlines


# How long a connection answered mid-request stays half-open, its input dropped.
LINGER_SECONDS = 2.0


class HeadWithBody:
    """The transport as one response writes to it: its head (uvicorn writes the status
    line and headers at `http.response.start`, then each piece of body on its own)
    waits for the first piece of body, and the two leave in one send (a head the body
    does not follow in this turn of the event loop, a stream's, leaves at its end).
    Each send to a socket is a system call and, with Nagle off, a segment the client
    wakes up for. (The benchmark's newest page: 17,155-18,535 answers a second with
    two sends, 20,500-20,593 with one and the access lines below not built.) Once the
    head has left, the response's cycle writes to the socket's transport itself: a
    stream's frames pay for no wrapper."""

    __slots__ = ("_cycle", "_first", "_head", "_loop", "_transport")

    def __init__(
        self,
        cycle: RequestResponseCycle,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._cycle = cycle
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        if self._first:
            self._first = False
            self._head = data
            self._loop.call_soon(self._flush)
        elif self._head is not None:
            head, self._head = self._head, None
            self._transport.writelines((head, data))
            self._cycle.transport = self._transport
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)
        self._cycle.transport = self._transport

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class DeadlineProtocol(HttpToolsProtocol):
    # In slots: uvicorn's protocol keeps 27 attributes in its instance dict, and a
    # shared-key dict turns into a dict of its own past 30, 1.5 KB more per connection
    # (an idle stream's measured memory is mostly its connection's).
    __slots__ = (
        "_deadline",
        "_header_bytes",
        "_header_too_large",
        "_linger",
        "_reading_header",
        "_request_begun",
        "body_timeout",
        "header_timeout",
        "max_header_bytes",
    )

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        header_timeout: float,
        body_timeout: float,
        max_header_bytes: int,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # uvicorn builds each access line's parts (the client's address, the path and
        # query) before its logger drops the line; at a level that drops them all, none
        # are built.
        self.access_log = self.access_log and self.access_logger.isEnabledFor(
            logging.INFO
        )
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.max_header_bytes = max_header_bytes
        # Whether a deadline is armed for this connection (see `Deadlines`).
        self._deadline = False
        # Between a request's first byte (or the connection) and its complete header.
        self._reading_header = False
        self._header_bytes = 0
        self._header_too_large = False
        # Whether any byte of the current request arrived: a connection that never sent
        # one is closed without an answer.
        self._request_begun = False
        # After an answer to a request it refused mid-way (see `_close_answered`).
        self._linger: asyncio.TimerHandle | None = None

    # ---- the deadlines ---------------------------------------------------------------

    def _arm(self, seconds: float, handler: Callable[[], None]) -> None:
        _deadlines(self.loop).arm(self, self.loop.time() + seconds, handler)
        self._deadline = True

    def _disarm(self) -> None:
        if self._deadline:
            _deadlines(self.loop).disarm(self)
            self._deadline = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        super().connection_made(transport)
        self._reading_header = True
        self._arm(self.header_timeout, self._header_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)

    def _close_answered(self) -> None:
        """Close after answering a request the client may still be sending (a header
        or body past its deadline, a malformed or oversized header): the answer and a
        FIN go out, and whatever the client still sends is read and dropped for
        LINGER_SECONDS. Closed at once, the socket would answer those bytes with a
        reset, and the client's system would drop the answer before it was read."""
        if self.transport.is_closing():
            return
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._linger = self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:
            return  # answered and half-closed: dropped (see _close_answered)
        if self._reading_header:
            self._header_bytes += len(data)
        super().data_received(data)
        if (
            self._reading_header
            and self._header_bytes > self.max_header_bytes
            and not self.transport.is_closing()
        ):
            # A header still incomplete past the cap (httptools buffers it whole).
            self._header_too_large = True
            self.send_400_response("")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._request_begun = True
        if not self._reading_header:
            self._reading_header = True
            self._header_bytes = 0
            self._arm(self.header_timeout, self._header_timed_out)

    def on_headers_complete(self) -> None:
        # The bytes counted so far may hold a body after the header: only past the cap
        # is the header itself measured. (Checked here rather than per header, a
        # callback on every header line of every request.)
        if self._header_bytes > self.max_header_bytes and self._header_size() > (
            self.max_header_bytes
        ):
            self._header_too_large = True
            raise HeaderTooLarge
        self._reading_header = False
        self._request_begun = False
        self._arm(self.body_timeout, self._body_timed_out)
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:
            cycle.transport = HeadWithBody(cycle, self.transport, self.loop)  # type: ignore[assignment]  # what the cycle calls of a transport

    def _header_size(self) -> int:
        """The request line and header lines as received, near enough: name, value,
        ": " and CRLF for each line."""
        return len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _header_timed_out(self) -> None:
        self._deadline = False
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._request_begun and (cycle is None or cycle.response_complete):
            self._answer(
                408,
                f"The request header did not arrive within {self.header_timeout:g} seconds",
            )
            self._close_answered()
        else:
            self.transport.close()

    def _body_timed_out(self) -> None:
        self._deadline = False
        if self.transport.is_closing():
            return
        if self.pipeline:
            # The request waits behind another's response (pipelining), and uvicorn
            # does not read its body until that one is done: not the client's delay.
            self._arm(self.body_timeout, self._body_timed_out)
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            self._answer(
                408,
                f"The request body did not arrive within {self.body_timeout:g} seconds",
            )
            # The application waits for the rest of the body: it reads a disconnect,
            # and anything it still sends is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
            self._close_answered()
        else:
            self.transport.close()

    # ---- uvicorn's own answers ------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        """uvicorn answers a request it cannot parse here (text/plain upstream)."""
        if self._header_too_large:
            self._answer(
                431,
                f"The request header is larger than {self.max_header_bytes} bytes",
                code="header_too_large",
            )
        else:
            self._answer(400, "Malformed HTTP request", code="invalid_http")
        self._close_answered()

    def _answer(self, status: int, detail: str, *, code: str | None = None) -> None:
        self._disarm()
        if self.transport.is_closing():
            return
        response = problem_response(
            status, detail=detail, code=code or HTTPStatus(status).name.lower()
        )
        self.transport.write(_raw(response, self.server_state.default_headers))


def protocol(settings: Settings) -> type[asyncio.Protocol]:
    """The protocol "class" for uvicorn's `http` option, carrying the deadlines from
    settings. uvicorn only calls it (and looks for `alpn_protocols` on it), so a partial
    will do; it is pickled by reference into `--workers` processes."""
    return cast(
        type[asyncio.Protocol],
        functools.partial(
            DeadlineProtocol,
            header_timeout=settings.header_read_timeout_seconds,
            body_timeout=settings.body_read_timeout_seconds,
            max_header_bytes=settings.max_header_bytes,
        ),
    )


# ---- the graceful drain -------------------------------------------------------------

# What uvicorn waits for the connections left after the drain before it cancels them.
GRACEFUL_SHUTDOWN_SECONDS = 5


# Allocations (less deallocations) between young-generation collections; Python's
# default is 700. A request or a fan-out pass allocates a few hundred short-lived
# objects, so at the default nearly every one paid for a collection, and the survivors
# they promoted made the full collections, which walk every live object, frequent.
GC_YOUNG_THRESHOLD = 20_000


def tune_collector() -> None:
    """Once the application has started: what startup built (modules, schemas, the
    app, pools) lives as long as the process, so it is frozen out of the collector's
    walks, and young collections run less often (GC_YOUNG_THRESHOLD)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


class DrainingServer(Server):
    """uvicorn's server, draining the application (app/ops/drain.py) when it is told to
    stop, before uvicorn's own shutdown: that one first asks every connection to close
    and waits only `timeout_graceful_shutdown` for them, and the lifespan shutdown
    runs after it, too late to move streams and turns elsewhere. The listening sockets
    stay open while it drains: new requests are answered, 503 where they would start a
    turn or a stream, and /ready tells the load balancer to move away."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        tune_collector()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await drain.drain_all(stop_early=lambda: self.force_exit)
        await super().shutdown(sockets)
        # uvicorn raises the signals it caught again once it has shut down, so SIGTERM
        # would end the process as killed by it (exit -15, 143 in a shell). A stop that
        # drained is a clean exit: status 0.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list) and not self.force_exit:
            captured[:] = [s for s in captured if s != signal.SIGTERM]


class DrainingProcess(Process):
    """A `--workers` worker running a DrainingServer. Pickled into the worker by
    reference to this module, so the worker builds its server from it too."""

    @property
    def server(self) -> Server:
        if self._server is None:
            self._server = DrainingServer(config=self.config)
        return self._server


def run(config: Config) -> None:
    """Serve as `uvicorn.run` does, with DrainingServer: in this process, or with
    `config.workers` worker processes, each of which drains itself on its own SIGTERM
    (the supervisor sends it to each, and waits for each to exit)."""
    if config.workers > 1:
        sock = config.bind_socket()
        # uvicorn's supervisor creates its workers as `Process(...)`, with no way to
        # pass a class: name ours to it (this supervising process only).
        multiprocess.Process = DrainingProcess  # type: ignore[misc]
        Multiprocess(config, sockets=[sock]).run()
        return
    config.load_app()
    server = DrainingServer(config=config)
    server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
