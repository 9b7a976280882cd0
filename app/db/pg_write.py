"""The write unit of work on PostgreSQL: asyncpg prepared statements on the driver
connection, NOTIFYs sent with COMMIT, and optimistic units whose one checkpoint goes to
the next batch (app/db/batch.py)."""

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import PG_UNAVAILABLE
from app.db.rows import (
    DuplicateMessage,
    EventRow,
    LockedSession,
    MessageRow,
    Optimistic,
    SessionChanged,
    SessionHeads,
)
from app.db.session_row import LOCK_SESSION, session_values
from app.db.statements import (
    LOCK_ORGANIZATION,
    ORGANIZATION_LOCK,
    PG_CHECKPOINT,
    Statement,
    int4,
    message_values,
    not_written,
    numbered,
    pg_literal,
)
from app.db.writes import Write

if TYPE_CHECKING:
    from app.db.batch import CheckpointBatcher


class PgWrite(Write):
    _statements: ClassVar[dict[str, Statement]] = {}

    SET_USAGE = (
        "UPDATE sessions SET attributes = jsonb_set("
        "COALESCE(attributes, '{}'), '{usage}', :usage) WHERE id = :session_id"
    )

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
                    "insert" if deferred.inserted else "update",
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
            lock_id=int4(organization_id),
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
            and not self._begun
            and self._deferred is None
            and session.id in self._assumed
        ):
            # A checkpoint of one message goes optimistic: it assumes the session row
            # as its head, and an updated message at the revision before its own.
            written = self.written[session.id] = session.copy()
            self._deferred = Optimistic(
                self._assumed[session.id],
                written,
                now,
                message,
                list(events),
                started,
                finished,
                inserted=kind == "insert",
            )
            # The session's next unit assumes the row as this one will leave it, and
            # goes in a later batch: it is written if this one was (a unit that assumed
            # the row as it is now would find it changed by this one).
            assert self._heads is not None
            self._heads.put(written)
            self.pending.add(session.id)
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
        values = session_values(session, now, started=started, finished=finished)
        values["event_ids"] = [e.id for e in events]
        values["event_sequences"] = [e.sequence for e in events]
        values["event_types"] = [e.type for e in events]
        values["event_turn_ids"] = [e.turn_id for e in events]
        values["event_bodies"] = [e.body for e in events]
        if message is not None:
            values.update(message_values(message))
        rows = await self._fetch(PG_CHECKPOINT[kind], **values)
        if message is not None and rows[0][0] != 1:
            raise not_written(message, kind == "insert")

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
            f"SELECT pg_notify({pg_literal(channel)}, {pg_literal(payload)})"
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
