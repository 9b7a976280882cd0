"""Raw write transactions, the ceiling for durable checkpoints: each loop is
`BEGIN; UPDATE a counter row SET n = n + 1 ... RETURNING; INSERT a ~500-byte row;
COMMIT`, the shape of a checkpoint (sequence allocated under a row lock, one row
written) without anything else. Each connection has its own counter row, as each
session has its own row lock.

    python -m bench.baselines.writes --dsn postgresql://... --connections 8 --duration 10
    python -m bench.baselines.writes --sqlite PATH --duration 10   (one writer: SQLite's)

With `--notify yes`, each PostgreSQL transaction also sends a NOTIFY (a ~100-byte payload,
as a checkpoint's wake-up), heard by one listening connection: NOTIFY takes a lock
held from commit to commit across the whole database, so this measures what that lock
costs writers; `--notify no` is its control, the same statement without the NOTIFY.

With `--nats URL` instead, each transaction sends the control statement and, once it has
committed, its wake-up is published to that NATS server (as the service's NATS bus does),
heard by one subscribing connection: the same writers with the wake-up outside the
database.

Prints one JSON object: transactions, seconds, tx_per_s (and notifications_heard).
"""

import argparse
import asyncio
import sqlite3
import sys
import time
from pathlib import Path

import asyncpg
import orjson

BODY = "x" * 500
SETUP = (
    "DROP TABLE IF EXISTS bench_rows",
    "DROP TABLE IF EXISTS bench_counter",
    "CREATE TABLE bench_counter (id integer PRIMARY KEY, n bigint NOT NULL)",
    "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, counter_id integer NOT NULL,"
    " n bigint NOT NULL, body text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
)


async def create_tables(conn: asyncpg.Connection, counters: int) -> None:
    """The scratch tables, new, with counter rows 0 to `counters` - 1 at 0."""
    for statement in SETUP:
        await conn.execute(statement)
    await conn.executemany(
        "INSERT INTO bench_counter (id, n) VALUES ($1, 0)",
        [(i,) for i in range(counters)],
    )


CHANNEL = "bench_notify"
PAYLOAD = '{"s":"' + "0" * 32 + '","q":%d,"kind":"wakeup","origin":"bench"}'


NOTIFY = "SELECT pg_notify($1, $2)"
NO_NOTIFY = "SELECT $1::text, $2::text"


async def postgres(
    dsn: str,
    connections: int,
    duration: float,
    warmup: float,
    notify: bool | None = None,
    nats_url: str | None = None,
) -> dict[str, float]:
    """`notify`: None, the checkpoint's shape alone; True, a NOTIFY in each
    transaction; False, the same statement without it (the control), and with
    `nats_url` the wake-up published to NATS after the commit."""
    admin = await asyncio.wait_for(asyncpg.connect(dsn), 15)
    try:
        await create_tables(admin, connections)
    finally:
        await admin.close()
    conns = [
        await asyncio.wait_for(asyncpg.connect(dsn), 15) for _ in range(connections)
    ]
    counts = [0] * connections
    heard = [0]
    listener = await asyncio.wait_for(asyncpg.connect(dsn), 15)
    await listener.add_listener(CHANNEL, lambda *_: heard.__setitem__(0, heard[0] + 1))
    publisher = subscriber = None
    if nats_url is not None:
        import nats  # only where it is asked for

        publisher = await nats.connect(nats_url)
        subscriber = await nats.connect(nats_url)

        async def on_wakeup(_msg: object) -> None:
            heard[0] += 1

        await subscriber.subscribe(f"{CHANNEL}.>", cb=on_wakeup)
        await subscriber.flush()
    start = time.monotonic() + warmup
    stop = start + duration

    async def loop(index: int, conn: asyncpg.Connection) -> None:
        while True:
            now = time.monotonic()
            if now >= stop:
                return
            async with conn.transaction():
                n = await conn.fetchval(
                    "UPDATE bench_counter SET n = n + 1 WHERE id = $1 RETURNING n",
                    index,
                )
                await conn.execute(
                    "INSERT INTO bench_rows (counter_id, n, body) VALUES ($1, $2, $3)",
                    index,
                    n,
                    BODY,
                )
                if notify is not None:
                    # The same round trip either way: only the NOTIFY differs.
                    await conn.execute(
                        NOTIFY if notify else NO_NOTIFY, CHANNEL, PAYLOAD % n
                    )
            if publisher is not None:
                await publisher.publish(f"{CHANNEL}.{index}", (PAYLOAD % n).encode())
            if now >= start:
                counts[index] += 1

    try:
        await asyncio.wait_for(
            asyncio.gather(*(loop(i, c) for i, c in enumerate(conns))),
            warmup + duration + 30,
        )
    finally:
        for conn in conns:
            await conn.close()
        await listener.close()
        for client in (publisher, subscriber):
            if client is not None:
                await client.close()
    total = sum(counts)
    return {
        "transactions": total,
        "seconds": duration,
        "tx_per_s": total / duration,
        "notifications_heard": heard[0],
    }


def sqlite(path: Path, duration: float, warmup: float) -> dict[str, float]:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    # The service's pragmas (app/db/engine.py).
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    conn.execute("DROP TABLE IF EXISTS bench_rows")
    conn.execute("DROP TABLE IF EXISTS bench_counter")
    conn.execute(
        "CREATE TABLE bench_counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE bench_rows (id INTEGER PRIMARY KEY, counter_id INTEGER NOT NULL,"
        " n INTEGER NOT NULL, body TEXT NOT NULL, created_at TEXT NOT NULL)"
    )
    conn.execute("INSERT INTO bench_counter (id, n) VALUES (0, 0)")
    count = 0
    start = time.monotonic() + warmup
    stop = start + duration
    while True:
        now = time.monotonic()
        if now >= stop:
            break
        conn.execute("BEGIN IMMEDIATE")
        n = conn.execute(
            "UPDATE bench_counter SET n = n + 1 WHERE id = 0 RETURNING n"
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO bench_rows (counter_id, n, body, created_at)"
            " VALUES (0, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ','now'))",
            (n, BODY),
        )
        conn.execute("COMMIT")
        if now >= start:
            count += 1
    conn.close()
    return {"transactions": count, "seconds": duration, "tx_per_s": count / duration}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--dsn")
    target.add_argument("--sqlite", type=Path)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument(
        "--notify",
        choices=["yes", "no"],
        help="a NOTIFY in each transaction (yes), or the same round trip without (no)",
    )
    parser.add_argument(
        "--nats", help="with --notify no: each wake-up published to this NATS server"
    )
    args = parser.parse_args()
    if args.dsn:
        result = asyncio.run(
            postgres(
                args.dsn,
                args.connections,
                args.duration,
                args.warmup,
                None if args.notify is None else args.notify == "yes",
                args.nats,
            )
        )
    else:
        result = sqlite(args.sqlite, args.duration, args.warmup)
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
