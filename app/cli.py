"""Command line: `serve`, `migrate`, `keys create|list|revoke`, `probe`, `tail`,
`openapi`."""

import argparse
import asyncio
import importlib.metadata
import ipaddress
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.catalog.registry import ConfigError, load_catalog
from app.settings import Settings, describe_error, get_settings
from app.telemetry import logs

log = logging.getLogger("app.cli")

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


def local_url(settings: Settings) -> str:
    """The URL of this machine's server on HOST and PORT (a wildcard address is
    reached on loopback)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(
        settings.host, settings.host
    )
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


async def _keys_state(settings: Settings, first_key: bool) -> bool:
    """Whether API keys exist; with `first_key`, create the first one if none does
    (announced in the log, the key with it: it is shown once)."""
    from app import auth
    from app.db.session import Database
    from app.ids import format_id
    from app.live.buses import create_bus

    database = Database.from_settings(settings)
    # A key created here ends open mode on running servers too (see `_keys`).
    database.hooks = create_bus(settings.backend, settings.direct_url)
    try:
        if first_key:
            async with database.write() as db:
                created = await auth.create_first_key(db)
            if created is not None:
                row, key = created
                log.warning(
                    "No API key existed, so the first one was created: %s for %s. "
                    "Every request needs a key from now on (Authorization: Bearer "
                    "<key>); this one is shown once, here: %s",
                    format_id("key", row.id),
                    format_id("org", row.organization_id),
                    key,
                )
                return True
        async with database.read() as db:
            return await auth.keys_exist(db)
    finally:
        await database.dispose()


def serve(args: argparse.Namespace) -> int:
    import uvicorn
    from sqlalchemy.exc import DBAPIError

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
    if args.workers > 1 and not settings.backend.shared:
        print(
            "--workers needs PostgreSQL: the embedded SQLite deployment is one process "
            "(one writer, an in-process bus). Run one process, or point DATABASE_URL "
            "at PostgreSQL.",
            file=sys.stderr,
        )
        return 2
    if (refusal := _bus_refusal(settings)) is not None:
        print(refusal, file=sys.stderr)
        return 2
    if settings.should_auto_migrate:
        upgrade(settings.direct_url)
        settings = settings.model_copy(update={"auto_migrate": False})
    try:
        keyed = asyncio.run(_keys_state(settings, args.first_key))
    except DBAPIError as exc:
        print(
            f"cannot read the API keys of {settings.database_url.split('@')[-1]}: "
            f"{type(exc.orig).__name__}: {exc.orig}. Is it migrated (`evermirror migrate`)?",
            file=sys.stderr,
        )
        return 2
    where = f"{settings.host}:{settings.port}"
    if keyed:
        log.info("serving on %s; API keys required", where)
    elif not is_loopback(settings.host) and not args.insecure:
        print(
            f"refusing to serve on {settings.host}: no API keys exist, so the service would be open to "
            "anyone. Create one with `evermirror keys create --org <org_id>`, pass --first-key "
            "to have one created and printed, or pass --insecure.",
            file=sys.stderr,
        )
        return 2
    else:
        log.warning(
            "serving on %s in OPEN MODE: no API key exists, so every request is served "
            "without one (as organization org_00000000000000000000000000000001)%s. "
            "`evermirror keys create --org <org_id>` ends open mode.",
            where,
            " to anyone who can reach it (--insecure)" if args.insecure else "",
        )
    _log_pooler(settings)
    _log_urls(settings)
    common: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        # The service's log format for uvicorn's lines too, in every worker.
        "log_config": logs.logging_config(settings.log_level, settings.log_format),
        # X-Forwarded-For / -Proto only from the configured proxies: otherwise any
        # client could pick the address it is rate limited by.
        "proxy_headers": bool(settings.trusted_proxies),
        "forwarded_allow_ips": settings.trusted_proxies or None,
        # After the drain (app/ops/drain.py, up to DRAIN_SECONDS, run by
        # server.DrainingServer before this wait begins): the connections still open
        # then have this long to finish. Streams and turns are gone by then, so it never
        # cuts the drain short; a stop takes at most DRAIN_SECONDS + this + the
        # lifespan's shutdown.
        "timeout_graceful_shutdown": server.GRACEFUL_SHUTDOWN_SECONDS,
        # Read deadlines and problem+json for what uvicorn answers itself.
        "http": server.protocol(settings),
        "timeout_keep_alive": settings.keep_alive_seconds,
        # No WebSocket routes: an upgrade request is an ordinary request.
        "ws": "none",
    }
    if args.workers == 1:
        server.run(uvicorn.Config(create_app(settings), **common))
        return 0
    # Each worker builds its app from the environment (its own pool, LISTEN connection
    # and runner); migrations already ran here, once.
    os.environ["AUTO_MIGRATE"] = "false"
    # The workers share the service's budgets (rate and stream limits).
    os.environ.setdefault("EXPECTED_INSTANCES", str(args.workers))
    server.run(
        uvicorn.Config(
            "app.main:create_app", factory=True, workers=args.workers, **common
        )
    )
    return 0


def migrate(args: argparse.Namespace) -> int:
    from app.db.migrate import upgrade

    settings = get_settings()
    upgrade(settings.direct_url)
    print(f"migrated {settings.direct_url.split('@')[-1]} to head")
    if args.first_key:
        asyncio.run(_keys_state(settings, first_key=True))
    return 0


def probe(args: argparse.Namespace) -> int:
    """Exit 0 if this machine's server answers `/ready` (or `/health`) with 200: the
    container's HEALTHCHECK, which has neither curl nor a fixed port."""
    import httpx

    path = f"/{args.probe}"
    url = (args.url or local_url(get_settings())).rstrip("/") + path
    try:
        response = httpx.get(url, timeout=args.timeout)
    except httpx.HTTPError as exc:
        print(f"{url}: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    if response.status_code == 200:
        return 0
    print(f"{url}: {response.status_code} {response.text[:500]}", file=sys.stderr)
    return 1


def tail(args: argparse.Namespace) -> int:
    from app import tail as tail_command

    url = args.url or os.environ.get("EVERMIRROR_URL") or local_url(get_settings())
    key = args.key or os.environ.get("EVERMIRROR_API_KEY")
    return tail_command.main(url, args.session_id, key, args.json)


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
    from app.live.buses import create_bus

    settings = get_settings()
    database = Database.from_settings(settings)
    # Key changes are announced like the service's own writes: a NOTIFY with the COMMIT
    # on PostgreSQL, heard by every server; SQLite servers poll the keys table.
    database.hooks = create_bus(settings.backend, settings.direct_url)
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
                    (0 if settings.backend.shared else settings.keys_poll_seconds)
                    + 0.25
                )
            print(f"revoked {count} key(s)")
            return 0 if count else 1
        return 0
    finally:
        await database.dispose()


def keys(args: argparse.Namespace) -> int:
    return asyncio.run(_keys(args))


async def _purge(args: argparse.Namespace) -> int:
    from app.db.session import Database
    from app.ids import format_id
    from app.live.buses import create_bus
    from app.sessions import retention

    settings = get_settings()
    database = Database.from_settings(settings)
    # Deletions are announced like the service's own: running servers end the deleted
    # sessions' streams (PostgreSQL; SQLite servers find them gone on their next read).
    database.hooks = create_bus(settings.backend, settings.direct_url)
    try:
        if args.dry_run:
            found = await retention.expired(database, settings)
        else:
            found = await retention.purge(database, settings)
        for item in found:
            print(
                f"{format_id('session', item.session_id)}\t"
                f"{format_id('org', item.organization_id)}\t{item.reason}"
            )
        verb = "would be purged" if args.dry_run else "purged"
        print(f"{len(found)} session(s) {verb}", file=sys.stderr)
        return 0
    finally:
        await database.dispose()


def purge(args: argparse.Namespace) -> int:
    return asyncio.run(_purge(args))


def openapi(args: argparse.Namespace) -> int:
    from app.main import create_app

    document = (
        json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"
    )
    if args.output == "-":
        sys.stdout.write(document)
    else:
        path = Path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(document)
    return 0


def _bus_refusal(settings: Settings) -> str | None:
    """Why the configured NATS bus cannot be used (one line), or None: checked before
    serving, so that a wrong BUS_URL is a refusal, not a worker's traceback."""
    if not settings.bus_url or not settings.backend.shared:
        return None
    from app.live.nats_bus import BusUnavailable, NatsBus

    async def probe() -> None:
        bus = NatsBus(settings.bus_url or "")
        try:
            await bus.start()
        finally:
            await bus.stop()

    try:
        asyncio.run(probe())
    except BusUnavailable as exc:
        return f"refusing to serve: {exc}"
    return None


def _log_pooler(settings: Settings) -> None:
    if settings.pooled:
        log.info(
            "statements go through the transaction pooler at %s (DATABASE_URL); the "
            "bus's LISTEN, runner leases and migrations connect to %s directly "
            "(DATABASE_DIRECT_URL)",
            settings.database_url.split("@")[-1],
            settings.direct_url.split("@")[-1],
        )


def _log_urls(settings: Settings) -> None:
    base = f"http://{_url_host(settings.host)}:{settings.port}"
    log.info(
        "the web view is at %s/sessions, the API reference at %s/docs, health at %s/health",
        base,
        base,
        base,
    )


def _url_host(host: str) -> str:
    """The host as a URL names it: an IPv6 address in brackets, and `localhost`
    for a wildcard (the address to open on this machine)."""
    if host in ("0.0.0.0", "::", ""):
        return "localhost"
    return f"[{host}]" if ":" in host else host


def _version() -> str:
    try:
        return importlib.metadata.version("evermirror")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evermirror", description="An Everruns-compatible session service"
    )
    parser.add_argument(
        "--version", action="version", version=f"evermirror {_version()}"
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
    p_serve.add_argument(
        "--first-key",
        action="store_true",
        help="if no API key exists, create one and print it in the log (the container's default)",
    )
    p_serve.set_defaults(func=serve)

    p_migrate = commands.add_parser("migrate", help="apply migrations to DATABASE_URL")
    p_migrate.add_argument(
        "--first-key",
        action="store_true",
        help="then, if no API key exists, create one and print it in the log",
    )
    p_migrate.set_defaults(func=migrate)

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

    p_probe = commands.add_parser(
        "probe", help="exit 0 if the local server is ready (the container healthcheck)"
    )
    p_probe.add_argument(
        "probe", nargs="?", choices=["ready", "health"], default="ready"
    )
    p_probe.add_argument("--url", help="default: HOST and PORT on this machine")
    p_probe.add_argument("--timeout", type=float, default=2.0)
    p_probe.set_defaults(func=probe)

    p_tail = commands.add_parser(
        "tail", help="follow a session's messages as they stream"
    )
    p_tail.add_argument("session_id", help="session_<32 hex>")
    p_tail.add_argument(
        "--url", help="the server (default: $EVERMIRROR_URL, else HOST and PORT here)"
    )
    p_tail.add_argument("--key", help="API key (default: $EVERMIRROR_API_KEY)")
    p_tail.add_argument(
        "--json", action="store_true", help="print one Mutation a line, as JSON"
    )
    p_tail.set_defaults(func=tail)

    p_purge = commands.add_parser(
        "purge",
        help="delete the sessions past their expires_at or SESSION_RETENTION_DAYS now;"
        " prints each (id, organization, reason)",
    )
    p_purge.add_argument(
        "--dry-run", action="store_true", help="list what would go; delete nothing"
    )
    p_purge.set_defaults(func=purge)
    p_openapi = commands.add_parser("openapi", help="write the OpenAPI document")
    p_openapi.add_argument(
        "--output", default="-", help="a file to write (default: standard output)"
    )
    p_openapi.set_defaults(func=openapi)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = get_settings()
        load_catalog(settings)
    except ValidationError as exc:
        print(f"invalid configuration: {describe_error(exc)}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
