"""Dialect-specific helpers. Runner leases: one runner per session across processes."""

import asyncio
import contextlib
import uuid

import asyncpg
from sqlalchemy.engine import make_url


def lease_key(session_id: uuid.UUID) -> int:
    """A signed 64-bit advisory-lock key derived from the session id."""
    value = session_id.int & ((1 << 64) - 1)
    return value - (1 << 64) if value >= (1 << 63) else value


class Leases:
    """Which sessions this process runs. SQLite deployments are one process, so a local
    set is the whole truth."""

    def __init__(self) -> None:
        self.held: set[uuid.UUID] = set()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self.held.clear()

    async def try_acquire(self, session_id: uuid.UUID) -> bool:
        if session_id in self.held:
            return False
        self.held.add(session_id)
        return True

    async def release(self, session_id: uuid.UUID) -> None:
        self.held.discard(session_id)


class PgLeases(Leases):
    """PostgreSQL session-level advisory locks, all held on one connection per process:
    if the process dies, PostgreSQL drops the connection and every lease it held."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self._dsn = (
            make_url(url)
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            # A new connection holds none of the old one's locks.
            self.held.clear()
            self._conn = await asyncpg.connect(
                self._dsn, server_settings={"application_name": "evermirror-lease"}
            )
        return self._conn

    async def stop(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()
        self.held.clear()

    async def try_acquire(self, session_id: uuid.UUID) -> bool:
        async with self._lock:
            if session_id in self.held:
                return False
            conn = await self._connection()
            if await conn.fetchval(
                "SELECT pg_try_advisory_lock($1)", lease_key(session_id)
            ):
                self.held.add(session_id)
                return True
            return False

    async def release(self, session_id: uuid.UUID) -> None:
        async with self._lock:
            if session_id not in self.held:
                return
            self.held.discard(session_id)
            if self._conn is not None and not self._conn.is_closed():
                # A dead connection has already dropped every lock it held.
                with contextlib.suppress(
                    OSError, asyncpg.PostgresError, asyncpg.InterfaceError
                ):
                    await self._conn.fetchval(
                        "SELECT pg_advisory_unlock($1)", lease_key(session_id)
                    )


def create_leases(database_url: str) -> Leases:
    if database_url.startswith("postgresql"):
        return PgLeases(database_url)
    return Leases()
