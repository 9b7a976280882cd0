"""The write unit of work on SQLite: aiosqlite on the driver connection, the database
write lock taken with the first statement (BEGIN IMMEDIATE)."""

import functools
import sqlite3
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

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
        if not self._begun:
            await self._connect()
            try:
                await self._driver.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise OperationalError("BEGIN IMMEDIATE", None, exc) from exc
            self._begun = True

    async def _fetch(self, sql: str, **values: Any) -> list[Sequence[Any]]:
        await self._begin()
        statement = self._statement(sql)
        try:
            rows = await self._driver.execute_fetchall(
                statement.text, self._args(statement, values)
            )
        except sqlite3.OperationalError as exc:
            raise OperationalError(sql, None, exc) from exc
        return list(rows)

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
        # The message first: if it is not written, nothing is.
        if message is not None:
            sql = INSERT_MESSAGE if inserted else UPDATE_MESSAGE
            if await self._execute(sql, **message_values(message)) != 1:
                raise not_written(message, inserted)
        await self._execute(
            UPDATE_SESSION,
            **session_values(session, now, started=started, finished=finished),
        )
        if not events:
            return
        # All of them in one statement: one trip to the connection's thread.
        text = _insert_events(len(events))
        args: list[Any] = []
        for e in events:
            args += (e.id.hex, session.id.hex, e.sequence, e.type)
            args += (_sqlite_value(e.turn_id), _sqlite_value(now), e.body)
        try:
            await self._driver.execute_fetchall(text, args)
        except sqlite3.OperationalError as exc:
            raise OperationalError(INSERT_EVENTS, None, exc) from exc

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
