"""Units of work with an admission limit: the runner's view of the database.

Every turn the process runs reads and writes through the same pool as the requests.
Unbounded, a burst of turns takes every pooled connection and the requests queue behind
them: under 64 writers on PostgreSQL, POSTs fell from about 1,100 to 100 a second once
nothing else paced the turns. The runner's units of work therefore run at most
`RUNNER_DB_SLOTS` at a time; the rest of the pool stays for requests, and a turn waits
for a slot, never a request for a connection the turns hold.
"""

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.db.session import Database
from app.db.writes import Write


class Units(Protocol):
    """What the runner needs of a database: its units of work."""

    def write(
        self, *, optimistic: bool = False
    ) -> AbstractAsyncContextManager[Write]: ...

    def read(self) -> AbstractAsyncContextManager[AsyncSession]: ...

    def statements(self) -> AbstractAsyncContextManager[AsyncConnection]: ...


class Admitted:
    """`database`'s units of work, at most `slots` of them at once. A unit opened
    inside another of the same task runs on the outer one's slot (a task never waits
    for a slot it holds)."""

    def __init__(self, database: Database, slots: int) -> None:
        self.database = database
        self._slots = asyncio.Semaphore(slots)
        self._holding: ContextVar[bool] = ContextVar("admitted", default=False)

    @asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        if self._holding.get():
            yield
            return
        async with self._slots:
            token = self._holding.set(True)
            try:
                yield
            finally:
                self._holding.reset(token)

    @asynccontextmanager
    async def write(self, *, optimistic: bool = False) -> AsyncIterator[Write]:
        async with self._slot(), self.database.write(optimistic=optimistic) as db:
            yield db

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with self._slot(), self.database.read() as db:
            yield db

    @asynccontextmanager
    async def statements(self) -> AsyncIterator[AsyncConnection]:
        async with self._slot(), self.database.statements() as conn:
            yield conn
