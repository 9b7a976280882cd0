"""The Database handle: read and write units of work. Services never commit; these do."""

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
)

from app.backend import Backend
from app.db.batch import CheckpointBatcher
from app.db.engine import create_engines
from app.db.outbox import Outbox
from app.db.pg_write import PgWrite
from app.db.rows import SessionChanged, SessionHeads
from app.db.sqlite_write import SqliteWrite
from app.db.writes import Write
from app.settings import Settings

T = TypeVar("T")

if TYPE_CHECKING:
    from app.metrics import Metrics


def new_write(
    backend: Backend,
    engine: AsyncEngine,
    batcher: CheckpointBatcher | None = None,
    heads: SessionHeads | None = None,
) -> Write:
    """A write unit of work on the writer engine (AUTOCOMMIT connections); optimistic
    with `heads` and `batcher` (PostgreSQL: on SQLite the lock is a local statement,
    and the unit holds the database write lock from its first statement anyway)."""
    if backend is Backend.POSTGRESQL:
        return PgWrite(engine, batcher, heads)
    return SqliteWrite(engine)


class CommitHooks(Protocol):
    """What the live side needs from a write unit of work (see app.live.bus)."""

    async def before_commit(self, db: Write) -> None: ...

    def after_commit(self, outbox: Outbox) -> None: ...

    def commit_unknown(self) -> None: ...


@dataclass
class Database:
    reader: AsyncEngine
    writer: AsyncEngine
    backend: Backend
    hooks: CommitHooks | None = field(default=None)
    # Set by the application when metrics are on: every write's COMMIT is timed.
    metrics: "Metrics | None" = field(default=None)

    def __post_init__(self) -> None:
        self._read = async_sessionmaker(self.reader, expire_on_commit=False)
        # The session rows as this process's commits left them (PostgreSQL only: see
        # app.db.writes, optimistic units).
        shared = self.backend.shared
        self.heads = SessionHeads() if shared else None
        self.batcher = CheckpointBatcher(self.writer) if shared else None

    @classmethod
    def from_settings(cls, settings: Settings) -> "Database":
        reader, writer = create_engines(settings)
        return cls(reader=reader, writer=writer, backend=settings.backend)

    async def transact(self, work: Callable[[Write], Awaitable[T]]) -> T:
        """`work` in an optimistic write unit (its session row assumed from the heads,
        its checkpoint one statement), and again in a pessimistic one if the row was not
        as assumed. `work` must be safe to run twice: it runs again only when the first
        unit wrote nothing."""
        if self.heads is not None:
            try:
                async with self.write(optimistic=True) as db:
                    return await work(db)
            except SessionChanged:
                pass
        async with self.write() as db:
            return await work(db)

    @asynccontextmanager
    async def write(self, *, optimistic: bool = False) -> AsyncIterator[Write]:
        """A write unit of work: commits on success, rolls back on any exception."""
        db = (
            new_write(self.backend, self.writer, self.batcher, self.heads)
            if optimistic
            else new_write(self.backend, self.writer)
        )
        committing = False
        try:
            yield db
            if self.hooks is not None:
                await self.hooks.before_commit(db)
            began, started = db.began, time.perf_counter()
            committing = True
            await db.commit()
            if self.metrics is not None and began:
                self.metrics.checkpoints.observe(
                    ("committed",), time.perf_counter() - started
                )
        except BaseException as exc:
            if self.heads is not None:
                if isinstance(exc, SessionChanged):
                    self.heads.discard(exc.session_id)
                for session_id in db.pending:
                    self.heads.discard(session_id)
            began, started = db.began, time.perf_counter()
            await db.rollback()
            if self.metrics is not None and began:
                self.metrics.checkpoints.observe(
                    ("rolled_back",), time.perf_counter() - started
                )
            if (
                committing
                and self.hooks is not None
                and not isinstance(exc, SessionChanged)
            ):
                # (SessionChanged: refused as a whole, nothing was written.)
                self.hooks.commit_unknown()
            raise
        finally:
            await db.close()
        if self.heads is not None:
            for head in db.written.values():
                self.heads.put(head)
        # Publish only after the commit: nothing is announced for a rolled-back change.
        if self.hooks is not None and db.outbox:
            self.hooks.after_commit(db.outbox)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        """A read-only unit of work (one snapshot on SQLite). Closing it ends the
        transaction and detaches loaded objects without expiring them, so values read
        inside stay readable after it."""
        async with self._read() as db:
            yield db

    @asynccontextmanager
    async def statements(self) -> AsyncIterator[AsyncConnection]:
        """A connection for single reads outside any transaction: each statement sees
        what committed before it, and costs one round trip on PostgreSQL (no BEGIN or
        ROLLBACK around it). For the runner's polling reads; on SQLite a reader
        connection (a local file: transactions cost no round trip)."""
        engine = self.writer if self.backend is Backend.POSTGRESQL else self.reader
        async with engine.connect() as conn:
            yield conn

    async def dispose(self) -> None:
        await self.reader.dispose()
        if self.writer.sync_engine.pool is not self.reader.sync_engine.pool:
            await self.writer.dispose()
