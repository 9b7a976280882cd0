"""Alembic environment: async, one chain for SQLite and PostgreSQL, batch mode everywhere."""

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from app.db import models  # noqa: F401  (registers the tables on Base.metadata)
from app.db.base import Base
from app.db.engine import create_migration_engine
from app.db.search import is_index_object
from app.settings import get_settings

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    return str(url) if url else get_settings().database_url


def _include(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """The full-text index is each database's own (migration 0009): not in the
    models, so not compared with them."""
    return not (reflected and compare_to is None and is_index_object(name))


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        include_object=_include,
        # Batch mode rewrites tables on SQLite and emits plain ALTERs on PostgreSQL.
        render_as_batch=True,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _main() -> None:
    engine = create_migration_engine(_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_main())
