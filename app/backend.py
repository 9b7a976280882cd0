"""The deployment mode, decided once from the database URL: one process on an embedded
SQLite file, or any number of stateless processes sharing one PostgreSQL.

Everything that behaves differently between the two (the engines, the write unit of
work, the hot reads, the bus, the runner's leases and sweeper, the key resolver's
polling, `serve --workers`) is handed this value and branches on it; nothing else reads
the URL or the dialect to find out. (How a statement is spelled for each dialect is
app/db/dialect.py's.)"""

import enum


class Backend(enum.Enum):
    SQLITE = "sqlite"
    POSTGRESQL = "postgresql"

    @classmethod
    def of(cls, database_url: str) -> "Backend":
        """The backend of a normalized database URL (see `Settings.database_url`)."""
        for backend in cls:
            if database_url.startswith(backend.value):
                return backend
        raise ValueError(f"unsupported database URL {database_url!r}")

    @property
    def shared(self) -> bool:
        """Whether several processes share the database: runner leases, the bus and
        the key resolver then work across processes (PostgreSQL). With SQLite the
        one process owns everything, and a free lease is a lost runner."""
        return self is Backend.POSTGRESQL
