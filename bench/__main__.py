"""`python -m bench`: the service against its baselines, side by side in one run, on
SQLite and PostgreSQL. See docs/performance.md.

    python -m bench [--database sqlite|postgresql|both] [--rows page,etag,...]
        [--runs 3] [--duration 10] [--app-root PATH] [--pg-url URL] [--json PATH]
    python -m bench --smoke        every row once, tiny sizes: proves each produces figures
"""

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy.engine import make_url

from bench.plan import run_rows
from bench.report import header, machine, table
from bench.rows import (
    ROWS,
    Database,
    Line,
    Profile,
    cleanup_dir,
    failed,
    sqlite_url,
)
from bench.servers import (
    BENCH_ROOT,
    BenchError,
    Pinning,
    ScratchPostgres,
    ServiceConfig,
    app_location,
    create_api_key,
    detect_pinning,
    ensure_wrk,
    kill_all,
    pin_self,
    raise_fd_limit,
)

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def out(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def parse_rows(values: list[str] | None) -> list[str]:
    if not values:
        return list(ROWS)
    names = [
        name.strip() for value in values for name in value.split(",") if name.strip()
    ]
    unknown = [name for name in names if name not in ROWS]
    if unknown:
        raise SystemExit(
            f"unknown rows {', '.join(unknown)}; rows are: {', '.join(ROWS)}"
        )
    return [name for name in ROWS if name in names]


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--database", choices=("sqlite", "postgresql", "both"), default="both"
    )
    parser.add_argument(
        "--pg-url",
        default=DEFAULT_PG_URL,
        help="admin connection used to create and drop the scratch database",
    )
    parser.add_argument(
        "--app-root",
        type=Path,
        default=BENCH_ROOT,
        help="the checkout whose `python -m app serve` is benchmarked (default: this one)",
    )
    parser.add_argument(
        "--rows", action="append", help=f"comma-separated subset of: {', '.join(ROWS)}"
    )
    parser.add_argument(
        "--runs", type=int, help="measurements per figure, median reported (3)"
    )
    parser.add_argument(
        "--duration", type=float, help="seconds per wrk measurement (10)"
    )
    parser.add_argument("--subscribers", type=int, help="fan-out subscribers (1000)")
    parser.add_argument("--deltas", type=int, help="deltas in the fan-out turn (500)")
    parser.add_argument(
        "--idle-streams", type=int, help="idle streams for idle-rss (1000)"
    )
    parser.add_argument(
        "--conversations",
        help="comma-separated N of concurrent conversations for turns (50,100,200)",
    )
    parser.add_argument(
        "--bus-url",
        help="PostgreSQL lane: the services carry their live traffic over this NATS"
        " server (BUS_URL) instead of LISTEN/NOTIFY",
    )
    parser.add_argument(
        "--pooler",
        metavar="HOST:PORT",
        help="PostgreSQL lane: the services' statements go through this transaction"
        " pooler (a PgBouncer whose [databases] has '*' at this PostgreSQL), the"
        " database itself being their DATABASE_DIRECT_URL",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one run: a few seconds per database",
    )
    parser.add_argument(
        "--json", type=Path, help="also write every figure to this file"
    )
    parser.add_argument(
        "--no-pin", action="store_true", help="do not pin processes to cores"
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the temp dir with server logs"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        help="give up after this many seconds (smoke 300, full 7200)",
    )
    return parser.parse_args(argv)


async def run_database(
    name: str,
    args: argparse.Namespace,
    profile: Profile,
    pinning: Pinning,
    rows: list[str],
) -> tuple[list[Line], dict[str, Any], list[str]]:
    tmp = Path(tempfile.mkdtemp(prefix=f"evm-bench-{name}-"))
    scratch: ScratchPostgres | None = None
    db: Database | None = None
    try:
        try:
            if name == "sqlite":
                sqlite_path: Path | None = tmp / "service.db"
                assert sqlite_path is not None
                url = sqlite_url(sqlite_path)
            else:
                sqlite_path = None
                scratch = ScratchPostgres(args.pg_url)
                url = await scratch.create()
            config = ServiceConfig(args.app_root, url, tmp / "logs")
            if args.bus_url and name != "sqlite":
                config.env["BUS_URL"] = args.bus_url
            if args.pooler and name != "sqlite":
                host, _, port = args.pooler.rpartition(":")
                config.database_url = (
                    make_url(url)
                    .set(host=host, port=int(port))
                    .render_as_string(hide_password=False)
                )
                config.env["DATABASE_DIRECT_URL"] = url
            key = await create_api_key(config)
        except Exception as exc:
            return [failed(row, BenchError(f"set-up: {exc}")) for row in rows], {}, []
        db = Database(
            name,
            profile,
            pinning,
            config,
            key,
            tmp,
            pg_dsn=None if scratch is None else url,
            sqlite_path=sqlite_path,
        )
        if "DATABASE_DIRECT_URL" in config.env:
            db.notes.append(
                f"every service of this lane: statements through the pooler at"
                f" {args.pooler}, LISTEN and leases direct"
            )
        if "BUS_URL" in config.env:
            db.notes.append(
                f"every service of this lane: BUS_URL={config.env['BUS_URL']}"
            )
        lines = await run_rows(db, rows)
        if args.keep_logs:
            db.notes.append(f"logs kept in {tmp / 'logs'}")
        db.details["row_seconds"] = db.timings
        return lines, db.details, db.notes
    finally:
        if db is not None:
            await db.stop_all()
        if scratch is not None:
            await scratch.drop()
        if not args.keep_logs:
            await cleanup_dir(tmp)


async def run(args: argparse.Namespace) -> int:
    rows = parse_rows(args.rows)
    profile = Profile.create(
        smoke=args.smoke,
        runs=args.runs,
        duration=args.duration,
        subscribers=args.subscribers,
        deltas=args.deltas,
        idle_streams=args.idle_streams,
        conversations=tuple(int(n) for n in args.conversations.split(","))
        if args.conversations
        else None,
    )
    pinning = detect_pinning(args.no_pin)
    pin_self(pinning)
    raise_fd_limit()
    ensure_wrk()
    args.app_root = args.app_root.resolve()
    app_file = await asyncio.to_thread(app_location, args.app_root)
    if not app_file.startswith(str(args.app_root)):
        out(f"`import app` under --app-root {args.app_root} resolves to {app_file!r}")
        return 2
    facts = await asyncio.to_thread(machine, pinning, args.app_root, app_file, profile)
    out(header(facts))
    databases = ["sqlite", "postgresql"] if args.database == "both" else [args.database]
    document: dict[str, Any] = {"machine": facts, "databases": {}}
    any_failed = False
    for name in databases:
        started = time.monotonic()
        lines, details, notes = await run_database(name, args, profile, pinning, rows)
        elapsed = time.monotonic() - started
        out()
        out(table(name, lines))
        out()
        for note in notes:
            out(f"- {note}")
        timings = ", ".join(
            f"{row} {t:.0f} s" for row, t in details.get("row_seconds", {}).items()
        )
        out(f"- {name} took {elapsed:.0f} s" + (f" ({timings})" if timings else ""))
        any_failed = any_failed or any(line.failed for line in lines)
        document["databases"][name] = {
            "seconds": round(elapsed, 1),
            "lines": [line.as_dict() for line in lines],
            "notes": notes,
            "details": details,
        }
    if args.json:
        args.json.write_bytes(
            orjson.dumps(
                document,
                option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS,
                default=str,
            )
        )
    if any_failed:
        out()
        out("some rows failed to produce a figure")
    return 1 if any_failed else 0


async def guarded_run(args: argparse.Namespace) -> int:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
    timeout = args.timeout or (300.0 if args.smoke else 7200.0)
    try:
        return await asyncio.wait_for(run(args), timeout)
    except TimeoutError:
        out(f"gave up after {timeout:.0f} s")
        return 1


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    try:
        return asyncio.run(guarded_run(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        out("interrupted")
        return 130
    finally:
        kill_all()


if __name__ == "__main__":
    sys.exit(main())
