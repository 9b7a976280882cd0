"""The `bus` row (PostgreSQL): live tokens between processes, through the bus.

Two service processes on one database, both reading a model provider
(`bench.baselines.provider`, as in the `turns` row). N sessions run their turns on
node A, and each is watched by a Mutation stream on node B, so every token reaches its
watcher through the PostgreSQL bus (NOTIFY, batched per session every few
milliseconds). The same conversations with the streams on node A itself are the
baseline, measured side by side: the difference is what crossing processes costs.

Per N (1, 16, 64 concurrently streaming sessions, each at 25 tokens/s): p50 and p99
token latency, tokens delivered per second, lost tokens, and the CPU both nodes spend
per token. Where `nats-server` is installed, two more nodes with `BUS_URL` at a NATS
server of the bench's own run the same conversations across processes over NATS
(`nats`), beside the PostgreSQL bus (`split`). On either bus a third node runs and
watches nothing: its CPU per token is what hearing other nodes' conversations costs a
node (on NATS it hears only their wake-ups; on PostgreSQL every NOTIFY).
"""

import math
import shutil

from bench.rows import Database, Line, median, ratio
from bench.servers import (
    BENCH_ROOT,
    Proc,
    free_port,
    listening,
    python_env,
    spawn,
)
from bench.turns import TurnsResult, compare, service_target, start_provider

SESSIONS = (1, 16, 64)
SMOKE_SESSIONS = (2,)


def _delivered(result: TurnsResult) -> float:
    """Tokens that reached their watchers, per second of the conversations."""
    received = result.tokens - result.lost
    return received / result.wall_seconds if result.wall_seconds else math.nan


def lines_for(n: int, results: dict[str, list[TurnsResult]]) -> list[Line]:
    def med(name: str, attr: str) -> float:
        return median([getattr(r, attr) for r in results[name]])

    lines = _nats_lines(n, results) if "nats" in results else []
    split_p99, same_p99 = med("split", "p99_ms"), med("same", "p99_ms")
    split_rate = median([_delivered(r) for r in results["split"]])
    same_rate = median([_delivered(r) for r in results["same"]])
    lost = max(r.lost + r.failed_turns for r in results["split"])
    return [
        *lines,
        Line(
            "bus",
            f"N={n}: p99 token latency, watchers on another node vs the same",
            split_p99,
            same_p99,
            ratio(split_p99, same_p99),
            unit="ms",
        ),
        Line(
            "bus",
            f"N={n}: p50 token latency, another node vs the same",
            med("split", "p50_ms"),
            med("same", "p50_ms"),
            ratio(med("split", "p50_ms"), med("same", "p50_ms")),
            unit="ms",
        ),
        Line(
            "bus",
            f"N={n}: tokens delivered per second, another node vs the same",
            split_rate,
            same_rate,
            ratio(split_rate, same_rate),
            unit="/s",
        ),
        Line(
            "bus",
            f"N={n}: CPU per token of both nodes, another node vs the same",
            med("split", "cpu_per_token_us"),
            med("same", "cpu_per_token_us"),
            ratio(med("split", "cpu_per_token_us"), med("same", "cpu_per_token_us")),
            unit="µs",
        ),
        Line(
            "bus",
            f"N={n}: lost tokens and failed turns across nodes (worst run)",
            float(lost),
            float(max(r.lost + r.failed_turns for r in results["same"])),
            None,
            "0",
            lost == 0,
        ),
    ]


def _nats_lines(n: int, results: dict[str, list[TurnsResult]]) -> list[Line]:
    def med(name: str, attr: str) -> float:
        return median([getattr(r, attr) for r in results[name]])

    lost = max(r.lost + r.failed_turns for r in results["nats"])
    return [
        Line(
            "bus",
            f"N={n}: p99 token latency across nodes, NATS bus vs PostgreSQL bus",
            med("nats", "p99_ms"),
            med("split", "p99_ms"),
            ratio(med("nats", "p99_ms"), med("split", "p99_ms")),
            unit="ms",
        ),
        Line(
            "bus",
            f"N={n}: p50 token latency across nodes, NATS bus vs PostgreSQL bus",
            med("nats", "p50_ms"),
            med("split", "p50_ms"),
            ratio(med("nats", "p50_ms"), med("split", "p50_ms")),
            unit="ms",
        ),
        Line(
            "bus",
            f"N={n}: CPU per token of both nodes, NATS bus vs PostgreSQL bus",
            med("nats", "cpu_per_token_us"),
            med("split", "cpu_per_token_us"),
            ratio(med("nats", "cpu_per_token_us"), med("split", "cpu_per_token_us")),
            unit="µs",
        ),
        Line(
            "bus",
            f"N={n}: CPU per token of a node watching none, NATS vs PostgreSQL bus",
            med("nats", "bystander_cpu_per_token_us"),
            med("split", "bystander_cpu_per_token_us"),
            ratio(
                med("nats", "bystander_cpu_per_token_us"),
                med("split", "bystander_cpu_per_token_us"),
            ),
            unit="µs",
        ),
        Line(
            "bus",
            f"N={n}: lost tokens and failed turns over NATS (worst run)",
            float(lost),
            goal="0",
            met=lost == 0,
            compared=False,
        ),
    ]


async def start_nats(db: Database) -> Proc | None:
    """A nats-server of the bench's own on a free port, or None where none is installed."""
    binary = shutil.which("nats-server")
    if binary is None:
        db.notes.append(
            "bus: nats-server is not installed; the NATS bus was not measured"
        )
        return None
    port = free_port()
    proc = await spawn(
        "nats",
        [*db.pinning.load, binary, "-a", "127.0.0.1", "-p", str(port)],
        cwd=BENCH_ROOT,
        env=python_env(BENCH_ROOT),
        log=db.tmp / "logs" / f"nats-{port}.log",
    )
    db.procs.append(proc)
    proc.url = f"nats://127.0.0.1:{port}"
    return proc if await listening(port) else None


async def row_bus(db: Database) -> list[Line]:
    model = await start_provider(db)
    runner = await db.service("service-bus-a", db.pinning.server, **model)
    watcher = await db.service("service-bus-b", db.pinning.server, **model)
    bystander = await db.service("service-bus-c", db.pinning.server, **model)
    both = [runner, watcher]
    nats_nodes: list[Proc] = []
    nats = await start_nats(db)
    if nats is not None:
        for name in ("service-nats-a", "service-nats-b", "service-nats-c"):
            node = await db.service(name, db.pinning.server, BUS_URL=nats.url, **model)
            nats_nodes.append(node)
    lines: list[Line] = []
    details: dict[str, object] = {}
    for n in SMOKE_SESSIONS if db.profile.smoke else SESSIONS:
        targets = {
            "same": service_target(db, runner, nodes=both),
            "split": service_target(
                db, runner, watch=watcher, nodes=both, bystanders=[bystander]
            ),
        }
        if nats_nodes:
            targets["nats"] = service_target(
                db,
                nats_nodes[0],
                watch=nats_nodes[1],
                nodes=nats_nodes[:2],
                bystanders=nats_nodes[2:],
            )
        lines += lines_for(n, await compare(db, targets, n, details))
    db.details["bus"] = details
    return lines
