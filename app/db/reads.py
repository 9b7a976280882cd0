"""Request-path reads, and what a turn reads before each step: each is one statement on
a connection of its own, with no ORM, no transaction round trips and no connection
ping. The SQL is the same on both databases but for placeholders and typed NULLs
(app/db/read_statements.py); the two drivers are here.

* PostgreSQL: an asyncpg pool of its own, prepared statements, text returned as bytes.
  One statement runs on one snapshot, so a page's session counters and its rows agree.
* SQLite: a few read-only aiosqlite connections; one statement is one thread hop.
"""

import asyncio
import sqlite3
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

import aiosqlite
import asyncpg
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from app.backend import Backend
from app.db import read_statements
from app.db.engine import PG_UNAVAILABLE, pg_connect_arguments, read_json
from app.schemas import MAX_INT32
from app.settings import Settings


@dataclass(frozen=True, slots=True)
class SessionHead:
    """What every read needs of the session row: who owns it and its committed state."""

    organization_id: uuid.UUID
    last_sequence: int
    visible_message_count: int
    internal_message_count: int


@dataclass(frozen=True, slots=True)
class PageRows:
    head: SessionHead
    # (sequence, snapshot bytes), newest first, at most limit + 1.
    rows: list[tuple[int, bytes]]


@dataclass(frozen=True, slots=True)
class MessageRow:
    head: SessionHead
    snapshot: bytes | None


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    sequence: int
    id: uuid.UUID
    type: str
    body: bytes  # the event's wire JSON, as stored


@dataclass(frozen=True, slots=True)
class ChangedMessage:
    """A message as a checkpoint left it: what its `message` Mutation is made of."""

    changed_sequence: int
    visible: bool
    snapshot: bytes
    id: uuid.UUID
    revision: int
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Checkpoints:
    events: list[LoggedEvent]  # oldest first
    messages: list[ChangedMessage]


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    outcome: bytes | None  # the turn's turn.completed|failed|cancelled event
    status: str | None  # the session's status, while this is its active turn
    messages: list[bytes]  # its visible agent messages' snapshots, oldest first
    asking: list[bytes]  # its streaming messages with an interaction part


@dataclass(frozen=True, slots=True)
class ActiveTurnRow:
    """What a session's runner reads before each turn: the active turn, the session's
    attributes, status and cancel request, and whether the turn's agent message is
    still streaming (a turn left unfinished, to be resumed)."""

    turn_id: uuid.UUID | None
    attributes: dict[str, Any]
    status: str
    cancel_requested: bool
    resumed: bool


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """A message as a step's history holds it."""

    snapshot: bytes
    role: str
    sequence: int
    visibility: str
    content: list[dict[str, Any]]
    changed_sequence: int


def _upto(before_sequence: int | None) -> int:
    # Sequences are int32: the highest one a page may hold.
    return MAX_INT32 if before_sequence is None else before_sequence - 1


def _text(value: str | bytes) -> str:
    # Text comes back as bytes where the driver is told to (snapshots are served as
    # stored); the short columns read as strings are decoded here.
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _json(value: str | bytes | None) -> Any:
    return None if value is None else read_json(value)


def _history(records: Sequence[Sequence[Any]]) -> list[HistoryRow]:
    return [
        HistoryRow(
            _bytes(snapshot),
            _text(role),
            sequence,
            _text(visibility),
            _json(content),
            changed,
        )
        for snapshot, role, sequence, visibility, content, changed in records
    ]


def _head(record: Sequence[Any], parse: Callable[[Any], uuid.UUID]) -> SessionHead:
    return SessionHead(parse(record[0]), record[1], record[2], record[3])


class Reads:
    """The reads, written once. Each driver supplies its placeholders and typed
    NULLs, how a statement is fetched, and how UUIDs are bound and read back."""

    placeholders: ClassVar[tuple[str, ...]]
    nulls: ClassVar[dict[str, str]]

    def __init__(self) -> None:
        p = self.placeholders
        self._pages = {
            flag: read_statements.page_sql(flag, p, self.nulls)
            for flag in (False, True)
        }
        self._message = read_statements.message_sql(p)
        self._head = read_statements.head_sql(p)
        self._turn_watch = read_statements.turn_watch_sql(p)
        self._checkpoints = read_statements.checkpoints_sql(p, self.nulls)
        self._active_turn = read_statements.active_turn_sql(p)
        self._session_part = read_statements.session_part_sql(p)
        self._newest_messages = read_statements.newest_messages_sql(p)
        self._changed_messages = read_statements.changed_messages_sql(p)
        self._turn_outcome = read_statements.turn_outcome_sql(p, self.nulls)
        self._rows_after = {
            "messages": read_statements.rows_after_sql("messages", "snapshot", p),
            "events": read_statements.rows_after_sql("events", "body", p),
        }

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def _fetch(self, sql: str, *args: Any) -> Sequence[Sequence[Any]]:
        raise NotImplementedError

    def _bind(self, value: uuid.UUID) -> Any:
        return value

    def _uuid(self, value: Any) -> uuid.UUID:
        return value  # type: ignore[no-any-return]  # the driver decodes uuid columns

    def _time(self, value: Any) -> datetime:
        return value  # type: ignore[no-any-return]  # the driver decodes timestamps

    async def page(
        self,
        session_id: uuid.UUID,
        *,
        limit: int,
        before_sequence: int | None,
        include_internal: bool,
    ) -> PageRows | None:
        """The session head and up to `limit` messages below `before_sequence`, newest
        first; None when the session does not exist."""
        records = await self._fetch(
            self._pages[include_internal],
            self._bind(session_id),
            _upto(before_sequence),
            limit,
        )
        head: SessionHead | None = None
        rows: list[tuple[int, bytes]] = []
        for record in records:
            if record[4] is None:
                head = _head(record, self._uuid)
            else:
                rows.append((record[4], record[5]))
        if head is None:
            return None
        # UNION ALL keeps no order of its own.
        rows.sort(reverse=True)
        return PageRows(head, rows)

    async def message(
        self, session_id: uuid.UUID, message_id: uuid.UUID
    ) -> MessageRow | None:
        records = await self._fetch(
            self._message, self._bind(session_id), self._bind(message_id)
        )
        if not records:
            return None
        return MessageRow(_head(records[0], self._uuid), records[0][4])

    async def rows_after(
        self,
        table: Literal["messages", "events"],
        session_id: uuid.UUID,
        *,
        after: int,
        upto: int,
        limit: int,
    ) -> list[tuple[int, bytes]]:
        """Up to `limit` stored messages (their snapshots) or events (their bodies) of
        the session with a sequence in (after, upto], oldest first, as stored."""
        records = await self._fetch(
            self._rows_after[table], self._bind(session_id), after, upto, limit
        )
        return [(record[0], _bytes(record[1])) for record in records]

    async def head(self, session_id: uuid.UUID) -> SessionHead | None:
        """The session row's owner and counters; None when it does not exist."""
        records = await self._fetch(self._head, self._bind(session_id))
        return _head(records[0], self._uuid) if records else None

    async def turn_watch(
        self, session_id: uuid.UUID, message_id: uuid.UUID
    ) -> tuple[bool, int | None]:
        """What a running turn checks on every wake-up of its session: whether a
        cancel was requested, and the stored revision of its streaming message (None:
        the session or the message is gone)."""
        records = await self._fetch(
            self._turn_watch, self._bind(session_id), self._bind(message_id)
        )
        if not records:
            return False, None
        return bool(records[0][0]), records[0][1]

    async def active_turn(self, session_id: uuid.UUID) -> ActiveTurnRow | None:
        """The session's turn as its runner reads it; None: no such session."""
        records = await self._fetch(self._active_turn, self._bind(session_id))
        if not records:
            return None
        turn_id, attributes, status, cancel_requested, resumed = records[0]
        return ActiveTurnRow(
            None if turn_id is None else self._uuid(turn_id),
            _json(attributes) or {},
            _text(status),
            bool(cancel_requested),
            bool(resumed),
        )

    async def session_part(
        self, session_id: uuid.UUID
    ) -> tuple[bool, dict[str, Any]] | None:
        """Whether a cancel of the session's turn was requested, and its attributes;
        None: no such session."""
        records = await self._fetch(self._session_part, self._bind(session_id))
        if not records:
            return None
        return bool(records[0][0]), _json(records[0][1]) or {}

    async def newest_messages(
        self, session_id: uuid.UUID, limit: int
    ) -> list[HistoryRow]:
        """The session's `limit` newest messages, newest first."""
        return _history(
            await self._fetch(self._newest_messages, self._bind(session_id), limit)
        )

    async def changed_messages(
        self, session_id: uuid.UUID, after: int, limit: int
    ) -> list[HistoryRow]:
        """Up to `limit` messages of the session changed after `after` (their
        `changed_sequence`), in the order they changed."""
        return _history(
            await self._fetch(
                self._changed_messages, self._bind(session_id), after, limit
            )
        )

    async def checkpoints(
        self, session_id: uuid.UUID, *, after: int, upto: int
    ) -> Checkpoints:
        """What committed in (after, upto]: what the fan-out reads once for every
        subscriber of a session at a wake-up."""
        records = await self._fetch(
            self._checkpoints, self._bind(session_id), after, upto
        )
        events: list[LoggedEvent] = []
        messages: list[ChangedMessage] = []
        for kind, sequence, row_id, text, body, revision, updated_at in records:
            if kind == 0:
                events.append(
                    LoggedEvent(sequence, self._uuid(row_id), _text(text), body)
                )
            else:
                messages.append(
                    ChangedMessage(
                        sequence,
                        _text(text) == "visible",
                        body,
                        self._uuid(row_id),
                        revision,
                        self._time(updated_at),
                    )
                )
        events.sort(key=lambda event: event.sequence)
        return Checkpoints(events, messages)

    async def turn_outcome(
        self, session_id: uuid.UUID, turn_id: uuid.UUID
    ) -> TurnOutcome:
        """A turn's outcome event if it ended, the session's status while it is the
        active turn, and its messages (see `_turn_outcome_sql`)."""
        records = await self._fetch(
            self._turn_outcome, self._bind(session_id), self._bind(turn_id)
        )
        outcome: bytes | None = None
        status: str | None = None
        listed: list[tuple[int, bytes]] = []
        asking: list[bytes] = []
        for kind, sequence, is_listed, is_asking, text in records:
            if kind == 0:
                outcome = text
            elif kind == 1:
                status = _text(text)
            else:
                if is_listed:
                    listed.append((sequence, text))
                if is_asking:
                    asking.append(text)
        listed.sort()
        return TurnOutcome(outcome, status, [text for _, text in listed], asking)


async def _noop_reset(_conn: asyncpg.Connection) -> None:
    # The pool's default reset is a round trip per release (RESET ALL, UNLISTEN ...);
    # these connections only ever run single SELECTs, so there is nothing to reset.
    return None


async def _text_as_bytes(conn: asyncpg.Connection) -> None:
    # Snapshots are served as stored: skip decoding them to str and encoding them back.
    await conn.set_type_codec(
        "text",
        schema="pg_catalog",
        encoder=lambda value: value,
        decoder=lambda value: value,
        format="binary",
    )


class PgReads(Reads):
    placeholders: ClassVar[tuple[str, ...]] = ("$1", "$2", "$3", "$4")
    nulls: ClassVar[dict[str, str]] = {
        "int": "NULL::integer",
        "text": "NULL::text",
        "uuid": "NULL::uuid",
        "time": "NULL::timestamptz",
    }

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self._dsn = (
            make_url(settings.database_url)
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )
        self._settings = settings
        self._pool: asyncpg.Pool | None = None

    async def start(self) -> None:
        self._pool = await asyncpg.create_pool(
            self._dsn,
            min_size=1,
            max_size=self._settings.db_pool_size,
            reset=_noop_reset,
            init=_text_as_bytes,
            **pg_connect_arguments(self._settings, "evermirror-read"),
        )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    async def _fetch(self, sql: str, *args: Any) -> Sequence[Sequence[Any]]:
        assert self._pool is not None
        try:
            async with self._pool.acquire() as conn:
                records: list[asyncpg.Record] = await conn.fetch(sql, *args)
        except PG_UNAVAILABLE as exc:
            # What every caller already treats as "the database is unavailable":
            # a 503 on a request, a retry in the runner.
            raise OperationalError(sql, None, exc, connection_invalidated=True) from exc
        return records


class SqliteReads(Reads):
    """Read-only connections to the database file (WAL: readers never wait for the
    writer). SQLite stores UUIDs as 32 hex characters."""

    placeholders: ClassVar[tuple[str, ...]] = ("?1", "?2", "?3", "?4")
    nulls: ClassVar[dict[str, str]] = {
        "int": "NULL",
        "text": "NULL",
        "uuid": "NULL",
        "time": "NULL",
    }

    def __init__(self, settings: Settings, size: int = 4) -> None:
        super().__init__()
        database = make_url(settings.database_url).database
        self._path = database or ":memory:"
        self._busy_timeout_ms = settings.sqlite_busy_timeout_ms
        self._size = size
        self._idle: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        self._all: list[aiosqlite.Connection] = []

    async def start(self) -> None:
        for _ in range(self._size):
            conn = await aiosqlite.connect(
                self._path, timeout=self._busy_timeout_ms / 1000
            )
            conn.text_factory = bytes
            await conn.execute("PRAGMA query_only=ON")
            self._all.append(conn)
            self._idle.put_nowait(conn)

    async def close(self) -> None:
        for conn in self._all:
            await conn.close()
        self._all.clear()

    async def _fetch(self, sql: str, *args: Any) -> Sequence[Sequence[Any]]:
        conn = await self._idle.get()
        try:
            return list(await conn.execute_fetchall(sql, args))
        except sqlite3.OperationalError as exc:
            # A locked or unreadable file: what callers treat as "the database is
            # unavailable", as on PostgreSQL.
            raise OperationalError(sql, None, exc) from exc
        finally:
            self._idle.put_nowait(conn)

    def _bind(self, value: uuid.UUID) -> Any:
        return value.hex

    def _uuid(self, value: Any) -> uuid.UUID:
        return uuid.UUID(hex=value.decode() if isinstance(value, bytes) else value)

    def _time(self, value: Any) -> datetime:
        # Stored without an offset, as UTC (app.db.types.UtcDateTime).
        return datetime.fromisoformat(_text(value)).replace(tzinfo=UTC)


def create_reads(settings: Settings) -> Reads:
    if settings.backend is Backend.SQLITE:
        return SqliteReads(settings)
    return PgReads(settings)
