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
session heads this process committed last (`SessionHeads`) instead of locking, and a
unit that only writes one new message's checkpoint hands it at commit, with its
NOTIFYs, to the next batch (`app.db.batch`: one statement and one transaction for the
checkpoints committed together, each conditional on its row still being what its head
says). A unit that does anything more locks the row first, as a pessimistic one does.
If the row changed, nothing is written and the unit raises `SessionChanged`: the caller
runs it again, pessimistically (`Database.transact`).
"""

import re
import sqlite3
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

import asyncpg
import orjson
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.outbox import Outbox

if TYPE_CHECKING:
    from app.db.batch import CheckpointBatcher


@dataclass(slots=True)
class LockedSession:
    """What the checkpoint path needs of a session row it holds the lock of. Checkpoints
    update it as they go, so several of them can share one unit of work."""

    id: uuid.UUID
    organization_id: uuid.UUID
    status: str
    last_sequence: int
    # The sequence of the newest user message: input a running turn has not seen yet.
    last_input_sequence: int
    active_turn_id: uuid.UUID | None
    cancel_requested: bool
    visible_message_count: int
    internal_message_count: int
    # The epoch of the runner that owns the session's turns (see app.runner.runner):
    # written back as held, so a runner's claim commits with its checkpoint.
    runner_epoch: int

    def copy(self) -> "LockedSession":
        # A fifth of what dataclasses.replace costs; several per steering POST.
        return LockedSession(
            self.id,
            self.organization_id,
            self.status,
            self.last_sequence,
            self.last_input_sequence,
            self.active_turn_id,
            self.cancel_requested,
            self.visible_message_count,
            self.internal_message_count,
            self.runner_epoch,
        )


@dataclass(slots=True)
class MessageRow:
    id: uuid.UUID
    session_id: uuid.UUID
    sequence: int
    role: str
    state: str
    visibility: str
    revision: int
    turn_id: uuid.UUID | None
    client_message_id: str | None
    content: list[dict[str, Any]]
    extra: dict[str, Any]
    snapshot: str
    changed_sequence: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class EventRow:
    id: uuid.UUID
    sequence: int
    type: str
    turn_id: uuid.UUID | None
    # The wire JSON of the event.
    body: str


@dataclass(slots=True)
class Optimistic:
    """A checkpoint of a session row assumed as `head`, to be written as `session`
    (PostgreSQL; see app.db.batch)."""

    head: LockedSession
    session: LockedSession
    now: datetime
    message: MessageRow
    events: Sequence[EventRow]
    started: bool
    finished: bool
    # (channel, payload): sent if and only if the checkpoint is written.
    notifications: list[tuple[str, str]] = field(default_factory=list)


class StaleMessage(Exception):
    """The message changed since it was read: its revision is not the one expected."""


class DuplicateMessage(Exception):
    """The session already has a message with this client_message_id: nothing of the
    checkpoint was written."""


class SessionChanged(Exception):
    """An optimistic unit of work found the session row not as its head said (or the
    checkpoint's client_message_id taken): nothing was written. Run the unit again,
    locking the row."""

    def __init__(self, session_id: uuid.UUID) -> None:
        super().__init__(f"session {session_id} is not as assumed")
        self.session_id = session_id


class SessionHeads:
    """The session rows as this process's own commits left them, newest first out:
    what an optimistic unit of work assumes instead of locking. A head may be stale
    (another process, or a statement outside the checkpoint path, changed the row):
    the optimistic write checks every column it assumes, so a stale head costs one
    failed statement, never a wrong write."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._heads: dict[uuid.UUID, LockedSession] = {}

    def get(self, session_id: uuid.UUID) -> LockedSession | None:
        head = self._heads.get(session_id)
        return None if head is None else head.copy()

    def put(self, head: LockedSession) -> None:
        held = self._heads.pop(head.id, None)
        # Commits of one session can publish out of order: keep the newest.
        if held is not None and held.last_sequence > head.last_sequence:
            head = held
        self._heads[head.id] = head
        if len(self._heads) > self.capacity:
            del self._heads[next(iter(self._heads))]

    def discard(self, session_id: uuid.UUID) -> None:
        self._heads.pop(session_id, None)


# ---- SQL -------------------------------------------------------------------------------
# Named placeholders (`:name`), numbered per dialect once (`$n` for asyncpg, `?n` for
# SQLite). `::type` casts are PostgreSQL-only and appear only in PostgreSQL statements.

LOCK_SESSION = """
SELECT organization_id, status, last_sequence, last_input_sequence, active_turn_id,
       cancel_requested_at IS NOT NULL, visible_message_count, internal_message_count,
       runner_epoch
FROM sessions WHERE id = :session_id"""

UPDATE_SESSION = """
UPDATE sessions SET
    last_sequence = :last_sequence,
    last_input_sequence = :last_input_sequence,
    status = :status,
    active_turn_id = :active_turn_id,
    visible_message_count = :visible_message_count,
    internal_message_count = :internal_message_count,
    runner_epoch = :runner_epoch,
    cancel_requested_at = CASE WHEN :cancel_requested THEN cancel_requested_at END,
    started_at = COALESCE(started_at, :started_at),
    finished_at = COALESCE(:finished_at, finished_at),
    last_activity_at = :now,
    updated_at = :now
WHERE id = :session_id"""

# A message whose client_message_id the session already has is not inserted
# (DuplicateMessage): the unique constraint is the check, at no extra round trip.
INSERT_MESSAGE = """
INSERT INTO messages (id, session_id, sequence, role, state, visibility, revision,
    turn_id, client_message_id, content, extra, snapshot, changed_sequence,
    created_at, updated_at)
VALUES (:message_id, :session_id, :sequence, :role, :state, :visibility, :revision,
    :turn_id, :client_message_id, :content, :extra, :snapshot, :changed_sequence,
    :created_at, :updated_at)
ON CONFLICT (session_id, client_message_id) DO NOTHING"""

# Every checkpoint bumps the revision by one: a row at any other revision was changed
# by someone else since it was read, and is left alone (StaleMessage).
UPDATE_MESSAGE = """
UPDATE messages SET state = :state, revision = :revision, content = :content,
    extra = :extra, snapshot = :snapshot, changed_sequence = :changed_sequence,
    updated_at = :updated_at
WHERE id = :message_id AND revision = :revision - 1"""

INSERT_EVENT = """
INSERT INTO events (id, session_id, sequence, type, turn_id, created_at, body)
VALUES (:id, :session_id, :sequence, :type, :turn_id, :now, :body)"""

# PostgreSQL: a whole checkpoint in one statement. The CTEs all run, referenced or not;
# the final SELECT says whether the message part matched its row.
PG_INSERT_EVENTS = """
INSERT INTO events (id, session_id, sequence, type, turn_id, created_at, body)
SELECT e.id, :session_id, e.sequence, e.type, e.turn_id, :now, e.body
FROM unnest(:event_ids::uuid[], :event_sequences::integer[], :event_types::text[],
            :event_turn_ids::uuid[], :event_bodies::text[])
    AS e(id, sequence, type, turn_id, body)"""

# The session row and the events are written only if the message was: an insert whose
# client_message_id is taken, or an update of a stale revision, writes nothing at all.
_IF_WRITTEN = "EXISTS (SELECT 1 FROM m)"

PG_CHECKPOINT = {
    "insert": f"WITH m AS ({INSERT_MESSAGE} RETURNING 1),"
    f" s AS ({UPDATE_SESSION} AND {_IF_WRITTEN}),"
    f" e AS ({PG_INSERT_EVENTS} WHERE {_IF_WRITTEN}) SELECT count(*) FROM m",
    "update": f"WITH m AS ({UPDATE_MESSAGE} RETURNING 1),"
    f" s AS ({UPDATE_SESSION} AND {_IF_WRITTEN}),"
    f" e AS ({PG_INSERT_EVENTS} WHERE {_IF_WRITTEN}) SELECT count(*) FROM m",
    None: f"WITH s AS ({UPDATE_SESSION}), e AS ({PG_INSERT_EVENTS}) SELECT 1",
}

MESSAGE_COLUMNS = """id, session_id, sequence, role, state, visibility, revision,
    turn_id, client_message_id, content, extra, snapshot, changed_sequence,
    created_at, updated_at"""

SELECT_MESSAGE = f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = :message_id"

SELECT_STREAMING = f"""
SELECT {MESSAGE_COLUMNS} FROM messages
WHERE session_id = :session_id AND state = 'streaming'
ORDER BY sequence"""

SELECT_FIRST_INPUT_AFTER = f"""
SELECT {MESSAGE_COLUMNS} FROM messages
WHERE session_id = :session_id AND role = 'user' AND sequence > :after
ORDER BY sequence LIMIT 1"""

SELECT_TURN_INPUT = f"""
SELECT {MESSAGE_COLUMNS} FROM messages
WHERE session_id = :session_id AND turn_id = :turn_id AND role = 'user'
ORDER BY sequence LIMIT 1"""

SELECT_BY_CLIENT_ID = """
SELECT snapshot FROM messages
WHERE session_id = :session_id AND client_message_id = :client_message_id"""

REQUEST_CANCEL = "UPDATE sessions SET cancel_requested_at = :now WHERE id = :session_id"

LOCK_ORGANIZATION = "SELECT pg_advisory_xact_lock(:lock_class, :lock_id)"
# The advisory-lock class of organization locks ("EVMO").
ORGANIZATION_LOCK = 0x45564D4F


def _int4(value: uuid.UUID) -> int:
    """A signed 32-bit key for an advisory lock: the UUID's low bits (organizations that
    collide merely share a lock)."""
    low = value.int & 0xFFFFFFFF
    return low - (1 << 32) if low >= 1 << 31 else low


_PLACEHOLDER = re.compile(r"(?<![:\w]):(\w+)")


@dataclass(frozen=True, slots=True)
class Statement:
    text: str
    names: tuple[str, ...]


def numbered(sql: str, style: str) -> Statement:
    """`:name` placeholders as `<style><n>`, the same number for every use of a name."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"{style}{names.index(name) + 1}"

    return Statement(_PLACEHOLDER.sub(number, sql), tuple(names))


def _session_values(
    session: LockedSession, now: datetime, *, started: bool, finished: bool
) -> dict[str, Any]:
    return {
        "session_id": session.id,
        "last_sequence": session.last_sequence,
        "last_input_sequence": session.last_input_sequence,
        "status": session.status,
        "active_turn_id": session.active_turn_id,
        "visible_message_count": session.visible_message_count,
        "internal_message_count": session.internal_message_count,
        "cancel_requested": session.cancel_requested,
        "runner_epoch": session.runner_epoch,
        "started_at": now if started else None,
        "finished_at": now if finished else None,
        "now": now,
    }


def _message_values(message: MessageRow) -> dict[str, Any]:
    return {
        "message_id": message.id,
        "session_id": message.session_id,
        "sequence": message.sequence,
        "role": message.role,
        "state": message.state,
        "visibility": message.visibility,
        "revision": message.revision,
        "turn_id": message.turn_id,
        "client_message_id": message.client_message_id,
        "content": orjson.dumps(message.content).decode(),
        "extra": orjson.dumps(message.extra).decode(),
        "snapshot": message.snapshot,
        "changed_sequence": message.changed_sequence,
        "created_at": message.created_at,
        "updated_at": message.updated_at,
    }


def _not_written(message: MessageRow, inserted: bool) -> Exception:
    if inserted:
        return DuplicateMessage(
            f"client_message_id {message.client_message_id!r} is already stored"
        )
    return StaleMessage(
        f"message {message.id} is not at revision {message.revision - 1}"
    )


def _pg_literal(value: str) -> str:
    # An escape string literal: its meaning does not depend on standard_conforming_strings.
    return "E'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Write:
    """One write unit of work (see the module docstring). Services append to `outbox`
    and never commit; `Database.write()` commits or rolls back."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.outbox = Outbox()
        # The session rows as this unit wrote them (for SessionHeads, once it commits).
        self.written: dict[uuid.UUID, LockedSession] = {}
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

    async def lock_session(self, session_id: uuid.UUID) -> LockedSession | None:
        """The session row, locked until the unit of work ends."""
        raise NotImplementedError

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
        raise NotImplementedError

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

    async def request_cancel(self, session_id: uuid.UUID, now: datetime) -> None:
        await self._execute(REQUEST_CANCEL, session_id=session_id, now=now)

    async def lock_organization(self, organization_id: uuid.UUID) -> None:
        """Serialize, until the unit of work ends, the units of work of one organization
        that take this lock (turn admission). SQLite: the unit already holds the
        database write lock."""
        await self._begin()

    def notify(self, channel: str, payload: str) -> None:
        """A NOTIFY sent with COMMIT (PostgreSQL): delivered if and when it commits."""
        raise NotImplementedError

    async def commit(self) -> None:
        raise NotImplementedError

    async def rollback(self) -> None:
        raise NotImplementedError

    # Driver primitives.

    async def _begin(self) -> None:
        raise NotImplementedError

    async def _fetch(self, sql: str, **values: Any) -> list[Sequence[Any]]:
        raise NotImplementedError

    async def _execute(self, sql: str, **values: Any) -> int:
        """Run a statement; returns the number of rows it changed."""
        raise NotImplementedError

    async def _messages(self, sql: str, **values: Any) -> list[MessageRow]:
        raise NotImplementedError


# ---- PostgreSQL ------------------------------------------------------------------------

# Failures of the connection or the server rather than of the statement: the request is
# answered 503 and the connection is not reused.
PG_UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    # admin shutdown, crash shutdown, cannot connect now, statement timeout
    asyncpg.exceptions.OperatorInterventionError,
)


class PgWrite(Write):
    _statements: ClassVar[dict[str, Statement]] = {}

    def __init__(
        self,
        engine: AsyncEngine,
        batcher: "CheckpointBatcher | None" = None,
        heads: SessionHeads | None = None,
    ) -> None:
        super().__init__(engine)
        self._notifications: list[tuple[str, str]] = []
        # Optimistic units only: the heads to assume, the rows assumed (as assumed),
        # and the one checkpoint deferred to commit, which the batcher writes.
        self._heads = heads
        self._batcher = batcher
        self._assumed: dict[uuid.UUID, LockedSession] = {}
        self._deferred: Optimistic | None = None

    def _statement(self, sql: str) -> Statement:
        statement = self._statements.get(sql)
        if statement is None:
            statement = self._statements[sql] = numbered(sql, "$")
        return statement

    def _unavailable(self, exc: BaseException, sql: str) -> OperationalError:
        self.broken = True
        return OperationalError(sql, None, exc, connection_invalidated=True)

    async def _begin(self) -> None:
        if not self._begun:
            await self._connect()
            try:
                await self._driver.execute("BEGIN")
            except PG_UNAVAILABLE as exc:
                raise self._unavailable(exc, "BEGIN") from exc
            self._begun = True
            if self._assumed:
                await self._lock_assumed()

    async def _lock_assumed(self) -> None:
        """The unit does more than its deferred checkpoint: lock the rows it assumed
        and go on as a pessimistic unit, if they are as assumed (else SessionChanged)."""
        assumed, self._assumed = self._assumed, {}
        for session_id, head in assumed.items():
            locked = await self.lock_session(session_id)
            if locked != head:
                raise SessionChanged(session_id)
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            try:
                await self._save_locked(
                    deferred.session,
                    deferred.now,
                    deferred.message,
                    "insert",
                    deferred.events,
                    started=deferred.started,
                    finished=deferred.finished,
                )
            except DuplicateMessage as exc:
                # The caller saw its checkpoint accepted; a locking rerun answers it.
                raise SessionChanged(deferred.session.id) from exc

    async def _fetch(self, sql: str, **values: Any) -> list[Sequence[Any]]:
        await self._begin()
        statement = self._statement(sql)
        try:
            rows: list[Sequence[Any]] = await self._driver.fetch(
                statement.text, *(values[n] for n in statement.names)
            )
        except PG_UNAVAILABLE as exc:
            raise self._unavailable(exc, sql) from exc
        return rows

    async def _execute(self, sql: str, **values: Any) -> int:
        await self._begin()
        statement = self._statement(sql)
        try:
            status: str = await self._driver.execute(
                statement.text, *(values[n] for n in statement.names)
            )
        except PG_UNAVAILABLE as exc:
            raise self._unavailable(exc, sql) from exc
        return int(status.rpartition(" ")[2] or 0)

    async def _messages(self, sql: str, **values: Any) -> list[MessageRow]:
        # UUIDs and timestamps arrive typed; SQLAlchemy's jsonb codec on these
        # connections decodes content and extra.
        return [MessageRow(*row) for row in await self._fetch(sql, **values)]

    async def lock_session(self, session_id: uuid.UUID) -> LockedSession | None:
        if self._heads is not None and not self._begun:
            head = self._heads.get(session_id)
            if head is not None and session_id not in self._assumed:
                self._assumed[session_id] = head.copy()
                return head
        rows = await self._fetch(LOCK_SESSION + " FOR UPDATE", session_id=session_id)
        return LockedSession(session_id, *rows[0]) if rows else None

    async def lock_organization(self, organization_id: uuid.UUID) -> None:
        # A transaction-scoped advisory lock in a key space of its own (the two-key
        # form, class ORGANIZATION_LOCK), apart from the runner leases' one-key locks.
        await self._fetch(
            LOCK_ORGANIZATION,
            lock_class=ORGANIZATION_LOCK,
            lock_id=_int4(organization_id),
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
        kind = None if message is None else "insert" if inserted else "update"
        if (
            message is not None
            and kind == "insert"
            and not self._begun
            and self._deferred is None
            and session.id in self._assumed
        ):
            # Only a new message goes optimistic: it cannot be stale, so the session
            # row is all the checkpoint assumes.
            self._deferred = Optimistic(
                self._assumed[session.id],
                session.copy(),
                now,
                message,
                list(events),
                started,
                finished,
            )
        else:
            await self._save_locked(
                session, now, message, kind, events, started=started, finished=finished
            )
        self.written[session.id] = session.copy()

    async def _save_locked(
        self,
        session: LockedSession,
        now: datetime,
        message: MessageRow | None,
        kind: str | None,
        events: Sequence[EventRow],
        *,
        started: bool,
        finished: bool,
    ) -> None:
        values = _session_values(session, now, started=started, finished=finished)
        values["event_ids"] = [e.id for e in events]
        values["event_sequences"] = [e.sequence for e in events]
        values["event_types"] = [e.type for e in events]
        values["event_turn_ids"] = [e.turn_id for e in events]
        values["event_bodies"] = [e.body for e in events]
        if message is not None:
            values.update(_message_values(message))
        rows = await self._fetch(PG_CHECKPOINT[kind], **values)
        if message is not None and rows[0][0] != 1:
            raise _not_written(message, kind == "insert")

    def notify(self, channel: str, payload: str) -> None:
        self._notifications.append((channel, payload))

    @property
    def began(self) -> bool:
        # A deferred checkpoint is a transaction too, begun and ended at commit.
        return self._begun or self._deferred is not None

    async def commit(self) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            # The unit did nothing but this checkpoint: it goes in the next batch,
            # with its NOTIFYs (app.db.batch).
            assert self._batcher is not None
            deferred.notifications = self._notifications
            await self._batcher.commit(deferred)
            return
        # The NOTIFYs travel with COMMIT in one simple-query round trip (they are only
        # delivered at commit anyway).
        script = "; ".join(
            f"SELECT pg_notify({_pg_literal(channel)}, {_pg_literal(payload)})"
            for channel, payload in self._notifications
        )
        if self._begun:
            script = f"{script}; COMMIT" if script else "COMMIT"
        if not script:
            return
        await self._connect()
        try:
            await self._driver.execute(script)
        except PG_UNAVAILABLE as exc:
            raise self._unavailable(exc, "COMMIT") from exc
        self._begun = False

    async def rollback(self) -> None:
        if self._begun and not self.broken:
            self._begun = False
            try:
                await self._driver.execute("ROLLBACK")
            except PG_UNAVAILABLE:
                self.broken = True


# ---- SQLite ------------------------------------------------------------------------------


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


class SqliteWrite(Write):
    """On the single writer connection: `BEGIN IMMEDIATE` takes the database write lock
    up front, which is the session row lock here (a deferred transaction that reads and
    then writes can fail with SQLITE_BUSY without waiting)."""

    _statements: ClassVar[dict[str, Statement]] = {}

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
        await self._begin()
        statement = self._statement(sql)
        try:
            cursor = await self._driver.execute(
                statement.text, self._args(statement, values)
            )
        except sqlite3.OperationalError as exc:
            raise OperationalError(sql, None, exc) from exc
        count: int = cursor.rowcount
        await cursor.close()
        return count

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
            if await self._execute(sql, **_message_values(message)) != 1:
                raise _not_written(message, inserted)
        await self._execute(
            UPDATE_SESSION,
            **_session_values(session, now, started=started, finished=finished),
        )
        statement = self._statement(INSERT_EVENT)
        rows = [
            self._args(
                statement,
                {
                    "id": e.id,
                    "session_id": session.id,
                    "sequence": e.sequence,
                    "type": e.type,
                    "turn_id": e.turn_id,
                    "now": now,
                    "body": e.body,
                },
            )
            for e in events
        ]
        try:
            cursor = await self._driver.executemany(statement.text, rows)
        except sqlite3.OperationalError as exc:
            raise OperationalError(INSERT_EVENT, None, exc) from exc
        await cursor.close()

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


def new_write(
    engine: AsyncEngine,
    batcher: "CheckpointBatcher | None" = None,
    heads: SessionHeads | None = None,
) -> Write:
    """A write unit of work on the writer engine (AUTOCOMMIT connections); optimistic
    with `heads` and `batcher` (PostgreSQL: on SQLite the lock is a local statement,
    and the unit holds the database write lock from its first statement anyway)."""
    if engine.dialect.name == "postgresql":
        return PgWrite(engine, batcher, heads)
    return SqliteWrite(engine)
