"""Dialect-specific helpers: a JSON text lookup in SQL, a lock serializing one
check-then-write among processes, and runner leases (one runner per session across
processes)."""

import hashlib
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import Text


class json_text(FunctionElement[str]):
    """The text at `path` inside a JSON document stored as text (NULL if absent):
    `json_text(models.Event.body, "data", "tool_name")`."""

    type = Text()
    inherit_cache = True

    def __init__(self, document: Any, *path: str) -> None:
        self.path = path
        super().__init__(document)


@compiles(json_text, "postgresql")
def _json_text_pg(element: json_text, compiler: SQLCompiler, **kw: Any) -> str:
    document = compiler.process(element.clauses, **kw)
    keys = ", ".join(compiler.render_literal_value(k, Text()) for k in element.path)
    return f"jsonb_extract_path_text(CAST({document} AS jsonb), {keys})"


@compiles(json_text, "sqlite")
def _json_text_sqlite(element: json_text, compiler: SQLCompiler, **kw: Any) -> str:
    document = compiler.process(element.clauses, **kw)
    path = compiler.render_literal_value("$." + ".".join(element.path), Text())
    return f"json_extract({document}, {path})"


async def lock_for_transaction(conn: AsyncConnection, name: str) -> None:
    """Hold the lock `name` until the transaction ends, so that processes doing the
    same check-then-write (is there a key yet? create one) take turns. PostgreSQL: a
    transaction-level advisory lock. SQLite: nothing to do, a write transaction begins
    with `BEGIN IMMEDIATE`, which holds the database's only write lock."""
    if conn.dialect.name != "postgresql":
        return
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
