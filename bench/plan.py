"""Which rows run in which phase: the fast rows on one service, the stream rows beside
their baselines, then the rows that start processes of their own."""

import asyncio
from collections.abc import Awaitable, Callable

from bench.balanced import row_balanced
from bench.bus import row_bus
from bench.notify import row_notify
from bench.rows import (
    DELTA_INTERVAL_MS,
    POSTGRES_ONLY,
    ROWS,
    Database,
    Line,
    failed,
    guarded,
    row_etag,
    row_fanout,
    row_idle_rss,
    row_older,
    row_page,
    row_workers,
    row_writes,
    seed,
)
from bench.search import row_search
from bench.turns import row_turns


async def run_rows(db: Database, selected: list[str]) -> list[Line]:
    lines: list[Line] = []
    for row in selected:
        if row in POSTGRES_ONLY and not db.is_postgres:
            lines.append(Line(row, "", note="n/a (PostgreSQL row)"))
    fast_rows: list[str] = [
        r for r in ("page", "etag", "older", "writes", "search") if r in selected
    ]
    stream_rows = [r for r in ("fanout-mutation", "fanout-sse") if r in selected]
    if not db.is_postgres:
        fast_rows = [r for r in fast_rows if r not in POSTGRES_ONLY]
    workers = "workers" in selected and db.is_postgres
    # The workers row pages the same seeded session: seed it here, where the model
    # streams without pauses.
    seeding = workers and not fast_rows

    if fast_rows or seeding:
        try:
            server = await db.service(
                "service", db.pinning.server, SCRIPTED_DELAY_MS="0"
            )
            if seeding:
                await seed(db, server)
        except Exception as exc:
            lines.extend(failed(row, exc) for row in fast_rows or ["workers"])
            workers = False
        else:
            handlers: dict[str, Callable[[], Awaitable[list[Line]]]] = {
                "page": lambda: row_page(db, server),
                "etag": lambda: row_etag(db, server),
                "older": lambda: row_older(db, server),
                "writes": lambda: row_writes(db, server),
                # Last of them: it adds a corpus the rows above would count.
                "search": lambda: row_search(db, server),
            }
            for row in fast_rows:
                await guarded(db, row, lines, handlers[row])
        await db.stop_all()

    if stream_rows:
        try:
            server, raw, lib = await asyncio.gather(
                db.service(
                    "service-stream",
                    db.pinning.server,
                    SCRIPTED_DELAY_MS=str(DELTA_INTERVAL_MS),
                ),
                db.baseline("fanout-raw", "fanout_raw"),
                db.baseline("fanout-sse-starlette", "fanout_sse_starlette"),
            )
            baselines = {"raw": raw, "sse-starlette": lib}
        except Exception as exc:
            lines.extend(failed(row, exc) for row in stream_rows)
        else:
            stream_handlers: dict[str, Callable[[], Awaitable[list[Line]]]] = {
                "fanout-mutation": lambda: row_fanout(
                    db, server, "mutation", baselines
                ),
                "fanout-sse": lambda: row_fanout(db, server, "sse", baselines),
            }
            for row in stream_rows:
                await guarded(db, row, lines, stream_handlers[row])
        await db.stop_all()

    if "idle-rss" in selected:
        await guarded(db, "idle-rss", lines, lambda: row_idle_rss(db))

    if workers:
        await guarded(db, "workers", lines, lambda: row_workers(db))
        await db.stop_all()

    if "turns" in selected:
        await guarded(db, "turns", lines, lambda: row_turns(db))
        await db.stop_all()

    if "notify" in selected and db.is_postgres:
        await guarded(db, "notify", lines, lambda: row_notify(db))

    if "bus" in selected and db.is_postgres:
        await guarded(db, "bus", lines, lambda: row_bus(db))
        await db.stop_all()

    if "balanced" in selected and db.is_postgres:
        await guarded(db, "balanced", lines, lambda: row_balanced(db))
        await db.stop_all()
    for line in lines:
        line.check()
    order = {name: index for index, name in enumerate(ROWS)}
    lines.sort(key=lambda line: order.get(line.row, len(order)))
    return lines
