"""Which bus a process uses: in memory for one process on SQLite, LISTEN/NOTIFY on a
shared PostgreSQL, NATS when `BUS_URL` names a server."""

from app.backend import Backend
from app.live.bus import Bus, MemoryBus
from app.live.pg_bus import PgBus


def create_bus(backend: Backend, database_url: str, bus_url: str | None = None) -> Bus:
    """Across processes on a shared database: over NATS when `bus_url` names a server,
    else LISTEN/NOTIFY; in memory for one process."""
    if backend.shared and bus_url:
        from app.live.nats_bus import NatsBus  # imported only where it is configured

        return NatsBus(bus_url)
    if backend.shared:
        return PgBus(database_url)
    return MemoryBus()
