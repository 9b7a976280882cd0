"""Engines for both dialects. SQLite gets its pragmas and explicit BEGIN handling here;
PostgreSQL gets its pool. Nothing outside app/db/ branches on the dialect.

Writer engines hand out connections in AUTOCOMMIT mode: the write unit of work
(`app.db.writes.Write`) begins and commits its transaction on the driver connection."""

import json
from pathlib import Path
from typing import Any

import asyncpg
import orjson
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.backend import Backend
from app.settings import Settings

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


def _sqlite_file(url: str) -> Path | None:
    database = make_url(url).database
    if not database or database == ":memory:":
        return None
    return Path(database)


def _install_sqlite_hooks(
    engine: AsyncEngine,
    *,
    begin: str | None,
    busy_timeout_ms: int,
    foreign_keys: bool = True,
) -> None:
    """Pragmas on every connection; with `begin`, the statement SQLAlchemy's transactions
    start with (None: the caller begins its transactions itself)."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's implicit BEGIN starts transactions lazily at the first write, which
        # lets two writers both read and then deadlock on the upgrade; we emit our own.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # WAL: readers never block the writer and the writer never blocks readers.
        cursor.execute("PRAGMA journal_mode=WAL")
        # Enforce ON DELETE CASCADE from sessions to events and messages. Migrations turn
        # it off: a batch table rebuild would otherwise cascade-delete every child row.
        cursor.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
        # Wait for another process's write lock instead of failing with "database is locked".
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        # With WAL, NORMAL is durable across application crashes (only an OS crash can
        # lose the last transactions) and avoids an fsync per commit.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    if begin is None:
        return

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writers take the write lock up front (BEGIN IMMEDIATE): a deferred transaction
        # that reads and then writes can fail with SQLITE_BUSY without waiting.
        conn.exec_driver_sql(begin)


def _discard_closed_connections(engine: AsyncEngine) -> None:
    """Instead of pool_pre_ping, which with asyncpg costs three round trips per checkout
    (BEGIN, a ping, ROLLBACK): a server that restarted or dropped a connection has
    closed its end, which asyncpg has already noticed, so a closed connection is
    replaced at checkout without asking the server. A connection that dies silently
    fails its first statement: that request is answered 503 and the pool drops it."""

    @event.listens_for(engine.sync_engine, "checkout")
    def _on_checkout(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if record.driver_connection.is_closed():
            # The pool discards the connection and checks out another.
            raise DisconnectionError("connection closed by the server")


def read_json(value: str | bytes) -> Any:
    """Stored JSON columns as the rest of the service can write them again: orjson
    reads an integer past 64 bits as a float (as the model driver does), where the
    standard library would hand back an int that no orjson encoder accepts (PostgreSQL
    keeps `1.2e29` in jsonb as `120000000000000000000000000000`). The standard library
    still reads what orjson refuses (NaN, a lone surrogate in older rows)."""
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return json.loads(value)


def pg_connect_arguments(settings: Settings, application_name: str) -> dict[str, Any]:
    """asyncpg's connection arguments for DATABASE_URL. Behind a transaction pooler
    (`settings.pooled`) consecutive transactions of one connection run on different
    server connections: a prepared statement kept for later would be missing there (or
    would collide with another client's of the same name), so none is kept, and the
    statement timeout, a start-up parameter the pooler refuses, is left to the
    database role (`ALTER ROLE ... SET statement_timeout`)."""
    server_settings = {"application_name": application_name}
    if not settings.pooled:
        server_settings["statement_timeout"] = str(settings.db_statement_timeout_ms)
        return {"server_settings": server_settings}
    return {"server_settings": server_settings, "statement_cache_size": 0}


def _sqlalchemy_pooled_arguments() -> dict[str, Any]:
    """SQLAlchemy's asyncpg adapter prepares every statement it runs (to learn its
    columns), then runs it in the same transaction. Behind a transaction pooler it
    prepares the unnamed statement, which the next statement replaces: a named one
    would collide with another client's of the same name on a shared server connection,
    or, closed later from another server connection, stay prepared on its own."""
    return {
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": lambda: "",
    }


def create_engines(settings: Settings) -> tuple[AsyncEngine, AsyncEngine]:
    """Return (read engine, write engine). On PostgreSQL they are the same engine."""
    url = settings.database_url
    if settings.backend is Backend.SQLITE:
        path = _sqlite_file(url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        busy_s = settings.sqlite_busy_timeout_ms / 1000
        reader = create_async_engine(
            url,
            pool_size=8,
            max_overflow=8,
            connect_args={"timeout": busy_s},
            json_deserializer=read_json,
        )
        # One writer connection per process: in-process writers queue on the pool (no lock
        # spinning), and the busy timeout covers writers in other processes (the CLI).
        # Every write unit of work ends its own transaction, so there is nothing for the
        # pool to reset on return (a thread hop per checkin otherwise).
        writer = create_async_engine(
            url,
            pool_size=1,
            max_overflow=0,
            pool_timeout=120,
            pool_reset_on_return=None,
            isolation_level="AUTOCOMMIT",
            connect_args={"timeout": busy_s},
            json_deserializer=read_json,
        )
        _install_sqlite_hooks(
            reader, begin="BEGIN", busy_timeout_ms=settings.sqlite_busy_timeout_ms
        )
        _install_sqlite_hooks(
            writer, begin=None, busy_timeout_ms=settings.sqlite_busy_timeout_ms
        )
        return reader, writer
    engine = create_async_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_pool_timeout_seconds,
        pool_recycle=1800,
        json_deserializer=read_json,
        connect_args=pg_connect_arguments(settings, "evermirror")
        | (_sqlalchemy_pooled_arguments() if settings.pooled else {}),
    )
    _discard_closed_connections(engine)
    # One pool: the writer is the same engine with connections in AUTOCOMMIT mode.
    return engine, engine.execution_options(isolation_level="AUTOCOMMIT")


def create_migration_engine(url: str) -> AsyncEngine:
    """A single-connection engine for Alembic: a writer with foreign keys off."""
    if Backend.of(url) is Backend.SQLITE:
        path = _sqlite_file(url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, pool_size=1, max_overflow=0)
        _install_sqlite_hooks(
            engine, begin="BEGIN IMMEDIATE", busy_timeout_ms=30_000, foreign_keys=False
        )
        return engine
    return create_async_engine(url, pool_size=1, max_overflow=0)
