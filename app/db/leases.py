"""Runner leases: at most one runner per session across all processes. On a shared
database (PostgreSQL) a lease is a session advisory lock held on a dedicated connection
and renewed on the session row; on SQLite, one process, it is an entry in a set."""

import asyncio
import contextlib
import enum
import logging
import time
import uuid

import asyncpg
from sqlalchemy.engine import make_url

from app.backend import Backend
from app.db.engine import PG_UNAVAILABLE
from app.db.types import utcnow

log = logging.getLogger("app.runner.leases")

# Failures of the lease connection or the server rather than of a statement. Among
# them asyncpg's InternalClientError: a connection the server terminated while idle
# ("cannot switch to state ...") raises it on its next statement, before asyncpg has
# seen the socket close.
LEASE_CONNECTION_ERRORS = (*PG_UNAVAILABLE, asyncio.TimeoutError)


def lease_key(session_id: uuid.UUID) -> int:
    """A signed 64-bit advisory-lock key derived from the session id."""
    value = session_id.int & ((1 << 64) - 1)
    return value - (1 << 64) if value >= (1 << 63) else value


class Regain(enum.Enum):
    """What `Leases.regain` found."""

    HELD = "held"  # the lease is this process's again, and nobody ran the turn since
    TAKEN = "taken"  # another runner claimed the session since: this one must stop
    BUSY = "busy"  # the lock is still held (or the database unreachable): try again


class Leases:
    """Which sessions this process runs. SQLite deployments are one process, so a local
    set is the whole truth and a lease is never lost."""

    def __init__(self) -> None:
        self.held: set[uuid.UUID] = set()
        # When this process's view of the leases last started afresh (monotonic): the
        # sweeper judges other runners by their renewals only once it has watched them
        # for a whole grace period.
        self.connected_at = time.monotonic()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self.held.clear()

    def holds(self, session_id: uuid.UUID) -> bool:
        return session_id in self.held

    async def settled(self, seconds: float) -> bool:
        """Whether this process's lease connection has been up for `seconds`: only then
        can it judge other runners by their renewals (after a database restart they
        all went unrenewed while it was down)."""
        return time.monotonic() - self.connected_at >= seconds

    async def try_acquire(self, session_id: uuid.UUID) -> bool:
        if session_id in self.held:
            return False
        self.held.add(session_id)
        return True

    async def regain(self, session_id: uuid.UUID, epoch: int | None) -> Regain:
        """Take back a lease lost with its connection, only if no other runner claimed
        the session since this one's claim `epoch` (None: it has claimed nothing yet)."""
        return Regain.HELD if session_id in self.held else Regain.TAKEN

    async def release(self, session_id: uuid.UUID) -> None:
        self.held.discard(session_id)


class PgLeases(Leases):
    """PostgreSQL session-level advisory locks, all held on one connection per process:
    if the process dies, PostgreSQL drops the connection and every lease it held.

    The connection is watched: its loss is noticed the moment asyncpg sees it close, and
    a keeper renews `sessions.runner_renewed_at` of every held session each
    `renew_seconds` on it, which also finds a connection that died silently (a renewal
    that does not answer in time drops the connection). Losing the connection loses
    every lease at once: `held` empties, and the runner stops publishing and writing
    until it has regained each lease (`regain`) or learned that another runner took
    the session over."""

    def __init__(self, url: str, *, renew_seconds: float) -> None:
        super().__init__()
        self._dsn = (
            make_url(url)
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )
        self.renew_seconds = renew_seconds
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._keeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._keeper = asyncio.create_task(self._keep(), name="runner-lease-keeper")

    async def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        if self._conn is not None and not self._conn.is_closed():
            with contextlib.suppress(*LEASE_CONNECTION_ERRORS):
                await self._conn.close(timeout=2)
        self.held.clear()

    def _lost(self, conn: asyncpg.Connection) -> None:
        """The lease connection closed: PostgreSQL has dropped every lock it held."""
        if conn is not self._conn:
            return
        self._conn = None
        if self.held:
            log.warning(
                "runner lease connection lost: %d leases to regain", len(self.held)
            )
        self.held.clear()

    def _drop(self) -> None:
        """Give up a connection that stopped answering (its locks may outlive it on the
        server until PostgreSQL notices; nobody can take them meanwhile)."""
        conn = self._conn
        if conn is not None:
            self._lost(conn)
            conn.terminate()

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            if self._conn is not None:
                self._lost(self._conn)
            conn = await asyncpg.connect(
                self._dsn,
                server_settings={"application_name": "evermirror-lease"},
                timeout=max(self.renew_seconds * 2, 2.0),
            )
            conn.add_termination_listener(self._lost)
            self._conn = conn
            self.connected_at = time.monotonic()
        return self._conn

    async def _keep(self) -> None:
        """Renew the held sessions that run a turn (and so check the connection) every
        renew_seconds. Sessions whose row a checkpoint holds are skipped: that
        checkpoint renews them (it sets last_activity_at)."""
        while True:
            await asyncio.sleep(self.renew_seconds)
            try:
                async with self._lock:
                    conn = await self._connection()
                    await conn.execute(
                        "UPDATE sessions SET runner_renewed_at = $2 WHERE id IN ("
                        " SELECT id FROM sessions WHERE id = ANY($1::uuid[])"
                        " AND active_turn_id IS NOT NULL FOR UPDATE SKIP LOCKED)",
                        list(self.held),
                        utcnow(),
                        timeout=max(self.renew_seconds * 4, 2.0),
                    )
            except LEASE_CONNECTION_ERRORS as exc:
                if self._conn is not None or self.held:
                    log.warning("runner lease connection failed: %r", exc)
                self._drop()
            except asyncpg.PostgresError as exc:
                log.warning("renewing runner leases failed: %s", exc)

    async def settled(self, seconds: float) -> bool:
        async with self._lock:
            await self._connection()
        return await super().settled(seconds)

    async def try_acquire(self, session_id: uuid.UUID) -> bool:
        async with self._lock:
            if session_id in self.held:
                return False
            conn = await self._connection()
            if await conn.fetchval(
                "SELECT pg_try_advisory_lock($1)", lease_key(session_id)
            ):
                return self._hold(conn, session_id)
            return False

    async def regain(self, session_id: uuid.UUID, epoch: int | None) -> Regain:
        async with self._lock:
            if session_id in self.held:
                return Regain.HELD
            try:
                conn = await self._connection()
                locked = await conn.fetchval(
                    "SELECT pg_try_advisory_lock($1)", lease_key(session_id)
                )
                # Read under the lock, a takeover that has claimed the session is seen;
                # none can start while we hold it.
                current = await conn.fetchval(
                    "SELECT runner_epoch FROM sessions WHERE id = $1", session_id
                )
                taken = current is None or (epoch is not None and current != epoch)
                if locked and taken:
                    await conn.fetchval(
                        "SELECT pg_advisory_unlock($1)", lease_key(session_id)
                    )
            except LEASE_CONNECTION_ERRORS:
                return Regain.BUSY
            if taken:
                return Regain.TAKEN
            if not locked or not self._hold(conn, session_id):
                return Regain.BUSY
            log.info("regained the runner lease of session %s", session_id)
            return Regain.HELD

    def _hold(self, conn: asyncpg.Connection, session_id: uuid.UUID) -> bool:
        """Count a lock just taken on `conn` as held, unless `conn` closed meanwhile: its
        answer can reach us after asyncpg saw the connection close, and after `_lost`
        has run for it (its lock is gone; holding it now would publish unfenced)."""
        if conn.is_closed() or conn is not self._conn:
            return False
        self.held.add(session_id)
        return True

    async def release(self, session_id: uuid.UUID) -> None:
        async with self._lock:
            if session_id not in self.held:
                return
            self.held.discard(session_id)
            if self._conn is not None and not self._conn.is_closed():
                # A dead connection has already dropped every lock it held.
                with contextlib.suppress(
                    *LEASE_CONNECTION_ERRORS, asyncpg.PostgresError
                ):
                    await self._conn.fetchval(
                        "SELECT pg_advisory_unlock($1)", lease_key(session_id)
                    )


def create_leases(
    backend: Backend, database_url: str, *, renew_seconds: float
) -> Leases:
    """Session advisory locks on a dedicated connection when processes share the
    database; this process's own set otherwise."""
    if backend.shared:
        return PgLeases(database_url, renew_seconds=renew_seconds)
    return Leases()
