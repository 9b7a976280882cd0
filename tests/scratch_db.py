"""Scratch databases for test suites that are not pytest (the JavaScript client's
`node --test` files), made the way tests/conftest.py makes its own: a migrated SQLite
file, or a PostgreSQL database of its own beside TEST_DATABASE_URL's, optionally with
an API key. One process does it all, so a test file pays one interpreter start.

    python -m tests.scratch_db create --sqlite /tmp/x/db.sqlite [--key-org org_<32 hex>]
    python -m tests.scratch_db create --postgresql [--key-org ...]   # beside TEST_DATABASE_URL
    python -m tests.scratch_db drop <database url>

`create` prints one JSON line: {"database_url": ..., "api_key": ... or null}.
"""

import argparse
import asyncio
import json
import os
import sys
import uuid

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from app import auth
from app.db.migrate import upgrade
from app.db.session import Database
from app.ids import parse_id
from app.settings import Settings, normalize_database_url


async def _admin(base_url: str, sql: str) -> None:
    engine = create_async_engine(base_url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(sql))
    finally:
        await engine.dispose()


def _postgresql_database() -> str:
    base = os.environ.get("TEST_DATABASE_URL")
    if not base:
        raise SystemExit("--postgresql needs TEST_DATABASE_URL")
    url = make_url(normalize_database_url(base))
    name = f"evermirror_scratch_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    asyncio.run(
        _admin(url.render_as_string(hide_password=False), f'CREATE DATABASE "{name}"')
    )
    return url.set(database=name).render_as_string(hide_password=False)


async def create_key(database_url: str, org: str) -> str:
    database = Database.from_settings(Settings(database_url=database_url))
    try:
        async with database.write() as db:
            _, key = await auth.create_key(db, organization_id=parse_id("org", org))
    finally:
        await database.dispose()
    return key


def new_postgresql_database() -> str:
    """A migrated PostgreSQL database of its own beside TEST_DATABASE_URL: its URL
    (`drop_database` drops it)."""
    database_url = _postgresql_database()
    upgrade(database_url)
    return database_url


def drop_database(database_url: str) -> None:
    """Drop a scratch PostgreSQL database (nothing for a SQLite file, which goes with
    its temporary directory)."""
    url = make_url(normalize_database_url(database_url))
    if url.get_backend_name() != "postgresql":
        return
    name = url.database
    if not (name and name.startswith("evermirror_scratch_")):
        raise SystemExit(f"refusing to drop {name!r}: not a scratch database")
    admin = url.set(database="postgres").render_as_string(hide_password=False)
    asyncio.run(_admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def create(args: argparse.Namespace) -> int:
    if args.postgresql:
        database_url = new_postgresql_database()
    else:
        database_url = f"sqlite+aiosqlite:///{args.sqlite}"
        upgrade(database_url)
    key = asyncio.run(create_key(database_url, args.key_org)) if args.key_org else None
    print(json.dumps({"database_url": database_url, "api_key": key}))
    return 0


def drop(args: argparse.Namespace) -> int:
    drop_database(args.url)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.scratch_db")
    commands = parser.add_subparsers(dest="command", required=True)
    create_parser = commands.add_parser("create")
    where = create_parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--sqlite", metavar="PATH")
    where.add_argument("--postgresql", action="store_true")
    create_parser.add_argument("--key-org", metavar="ORG")
    drop_parser = commands.add_parser("drop")
    drop_parser.add_argument("url")
    args = parser.parse_args(argv)
    return create(args) if args.command == "create" else drop(args)


if __name__ == "__main__":
    sys.exit(main())
