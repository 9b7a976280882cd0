"""Every NOTIFY on the PostgreSQL bus's channel, heard by a connection of the test's
own (it takes no part in the bus: the processes do not count it as a listener)."""

import contextlib
from collections.abc import AsyncIterator

import asyncpg
from sqlalchemy.engine import make_url


@contextlib.asynccontextmanager
async def notifications(database_url: str) -> AsyncIterator[list[str]]:
    """Every NOTIFY on the PostgreSQL bus's channel while the block runs."""
    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    heard: list[str] = []
    conn = await asyncpg.connect(dsn)
    await conn.add_listener("evermirror", lambda *args: heard.append(args[-1]))
    try:
        yield heard
    finally:
        await conn.close()
