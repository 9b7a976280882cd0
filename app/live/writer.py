"""The socket side of a streaming response: a frame written at once from outside the
response's task, and the rest of that write finished by the task when it has to wait."""

import asyncio
import time
from collections.abc import Generator
from typing import Any

from starlette.types import Send


class StreamWriter:
    """One streaming response writing to its socket. Its stream may write a frame at
    once from outside the response's task (`write_now`); the process timer stops the
    response (by cancelling its task) when one write has waited longer than the send
    timeout."""

    __slots__ = ("send", "send_started", "stuck", "task", "unfinished")

    def __init__(self) -> None:
        # Both set by the response while it streams.
        self.task: asyncio.Task[Any] | None = None
        self.send: Send | None = None
        # Monotonic time the write in progress began; None between writes.
        self.send_started: float | None = None
        self.stuck = False
        # A write `write_now` began that waits for the socket (its coroutine and what
        # that waits on), or the exception it raised: the task finishes it first.
        self.unfinished: tuple[Generator[Any, None, None], Any] | Exception | None = (
            None
        )

    def write_now(self, chunk: bytes) -> bool:
        """Write `chunk` now, outside the response's task. False when the write has to
        wait for the socket, or failed: the task must `finish` it before any other."""
        assert self.send is not None
        write = self.send(
            {"type": "http.response.body", "body": chunk, "more_body": True}
        ).__await__()
        try:
            waiting = write.send(None)
        except StopIteration:
            return True
        except Exception as exc:
            self.unfinished = exc
            return False
        self.unfinished = (write, waiting)
        self.send_started = time.monotonic()
        return False

    async def finish(self) -> None:
        """Finish what `write_now` began (or raise what it raised)."""
        unfinished, self.unfinished = self.unfinished, None
        if isinstance(unfinished, Exception):
            raise unfinished
        if unfinished is not None:
            await _Resumed(*unfinished)
            self.send_started = None

    def abandon(self) -> None:
        """The response ends: nothing more is written, begun or not."""
        self.send = None
        unfinished, self.unfinished = self.unfinished, None
        if isinstance(unfinished, tuple):
            unfinished[0].close()


class _Resumed:
    """The rest of an await begun outside any task, driven as its task would: each
    future it waits on is handed to the awaiting task, which resumes it when done."""

    __slots__ = ("coro", "waiting")

    def __init__(self, coro: Generator[Any, None, None], waiting: Any) -> None:
        self.coro = coro
        self.waiting = waiting

    def __await__(self) -> Generator[Any, None, None]:
        coro, waiting = self.coro, self.waiting
        try:
            while True:
                yield waiting
                waiting = coro.send(None)
        except StopIteration:
            return
        except BaseException:
            coro.close()
            raise
