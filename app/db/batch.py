"""Group commit of optimistic checkpoints (PostgreSQL).

An optimistic unit of work (see app.db.writes) ends in one statement that writes its
checkpoint if the session row is still as assumed. Concurrent units share that
statement: while a batch is on its way, the checkpoints committed meanwhile queue,
and the next batch carries all of them (one per session) in one statement and one
transaction. Under load that is one round trip, one WAL flush and one hold of
PostgreSQL's NOTIFY lock (every NOTIFYing transaction holds it through its commit, so
NOTIFYing transactions never share a WAL flush) for many checkpoints; with nothing in
flight a checkpoint goes at once, alone. Once SECOND_BATCH checkpoints have queued
behind a batch on its way, a second batch takes those of other sessions: with one
batch at a time, under many writers, this process sat idle while PostgreSQL ran the
batch and PostgreSQL while this process built the next. (64 writers under wrk: 0.43-0.45
of raw asyncpg's transactions a second with one batch, 0.46-0.53 with the second;
a second batch for any checkpoint queued made the batches small and each POST 17 %
dearer, and a third gained nothing.)

Each checkpoint of a batch is written or not on its own (its session row held as
assumed, an updated message at the revision before its own); a batch whose statement
fails wrote nothing, and each of its units runs again, locking. A new message whose
client_message_id its session already holds (a client's retry) fails the statement on
the unique constraint: its unit alone runs again, locking (and answers the stored
message), and the rest go in the next batch. The constraint is the check because it
always reads the unique index: a lookup in the statement could be planned, once and
for good, through another index of a session's messages while the table was new and
small, and then scan every message of the session for each checkpoint.
"""

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import PG_UNAVAILABLE
from app.db.rows import Optimistic, SessionChanged
from app.db.session_row import (
    WRITTEN,
    WRITTEN_COLUMNS,
    assignments,
    unchanged,
)
from app.db.statements import numbered, searchable

# Checkpoints per statement at most: a bound on its size and on the rows it locks.
MAX_BATCH = 64
# Checkpoints queued behind a batch on its way for a second batch to go meanwhile,
# on the sessions not on their way. (No third: it gained nothing.)
SECOND_BATCH = 16

# The unique constraint on a session's client_message_ids, and the batch's messages
# whose client_message_id their session holds already (read only after a violation).
CLIENT_ID_CONSTRAINT = "uq_messages_session_id_client_message_id"
_TAKEN = """
SELECT m.session_id FROM messages AS m
JOIN unnest($1::uuid[], $2::text[]) AS x(session_id, client_message_id)
    ON m.session_id = x.session_id AND m.client_message_id = x.client_message_id"""


# The sessions first: a row is written only if every column the head assumed still holds
# (the UPDATE waits for a concurrent writer's lock and then checks the row as that
# writer left it) and an updated message is still at the revision before its own
# (`was_revision`, null for a new one; every other writer of a message writes its
# session row too, so a message that changed under a statement fails its session's
# check first). The revision is a subquery per checkpoint, on the primary key: as a
# join the planner may hash the whole table while it believes it small (a new
# database, before its first ANALYZE). Then the messages inserted and updated, the
# events and the NOTIFYs of the sessions written.
_SESSION_ARRAYS = ",\n        ".join(
    [
        *(f":was_{c.name}::{c.pg_type}[]" for c in WRITTEN_COLUMNS),
        *(f":{c.name}::{c.pg_type}[]" for c in WRITTEN_COLUMNS),
    ]
)
_SESSION_NAMES = ",\n        ".join([*(f"was_{name}" for name in WRITTEN), *WRITTEN])

_ASSIGNMENTS = assignments("c.{name}", "t.", indent=8)
_UNCHANGED = unchanged("t", "c")

BATCH = f"""
WITH c AS (
    SELECT * FROM unnest(
        :session_id::uuid[],
        {_SESSION_ARRAYS},
        :started_at::timestamptz[], :finished_at::timestamptz[], :now::timestamptz[],
        :message_id::uuid[], :was_revision::integer[])
    AS c(session_id, {_SESSION_NAMES},
        started_at, finished_at, now, message_id, was_revision)
),
s AS (
    UPDATE sessions AS t SET
        {_ASSIGNMENTS}
    FROM c
    WHERE t.id = c.session_id
        AND {_UNCHANGED}
        AND (SELECT moved.revision FROM messages AS moved
            WHERE moved.id = c.message_id) IS NOT DISTINCT FROM c.was_revision
    RETURNING t.id
),
m AS (
    INSERT INTO messages (id, session_id, sequence, role, state, visibility, revision,
        turn_id, client_message_id, content, extra, snapshot, changed_sequence,
        created_at, updated_at, search_text)
    SELECT * FROM unnest(
        :message_id::uuid[], :session_id::uuid[], :sequence::integer[],
        :role::text[], :state::text[], :visibility::text[], :revision::integer[],
        :turn_id::uuid[], :client_message_id::text[], :content::jsonb[],
        :extra::jsonb[], :snapshot::text[], :changed_sequence::integer[],
        :created_at::timestamptz[], :updated_at::timestamptz[], :search_text::text[])
        AS x(id, session_id, sequence, role, state, visibility, revision, turn_id,
            client_message_id, content, extra, snapshot, changed_sequence,
            created_at, updated_at, search_text)
    WHERE x.session_id IN (SELECT id FROM s)
        AND x.id IN (SELECT message_id FROM c WHERE was_revision IS NULL)
),
u AS (
    UPDATE messages AS t SET
        state = x.state, revision = x.revision, content = x.content, extra = x.extra,
        snapshot = x.snapshot, changed_sequence = x.changed_sequence,
        updated_at = x.updated_at, search_text = x.search_text
    FROM unnest(
        :message_id::uuid[], :session_id::uuid[], :state::text[], :revision::integer[],
        :content::jsonb[], :extra::jsonb[], :snapshot::text[],
        :changed_sequence::integer[], :updated_at::timestamptz[], :search_text::text[],
        :was_revision::integer[])
        AS x(id, session_id, state, revision, content, extra, snapshot,
            changed_sequence, updated_at, search_text, was_revision)
    WHERE t.id = x.id
        AND x.was_revision IS NOT NULL
        AND t.revision = x.was_revision
        AND x.session_id IN (SELECT id FROM s)
),
e AS (
    INSERT INTO events (id, session_id, sequence, type, turn_id, created_at, body)
    SELECT * FROM unnest(
        :event_id::uuid[], :event_session_id::uuid[], :event_sequence::integer[],
        :event_type::text[], :event_turn_id::uuid[], :event_created_at::timestamptz[],
        :event_body::text[])
        AS x(id, session_id, sequence, type, turn_id, created_at, body)
    WHERE x.session_id IN (SELECT id FROM s)
)
SELECT
    (SELECT coalesce(array_agg(id), '{{}}') FROM s),
    (SELECT count(pg_notify(n.channel, n.payload))
     FROM unnest(:notify_session_id::uuid[], :channel::text[], :payload::text[])
         AS n(session_id, channel, payload)
     WHERE n.session_id IN (SELECT id FROM s))"""

_BATCH = numbered(BATCH, "$")
# Columns of the batch taken as they are from the message and event rows.
MESSAGE_FIELDS = (
    "sequence",
    "role",
    "state",
    "visibility",
    "revision",
    "turn_id",
    "snapshot",
    "changed_sequence",
    "created_at",
    "updated_at",
)
EVENT_FIELDS = ("id", "sequence", "type", "turn_id", "body")


def _columns(batch: Sequence[Optimistic]) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {name: [] for name in _BATCH.names}
    for item in batch:
        head, session, message = item.head, item.session, item.message
        for name in WRITTEN:
            columns["was_" + name].append(getattr(head, name))
            columns[name].append(getattr(session, name))
        columns["session_id"].append(session.id)
        columns["started_at"].append(item.now if item.started else None)
        columns["finished_at"].append(item.now if item.finished else None)
        columns["now"].append(item.now)
        columns["client_message_id"].append(message.client_message_id)
        # One message per checkpoint, of its session: it shares the session's
        # `session_id` and `client_message_id` columns; inserted (`was_revision`
        # null) or updated.
        columns["message_id"].append(message.id)
        columns["was_revision"].append(None if item.inserted else message.revision - 1)
        for name in MESSAGE_FIELDS:
            columns[name].append(getattr(message, name))
        columns["content"].append(orjson.dumps(message.content).decode())
        columns["extra"].append(orjson.dumps(message.extra).decode())
        columns["search_text"].append(searchable(message))
        for event in item.events:
            columns["event_session_id"].append(session.id)
            columns["event_created_at"].append(item.now)
            for name in EVENT_FIELDS:
                columns["event_" + name].append(getattr(event, name))
        for channel, payload in item.notifications:
            columns["notify_session_id"].append(session.id)
            columns["channel"].append(channel)
            columns["payload"].append(payload)
    return columns


@dataclass(slots=True)
class _Queued:
    item: Optimistic
    done: "asyncio.Future[None]"


class CheckpointBatcher:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._queue: list[_Queued] = []
        self._senders: set[asyncio.Task[None]] = set()
        # Sessions of the batches on their way: a later checkpoint of one assumes
        # what the earlier writes, so it waits for the batch after.
        self._sending: set[uuid.UUID] = set()

    async def commit(self, item: Optimistic) -> None:
        """Write `item` in the next batch. Raises SessionChanged when it was not
        written (the row was not as assumed, or the batch failed), OperationalError
        when the database was unavailable (whether it was written is unknown)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queued = _Queued(item, done)
        self._queue.append(queued)
        if not self._senders or (
            len(self._senders) == 1 and len(self._queue) >= SECOND_BATCH
        ):
            # A task of its own: a request that goes away must not take the batch
            # of the others with it.
            self._senders.add(asyncio.create_task(self._send()))
        try:
            await done
        except asyncio.CancelledError:
            # Not sent yet: it never will be. (Sent: it commits or not, unknown, as a
            # COMMIT interrupted would.)
            if queued in self._queue:
                self._queue.remove(queued)
            raise

    async def _send(self) -> None:
        batch: list[_Queued] = []
        try:
            while True:
                batch, sessions = self._take()
                if not batch:
                    break
                self._sending |= sessions
                try:
                    await self._write(batch)
                finally:
                    self._sending -= sessions
        except BaseException:
            # Cancelled (the process stops): nobody waits forever. The ones queued
            # were never sent.
            for queued in self._queue:
                if not queued.done.done():
                    queued.done.set_exception(SessionChanged(queued.item.session.id))
            self._queue = []
            raise
        finally:
            # The batch on its way may have committed.
            unknown = OperationalError("COMMIT", None, ConnectionError("stopped"))
            for queued in batch:
                if not queued.done.done():
                    queued.done.set_exception(unknown)
            # At once, not in a done callback: a checkpoint queued before that ran
            # would find no sender free and none coming.
            task = asyncio.current_task()
            if task is not None:
                self._senders.discard(task)

    def _take(self) -> tuple[list[_Queued], set[uuid.UUID]]:
        """The oldest checkpoint of each session not on its way, up to MAX_BATCH, and
        their sessions: a later one of a session assumes what the earlier writes, so it
        waits for the batch after."""
        batch: list[_Queued] = []
        rest: list[_Queued] = []
        sessions: set[uuid.UUID] = set()
        for queued in self._queue:
            session_id = queued.item.session.id
            if (
                session_id in sessions
                or session_id in self._sending
                or len(batch) == MAX_BATCH
            ):
                rest.append(queued)
            else:
                sessions.add(session_id)
                batch.append(queued)
        self._queue = rest
        # Batches in session order, so those of two processes take their row locks in
        # the same order as PostgreSQL walks them; a deadlock (the planner may walk
        # them otherwise) fails one batch as a whole, and its units rerun locking.
        batch.sort(key=lambda queued: queued.item.session.id)
        return batch, sessions

    async def _write(self, batch: list[_Queued]) -> None:
        columns = _columns([queued.item for queued in batch])
        taken: set[uuid.UUID] | None = None
        try:
            async with self._engine.connect() as conn:
                raw = await conn.get_raw_connection()
                driver: asyncpg.Connection = raw.driver_connection
                try:
                    row = await driver.fetchrow(
                        _BATCH.text, *(columns[name] for name in _BATCH.names)
                    )
                except asyncpg.UniqueViolationError as exc:
                    if exc.constraint_name != CLIENT_ID_CONSTRAINT:
                        raise
                    rows = await driver.fetch(
                        _TAKEN, columns["session_id"], columns["client_message_id"]
                    )
                    taken = {session_id for (session_id,) in rows}
                except PG_UNAVAILABLE:
                    await conn.invalidate()
                    raise
        except PG_UNAVAILABLE as exc:
            # Like a COMMIT that went unanswered: whether it was written is unknown.
            error = OperationalError("COMMIT", None, exc)
            for queued in batch:
                if not queued.done.done():
                    queued.done.set_exception(error)
            return
        except Exception:
            # The statement failed as a whole (a race on a unique key, a deadlock):
            # nothing was written; every unit runs again, locking.
            for queued in batch:
                if not queued.done.done():
                    queued.done.set_exception(SessionChanged(queued.item.session.id))
            return
        if taken is not None:
            self._retry_untaken(batch, taken)
            return
        written = set(row[0]) if row is not None else set()
        for queued in batch:
            if queued.done.done():
                continue
            if queued.item.session.id in written:
                queued.done.set_result(None)
            else:
                queued.done.set_exception(SessionChanged(queued.item.session.id))

    def _retry_untaken(self, batch: list[_Queued], taken: set[uuid.UUID]) -> None:
        """The batch wrote nothing: a new message's client_message_id was taken. Its
        unit runs again, locking (and answers the message stored); the others go
        first in the next batch. (None found taken: the row that was is gone again, as
        a rolled-back writer's; every unit runs again, locking.)"""
        again: list[_Queued] = []
        for queued in batch:
            if queued.done.done():
                continue
            if taken and queued.item.session.id not in taken:
                again.append(queued)
            else:
                queued.done.set_exception(SessionChanged(queued.item.session.id))
        self._queue[:0] = again
