"""Command line: `serve`, `migrate`, `keys create|list|revoke`, `openapi`."""

import argparse
import asyncio
import ipaddress
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from app.settings import Settings, get_settings

LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(
                ipaddress.ip_address(info[4][0]).is_loopback
                for info in socket.getaddrinfo(host, None)
            )
        except OSError:
            return False


async def _has_keys(settings: Settings) -> bool:
    from app.auth import keys_exist
    from app.db.session import Database

    database = Database.from_settings(settings)
    try:
        async with database.read() as db:
            return await keys_exist(db)
    finally:
        await database.dispose()


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app import server
    from app.db.migrate import upgrade
    from app.main import create_app

    overrides: dict[str, object] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port:
        overrides["port"] = args.port
    if args.no_migrate:
        overrides["auto_migrate"] = False
    settings = Settings(**overrides)  # type: ignore[arg-type]  # pydantic-settings accepts overrides
    if args.workers < 1:
        print("--workers must be at least 1", file=sys.stderr)
        return 2
    if args.workers > 1 and settings.is_sqlite:
        print(
            "--workers needs PostgreSQL: the embedded SQLite deployment is one process "
            "(one writer, an in-process bus). Run one process, or point DATABASE_URL "
            "at PostgreSQL.",
            file=sys.stderr,
        )
        return 2
    if settings.should_auto_migrate:
        upgrade(settings.database_url)
        settings = settings.model_copy(update={"auto_migrate": False})
    if (
        not is_loopback(settings.host)
        and not args.insecure
        and not asyncio.run(_has_keys(settings))
    ):
        print(
            f"refusing to serve on {settings.host}: no API keys exist, so the service would be open to "
            "anyone. Create one with `python -m app keys create --org <org_id>`, or pass --insecure.",
            file=sys.stderr,
        )
        return 2
    common: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        # X-Forwarded-For / -Proto only from the configured proxies: otherwise any
        # client could pick the address it is rate limited by.
        "proxy_headers": bool(settings.trusted_proxies),
        "forwarded_allow_ips": settings.trusted_proxies or None,
        "timeout_graceful_shutdown": 5,
        # Read deadlines and problem+json for what uvicorn answers itself.
        "http": server.protocol(settings),
        # No WebSocket routes: an upgrade request is an ordinary request.
        "ws": "none",
    }
    if args.workers == 1:
        uvicorn.run(create_app(settings), **common)
        return 0
    # Each worker builds its app from the environment (its own pool, LISTEN connection
    # and runner); migrations already ran here, once.
    os.environ["AUTO_MIGRATE"] = "false"
    # The workers share the service's budgets (rate and stream limits).
    os.environ.setdefault("EXPECTED_INSTANCES", str(args.workers))
    uvicorn.run("app.main:create_app", factory=True, workers=args.workers, **common)
    return 0


def migrate(_args: argparse.Namespace) -> int:
    from app.db.migrate import upgrade

    settings = get_settings()
    upgrade(settings.database_url)
    print(f"migrated {settings.database_url.split('@')[-1]} to head")
    return 0


def _revocation_target(text: str) -> dict[str, Any] | str:
    """What `keys revoke` was given: a key id or a whole key (never a prefix, which
    may be shared by several keys); else the error to print (without echoing the input,
    which may be a mistyped secret)."""
    from app import auth
    from app.ids import IdParseError, parse_id

    if text.startswith("key_"):
        try:
            return {"key_id": parse_id("key", text)}
        except IdParseError as exc:
            return f"Invalid key ID: {exc}"
    if auth.KEY_PATTERN.fullmatch(text):
        return {"key_hash": auth.hash_key(text)}
    return (
        "keys revoke takes a key id (key_<32 hex>, as `keys list` shows it) or a whole "
        "key (evm_<64 hex>); a prefix is not enough"
    )


async def _keys(args: argparse.Namespace) -> int:
    from app import auth
    from app.db.session import Database
    from app.ids import IdParseError, format_id, parse_id
    from app.live.bus import create_bus

    settings = get_settings()
    database = Database.from_settings(settings)
    # Key changes are announced like the service's own writes: a NOTIFY with the COMMIT
    # on PostgreSQL, heard by every server; SQLite servers poll the keys table.
    database.hooks = create_bus(settings.database_url)
    try:
        if args.keys_command == "create":
            try:
                org = parse_id("org", args.org)
            except IdParseError as exc:
                print(f"Invalid organization ID: {exc}", file=sys.stderr)
                return 2
            async with database.write() as db:
                row, key = await auth.create_key(
                    db, organization_id=org, name=args.name
                )
            print(key)
            print(
                f"created {format_id('key', row.id)} for {args.org}; the key is shown once",
                file=sys.stderr,
            )
        elif args.keys_command == "list":
            async with database.read() as db:
                for row in await auth.list_keys(db):
                    state = "revoked" if row.revoked_at else "active"
                    print(
                        f"{format_id('key', row.id)}\t{format_id('org', row.organization_id)}\t{row.prefix}…\t{state}\t{row.name or ''}"
                    )
        elif args.keys_command == "revoke":
            target = _revocation_target(args.key)
            if isinstance(target, str):
                print(target, file=sys.stderr)
                return 2
            async with database.write() as db:
                count = await auth.revoke_key(db, **target)
            if count:
                # Return once running servers have applied it, so the key's next
                # request fails: they poll every keys_poll_seconds (SQLite), or hear
                # the NOTIFY within milliseconds (PostgreSQL).
                await asyncio.sleep(
                    (settings.keys_poll_seconds if settings.is_sqlite else 0) + 0.25
                )
            print(f"revoked {count} key(s)")
            return 0 if count else 1
        return 0
    finally:
        await database.dispose()


def keys(args: argparse.Namespace) -> int:
    return asyncio.run(_keys(args))


def openapi(args: argparse.Namespace) -> int:
    from app.main import create_app

    document = (
        json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"
    )
    if args.output == "-":
        sys.stdout.write(document)
    else:
        Path(args.output).write_text(document)
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    parser = argparse.ArgumentParser(
        prog="evermirror", description="An Everruns-compatible session service"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    p_serve = commands.add_parser("serve", help="run the HTTP server")
    p_serve.add_argument("--host")
    p_serve.add_argument("--port", type=int)
    p_serve.add_argument(
        "--no-migrate",
        action="store_true",
        help="do not apply pending migrations at start-up",
    )
    p_serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes (PostgreSQL only; each listens and runs turns)",
    )
    p_serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback address without API keys",
    )
    p_serve.set_defaults(func=serve)

    commands.add_parser(
        "migrate", help="apply migrations to DATABASE_URL"
    ).set_defaults(func=migrate)

    p_keys = commands.add_parser("keys", help="manage API keys")
    key_commands = p_keys.add_subparsers(dest="keys_command", required=True)
    p_create = key_commands.add_parser("create", help="create a key; prints it once")
    p_create.add_argument("--org", required=True, help="organization id, org_<32 hex>")
    p_create.add_argument("--name")
    key_commands.add_parser("list", help="list keys (never the keys themselves)")
    p_revoke = key_commands.add_parser(
        "revoke", help="revoke a key by its key_ id or the whole key (not a prefix)"
    )
    p_revoke.add_argument("key")
    p_keys.set_defaults(func=keys)

    p_openapi = commands.add_parser("openapi", help="write the OpenAPI document")
    p_openapi.add_argument("--output", default="openapi/openapi.json")
    p_openapi.set_defaults(func=openapi)

    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
