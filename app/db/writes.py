"""The write unit of work and the statements of the checkpoint path.

A `Write` is one transaction on a connection of the writer pool, plus the outbox of what
to announce once it commits. The checkpoint path (lock the session row, write the
session, message and events, commit) runs on the driver connection itself, asyncpg
prepared statements on PostgreSQL and aiosqlite on SQLite: measured on these machines,
SQLAlchemy Core costs about 60 us of CPU per statement on top of asyncpg's 40-50, and a
checkpoint is four round trips (BEGIN, lock, write, NOTIFY + COMMIT). The SQL is the same
on both databases but for placeholders, `FOR UPDATE`, and the one statement PostgreSQL
writes a checkpoint with (data-modifying CTEs; SQLite runs the three parts in turn).

The unit owns the transaction at the driver level: BEGIN goes out with its first
statement, COMMIT at the end. The SQLAlchemy connection it was checked out as is in
AUTOCOMMIT mode, so Core statements of the cold paths (`await db.core()`) run inside the
same transaction and SQLAlchemy never begins or commits one of its own.

On PostgreSQL a unit can also be optimistic: `lock_session` then answers from the
session heads this process wrote last (`SessionHeads`) instead of locking, and a unit
that only writes one message's checkpoint (a new message, or an update of one at the
revision it read) hands it at commit, with its NOTIFYs, to the next batch
(`app.db.batch`: one statement and one transaction for the checkpoints committed
together, each conditional on its row, and its updated message, still being what it
assumed). Handing it over sets the session's head as the checkpoint will leave it, so
the session's next unit goes in the next batch on top of it. A unit that does anything
more locks the row first, as a pessimistic one does. If the row changed, nothing is
written and the unit raises `SessionChanged`: the caller runs it again, pessimistically
(`Database.transact`).
"""

import abc
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.outbox import Outbox
from app.db.rows import EventRow, LockedSession, MessageRow
from app.db.statements import (
    COUNT_RUNNING_TURNS,
    REQUEST_CANCEL,
    SELECT_BY_CLIENT_ID,
    SELECT_FIRST_INPUT_AFTER,
    SELECT_MESSAGE,
    SELECT_STREAMING,
    SELECT_TURN_INPUT,
)


class Write(abc.ABC):
    """One write unit of work (see the module docstring). Services append to `outbox`
    and never commit; `Database.write()` commits or rolls back."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.outbox = Outbox()
        # The session rows as this unit wrote them (for SessionHeads, once it commits).
        self.written: dict[uuid.UUID, LockedSession] = {}
        # Sessions whose heads this unit set before it committed (a checkpoint handed
        # to the group commit): they are dropped if it does not commit.
        self.pending: set[uuid.UUID] = set()
        self._engine = engine
        # Checked out at the first statement: a request refused before it touches the
        # database never takes a connection from the pool.
        self._conn: AsyncConnection | None = None
        self._driver: Any = None
        self._begun = False
        # Set when the connection failed: it must not go back to the pool.
        self.broken = False

    async def core(self) -> AsyncConnection:
        """The SQLAlchemy connection, for Core statements inside this transaction."""
        await self._begin()
        assert self._conn is not None
        return self._conn

    async def _connect(self) -> None:
        if self._conn is None:
            self._conn = await self._engine.connect()
            raw = await self._conn.get_raw_connection()
            self._driver = raw.driver_connection

    @property
    def began(self) -> bool:
        """Whether a transaction was begun (a refused request never begins one)."""
        return self._begun

    async def close(self) -> None:
        """Give the connection back to the pool (or drop it, if it failed)."""
        if self._conn is not None:
            if self.broken:
                await self._conn.invalidate()
            await self._conn.close()

    # The statements of the checkpoint path.

    @abc.abstractmethod
    async def lock_session(self, session_id: uuid.UUID) -> LockedSession | None:
        """The session row, locked until the unit of work ends."""

    @abc.abstractmethod
    async def save_checkpoint(
        self,
        session: LockedSession,
        now: datetime,
        *,
        message: MessageRow | None,
        inserted: bool,
        events: Sequence[EventRow],
        started: bool = False,
        finished: bool = False,
    ) -> None:
        """Write the session row as `session` holds it, the message (inserted, or
        updated if it is still at the revision before `message.revision`) and the
        events. `started`/`finished` stamp the session's started_at (if unset) and
        finished_at. Raises StaleMessage, or DuplicateMessage for an insert whose
        client_message_id is taken; either way nothing was written."""

    async def message(self, message_id: uuid.UUID) -> MessageRow | None:
        rows = await self._messages(SELECT_MESSAGE, message_id=message_id)
        return rows[0] if rows else None

    async def streaming_messages(self, session_id: uuid.UUID) -> list[MessageRow]:
        return await self._messages(SELECT_STREAMING, session_id=session_id)

    async def first_input_after(
        self, session_id: uuid.UUID, sequence: int
    ) -> MessageRow | None:
        """The oldest user message with a sequence above `sequence`."""
        rows = await self._messages(
            SELECT_FIRST_INPUT_AFTER, session_id=session_id, after=sequence
        )
        return rows[0] if rows else None

    async def turn_input(
        self, session_id: uuid.UUID, turn_id: uuid.UUID
    ) -> MessageRow | None:
        """The user message that started the turn."""
        rows = await self._messages(
            SELECT_TURN_INPUT, session_id=session_id, turn_id=turn_id
        )
        return rows[0] if rows else None

    async def snapshot_by_client_id(
        self, session_id: uuid.UUID, client_message_id: str
    ) -> str | None:
        rows = await self._fetch(
            SELECT_BY_CLIENT_ID,
            session_id=session_id,
            client_message_id=client_message_id,
        )
        return str(rows[0][0]) if rows else None

    # The session's token usage: one key of its attributes, written in place (the
    # attributes may hold a large tool list). Each dialect spells it.
    SET_USAGE: ClassVar[str]

    async def set_usage(self, session_id: uuid.UUID, usage: dict[str, Any]) -> None:
        await self._execute(
            self.SET_USAGE, session_id=session_id, usage=orjson.dumps(usage).decode()
        )

    async def request_cancel(self, session_id: uuid.UUID, now: datetime) -> None:
        await self._execute(REQUEST_CANCEL, session_id=session_id, now=now)

    async def lock_organization(self, organization_id: uuid.UUID) -> None:
        """Serialize, until the unit of work ends, the units of work of one organization
        that take this lock (turn admission). SQLite: the unit already holds the
        database write lock."""
        await self._begin()

    async def running_turns(self, organization_id: uuid.UUID) -> int:
        """How many of the organization's sessions run a turn, on any process, as this
        unit sees them (its own writes included)."""
        rows = await self._fetch(COUNT_RUNNING_TURNS, organization_id=organization_id)
        return int(rows[0][0])

    @abc.abstractmethod
    def notify(self, channel: str, payload: str) -> None:
        """A NOTIFY sent with COMMIT (PostgreSQL): delivered if and when it commits."""

    @abc.abstractmethod
    async def commit(self) -> None: ...

    @abc.abstractmethod
    async def rollback(self) -> None: ...

    # Driver primitives.

    @abc.abstractmethod
    async def _begin(self) -> None: ...

    @abc.abstractmethod
    async def _fetch(self, sql: str, **values: Any) -> list[Sequence[Any]]: ...

    @abc.abstractmethod
    async def _execute(self, sql: str, **values: Any) -> int:
        """Run a statement; returns the number of rows it changed."""

    @abc.abstractmethod
    async def _messages(self, sql: str, **values: Any) -> list[MessageRow]: ...
