"""How the server's HTTP protocol (app/server.py) hands a response to its socket: the
head and the first piece of body in one send, a stream's head at once, and no access
line built at a level that drops it. Driven through the protocol itself with a
transport that records each send, the way uvicorn drives it from a socket."""

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from app.server import DeadlineProtocol
from app.telemetry.logs import ACCESS_LOGGER

REQUEST = b"GET /answer HTTP/1.1\r\nHost: test\r\n\r\n"


class Recorder(asyncio.Transport):
    """A socket's transport that keeps every send (a `writelines` is one send, as it
    is one system call on uvloop's sockets)."""

    def __init__(self) -> None:
        super().__init__()
        self.sends: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sends.append(bytes(data))

    def writelines(self, data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.sends.append(b"".join(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        addresses = {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}
        return addresses.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def connect(app: Any) -> tuple[DeadlineProtocol, Recorder]:
    config = Config(app=app, log_config=None, lifespan="off", proxy_headers=False)
    config.load()
    connection = DeadlineProtocol(
        config,
        ServerState(),
        {},
        header_timeout=5.0,
        body_timeout=5.0,
        max_header_bytes=65536,
    )
    transport = Recorder()
    connection.connection_made(transport)
    return connection, transport


async def until(predicate: Any) -> None:
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


async def answer(scope: Any, receive: Any, send: Any) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"5")],
        }
    )
    await send({"type": "http.response.body", "body": b"hello"})


async def test_a_response_leaves_in_one_send_head_and_body() -> None:
    connection, transport = connect(answer)
    connection.data_received(REQUEST)
    await until(
        lambda: connection.cycle is not None and connection.cycle.response_complete
    )
    await asyncio.sleep(0)  # the turn of the loop in which a lone head would leave
    assert len(transport.sends) == 1
    (sent,) = transport.sends
    assert sent.startswith(b"HTTP/1.1 200 OK\r\n")
    assert sent.endswith(b"\r\n\r\nhello")
    assert connection.cycle is not None
    assert connection.cycle.transport is transport
    # A second request on the connection: one send again.
    connection.data_received(REQUEST)
    await until(lambda: len(transport.sends) == 2)
    await asyncio.sleep(0)
    assert len(transport.sends) == 2
    assert transport.sends[1].endswith(b"\r\n\r\nhello")
    connection.connection_lost(None)


async def test_a_streams_head_leaves_before_its_first_frame() -> None:
    frame = asyncio.Event()

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await frame.wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n"})

    connection, transport = connect(stream)
    connection.data_received(REQUEST)
    # The head goes alone, without waiting for a frame that may come much later.
    await until(lambda: len(transport.sends) == 1)
    assert transport.sends[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.sends[0].endswith(b"\r\n\r\n")
    # From then on the stream's frames go to the socket's transport itself.
    assert connection.cycle is not None
    assert connection.cycle.transport is transport
    frame.set()
    await until(lambda: len(transport.sends) == 2)
    # The frame, and the end of the chunked body.
    assert transport.sends[1] == b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"
    connection.connection_lost(None)


async def test_a_head_closed_before_its_body_still_leaves() -> None:
    async def fails_after_start(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("after the head")

    connection, transport = connect(fails_after_start)
    connection.data_received(REQUEST)
    await until(lambda: transport.closed)
    # uvicorn closes a response that failed after its start: the head went out first.
    assert len(transport.sends) == 1
    assert transport.sends[0].startswith(b"HTTP/1.1 200 OK\r\n")
    connection.connection_lost(None)


@pytest.mark.parametrize(
    ("level", "built"), [(logging.INFO, True), (logging.WARNING, False)]
)
async def test_access_lines_are_built_only_at_a_level_that_keeps_them(
    level: int, built: bool
) -> None:
    logger = logging.getLogger(ACCESS_LOGGER)
    was = logger.level
    logger.setLevel(level)
    try:
        connection, _ = connect(answer)
        assert connection.access_log is built
    finally:
        logger.setLevel(was)


async def test_a_connection_keeps_its_own_fields_out_of_uvicorns_dict() -> None:
    """Every open connection (an idle stream is mostly one) holds a protocol. uvicorn
    keeps 27 attributes in its instance dict; a dict that shares its keys with the
    class's other instances stays small only up to 30 keys (CPython), and our fields
    past that cost each connection 1.5 KB more. They live in slots."""
    connection, transport = connect(answer)
    connection.data_received(REQUEST)
    await until(lambda: transport.sends)
    own = set(DeadlineProtocol.__slots__)
    assert not own & set(vars(connection))
    assert len(vars(connection)) <= 30
    assert all(hasattr(connection, name) for name in own)
