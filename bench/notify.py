"""The `notify` row (PostgreSQL): what NOTIFY in a write transaction costs its writers.

A transaction that issued NOTIFY takes a database-wide lock at commit and holds it
until its commit is done, so notifying commits wait for one another. Every checkpoint
of the service commits with a NOTIFY (the wake-up of the session's streams on every
process). Here raw asyncpg writers in the checkpoint's shape (a counter row updated, a
~500-byte row inserted) run with a NOTIFY in each transaction, beside the same writers
sending the same statement without it, at 8, 32 and 64 concurrent writers; one
connection listens, as the service's processes do. The ratio is the share of
throughput the NOTIFY leaves.

Where `nats-server` is installed, the same writers also run with the wake-up published
to a NATS server of the bench's own once the transaction has committed (as the NATS bus
does), heard by one subscriber: committed transactions per second against the writers
that NOTIFY, the bus's own measure of what leaving NOTIFY gives back (goal ≥ 1.5 at 64
writers).
"""

from bench.bus import start_nats
from bench.rows import Database, Line, baseline_writes, median, ratio, side_by_side

WRITERS = (8, 32, 64)
SMOKE_WRITERS = (4,)


async def row_notify(db: Database) -> list[Line]:
    lines: list[Line] = []
    details: dict[str, object] = {}
    nats = await start_nats(db)
    for writers in SMOKE_WRITERS if db.profile.smoke else WRITERS:
        targets = {
            "notify": lambda n=writers: baseline_writes(db, n, notify=True),
            "control": lambda n=writers: baseline_writes(db, n, notify=False),
        }
        if nats is not None:
            targets["nats"] = lambda n=writers, url=nats.url: baseline_writes(
                db, n, notify=False, nats_url=url
            )
        results = await side_by_side(targets, db.profile.runs)
        details[str(writers)] = results
        with_notify = median([r["tx_per_s"] for r in results["notify"]])
        without = median([r["tx_per_s"] for r in results["control"]])
        lines.append(
            Line(
                "notify",
                f"{writers} writers: tx/s with NOTIFY vs without",
                with_notify,
                without,
                ratio(with_notify, without),
                unit="/s",
            )
        )
        if "nats" in results:
            over_nats = median([r["tx_per_s"] for r in results["nats"]])
            share = ratio(over_nats, with_notify)
            at_64 = writers == max(WRITERS)
            lines.append(
                Line(
                    "notify",
                    f"{writers} writers: tx/s, wake-up over NATS vs NOTIFY",
                    over_nats,
                    with_notify,
                    share,
                    "≥ 1.5" if at_64 else "—",
                    (share is not None and share >= 1.5) if at_64 else None,
                    "/s",
                )
            )
    db.details["notify"] = details
    return lines
