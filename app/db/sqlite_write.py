"""The write unit of work on SQLite: aiosqlite on the driver connection, the database
write lock taken with the first statement (BEGIN IMMEDIATE)."""

import functools
import sqlite3
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

import orjson
from sqlalchemy.exc import OperationalError

from app.db.rows import EventRow, LockedSession, MessageRow
from app.db.session_row import LOCK_SESSION, UPDATE_SESSION, session_values
from app.db.statements import (
    INSERT_EVENTS,
    INSERT_MESSAGE,
    UPDATE_MESSAGE,
    Statement,
    message_values,
    not_written,
    numbered,
)
from app.db.writes import Write

T = TypeVar("T")


def _sqlite_value(value: Any) -> Any:
    """What SQLAlchemy stores on SQLite: UUIDs as 32 hex digits, timestamps as naive
    UTC text with microseconds."""
    if isinstance(value, uuid.UUID):
        return value.hex
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return value


def _sqlite_uuid(value: str | None) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(hex=value)


def _sqlite_time(value: str) -> datetime:
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


@functools.cache
def _insert_events(count: int) -> str:
    """INSERT_EVENTS for `count` rows, in `?` placeholders."""
    row = "(" + ", ".join("?" * 7) + ")"
    return f"{INSERT_EVENTS} VALUES " + ", ".join([row] * count)


class _Failed(Exception):
    """A statement failed on the connection's thread: which, and SQLite's error."""

    def __init__(self, sql: str, orig: sqlite3.OperationalError) -> None:
        super().__init__(sql)
        self.sql = sql
        self.orig = orig


def _rows(
    conn: sqlite3.Connection, sql: str, text: str, args: Sequence[Any]
) -> list[Any]:
    """On the connection's thread: the statement's rows (its cursor done with there)."""
    try:
        return conn.execute(text, args).fetchall()
    except sqlite3.OperationalError as exc:
        raise _Failed(sql, exc) from exc


class SqliteWrite(Write):
    """On the single writer connection: `BEGIN IMMEDIATE` takes the database write lock
    up front, which is the session row lock here (a deferred transaction that reads and
    then writes can fail with SQLITE_BUSY without waiting)."""

    _statements: ClassVar[dict[str, Statement]] = {}

    SET_USAGE = (
        "UPDATE sessions SET attributes = json_set("
        "COALESCE(attributes, '{}'), '$.usage', json(:usage)) WHERE id = :session_id"
    )

    def _statement(self, sql: str) -> Statement:
        statement = self._statements.get(sql)
        if statement is None:
            statement = self._statements[sql] = numbered(sql, "?")
        return statement

    def _args(self, statement: Statement, values: dict[str, Any]) -> list[Any]:
        return [_sqlite_value(values[n]) for n in statement.names]

    async def _begin(self) -> None:
        await self._in_thread(lambda conn: None)

    async def _in_thread(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work`'s statements on the connection's thread in one trip, the transaction
        begun there first if it is not yet. aiosqlite runs each call it is given on
        that thread (its `_execute`), and a trip there and back costs ~22 µs of CPU
        where a statement costs ~1: a checkpoint's statements share one."""
        await self._connect()

        def run() -> T:
            conn: sqlite3.Connection = self._driver._conn
            if not self._begun:
                _rows(conn, "BEGIN IMMEDIATE", "BEGIN IMMEDIATE", ())
                self._begun = True
            return work(conn)

        try:
            result: T = await self._driver._execute(run)
        except _Failed as failed:
            raise OperationalError(failed.sql, None, failed.orig) from failed.orig
        return result

    async def _fetch(self, sql: str, **values: Any) -> list[Sequence[Any]]:
        step = self._step(sql, values)
        return await self._in_thread(lambda conn: _rows(conn, *step))

    async def _execute(self, sql: str, **values: Any) -> int:
        # One trip to the connection's thread: the statement's rows (RETURNING 1) are
        # its count, and its cursor is done with there (closing a cursor is a trip of
        # its own).
        return len(await self._fetch(sql + " RETURNING 1", **values))

    async def _messages(self, sql: str, **values: Any) -> list[MessageRow]:
        return [
            MessageRow(
                id=uuid.UUID(hex=r[0]),
                session_id=uuid.UUID(hex=r[1]),
                sequence=r[2],
                role=r[3],
                state=r[4],
                visibility=r[5],
                revision=r[6],
                turn_id=_sqlite_uuid(r[7]),
                client_message_id=r[8],
                content=orjson.loads(r[9]),
                extra=orjson.loads(r[10]),
                snapshot=r[11],
                changed_sequence=r[12],
                created_at=_sqlite_time(r[13]),
                updated_at=_sqlite_time(r[14]),
            )
            for r in await self._fetch(sql, **values)
        ]

    async def lock_session(self, session_id: uuid.UUID) -> LockedSession | None:
        rows = await self._fetch(LOCK_SESSION, session_id=session_id)
        if not rows:
            return None
        org, status, last, last_input, turn, cancel, visible, internal, epoch = rows[0]
        return LockedSession(
            session_id,
            uuid.UUID(hex=org),
            status,
            last,
            last_input,
            _sqlite_uuid(turn),
            bool(cancel),
            visible,
            internal,
            epoch,
        )

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
        # One trip to the connection's thread for all of it; the message first: if
        # it is not written, nothing is.
        first = None
        if message is not None:
            sql = INSERT_MESSAGE if inserted else UPDATE_MESSAGE
            first = self._step(sql + " RETURNING 1", message_values(message))
        rest = [
            self._step(
                UPDATE_SESSION,
                session_values(session, now, started=started, finished=finished),
            )
        ]
        if events:
            args: list[Any] = []
            for e in events:
                args += (e.id.hex, session.id.hex, e.sequence, e.type)
                args += (_sqlite_value(e.turn_id), _sqlite_value(now), e.body)
            rest.append((INSERT_EVENTS, _insert_events(len(events)), args))

        def write(conn: sqlite3.Connection) -> bool:
            if first is not None and len(_rows(conn, *first)) != 1:
                return False
            for step in rest:
                _rows(conn, *step)
            return True

        if not await self._in_thread(write):
            assert message is not None
            raise not_written(message, inserted)

    def _step(self, sql: str, values: dict[str, Any]) -> tuple[str, str, list[Any]]:
        """A statement of a checkpoint: its SQL (for errors), its text in `?`
        placeholders and its arguments."""
        statement = self._statement(sql)
        return sql, statement.text, self._args(statement, values)

    def notify(self, channel: str, payload: str) -> None:
        raise NotImplementedError("SQLite deployments use the in-process bus")

    async def commit(self) -> None:
        if self._begun:
            try:
                await self._driver.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                raise OperationalError("COMMIT", None, exc) from exc
            self._begun = False

    async def rollback(self) -> None:
        if self._begun:
            self._begun = False
            try:
                await self._driver.execute("ROLLBACK")
            except sqlite3.Error:
                self.broken = True
