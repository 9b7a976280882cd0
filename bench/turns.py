"""The `turns` row: concurrent conversations end to end, as a chat product runs them.

A model provider (`bench.baselines.provider`, on the load core) streams every answer as
`CHUNKS` chunks, one every `INTERVAL_MS`, each carrying its send time. N sessions, each
with its Mutation stream open, run `TURNS` turns one after another with `?wait=true`;
a token's latency is its first arrival on its session's stream minus its send time.

The baseline is a minimal relay (`bench.baselines.relay`) with the same uvicorn flags
and the same `openai` package: a POST starts the streamed request and each chunk's
text is written as an SSE frame to the session's subscribers; nothing is stored.

Per N, side by side: CPU per token (the server process's CPU time over the turns,
divided by the tokens streamed), p50/p99 token latency, lost tokens, and conversations
one core carries at 25 tokens/s (1 / (CPU per token x 25)).
"""

import asyncio
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from bench.load import Subscribers, percentile
from bench.rows import Database, Line, median, ratio, side_by_side
from bench.servers import BenchError, Proc, cpu_seconds, start_baseline

CHUNKS = 40
INTERVAL_MS = 40
TURNS = 3
TOKENS_PER_SECOND = 25


@dataclass
class TurnsResult:
    conversations: int
    tokens: int
    cpu_seconds: float
    wall_seconds: float
    p50_ms: float
    p99_ms: float
    lost: int
    failed_turns: int
    # CPU of the target's bystanders: nodes on the bus that run and watch nothing.
    bystander_cpu_seconds: float = 0.0

    @property
    def bystander_cpu_per_token_us(self) -> float:
        return (
            self.bystander_cpu_seconds / self.tokens * 1e6 if self.tokens else math.nan
        )

    @property
    def cpu_per_token_us(self) -> float:
        return self.cpu_seconds / self.tokens * 1e6 if self.tokens else math.nan

    @property
    def per_core(self) -> float:
        """Conversations one core carries at TOKENS_PER_SECOND."""
        per_token = self.cpu_seconds / self.tokens if self.tokens else math.nan
        return 1 / (per_token * TOKENS_PER_SECOND) if per_token else math.nan

    def as_dict(self) -> dict[str, float]:
        return {
            "conversations": self.conversations,
            "cpu_per_token_us": round(self.cpu_per_token_us, 1),
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "lost": self.lost,
            "failed_turns": self.failed_turns,
            "wall_seconds": round(self.wall_seconds, 2),
            "bystander_cpu_per_token_us": round(self.bystander_cpu_per_token_us, 1),
        }


@dataclass
class Target:
    """How one server is driven: its stream and message paths for a session."""

    proc: Proc
    stream: Callable[[str], str]
    messages: Callable[[str], str]
    sessions: Callable[[int], Awaitable[list[str]]]
    # The node the streams are opened on, when it is not `proc` (which runs the
    # turns): every token then reaches its watchers through the bus.
    watch: Proc | None = None
    # Every process whose CPU time the row counts (default: `proc`, and `watch`).
    nodes: list[Proc] | None = None
    # Nodes on the same bus that neither run nor watch these conversations: what
    # hearing them costs a node, counted apart.
    bystanders: list[Proc] = field(default_factory=list)


async def conversations(db: Database, target: Target, n: int) -> TurnsResult:
    """N conversations of TURNS turns each, every session watched by one stream."""
    proc = target.proc
    watch = target.watch or proc
    nodes = target.nodes or ([proc] if watch is proc else [proc, watch])
    sessions = await target.sessions(n)
    expected = TURNS * CHUNKS
    turn_seconds = CHUNKS * INTERVAL_MS / 1000
    subs = await Subscribers.start(
        url=watch.url,
        paths=[target.stream(s) for s in sessions],
        headers=db.auth,
        expected=expected,
        pin=db.pinning.load,
        log_dir=db.tmp / "logs",
        run_timeout=TURNS * turn_seconds * 20 + 300,
        stamps=True,
    )
    failed = 0
    try:
        await subs.connect(60 + n / 20)
        # The stream's first bytes are written once it is subscribed; a moment for
        # the last of them to arrive.
        await asyncio.sleep(db.profile.settle / 2)
        limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
        async with httpx.AsyncClient(
            base_url=proc.url,
            headers=db.auth,
            limits=limits,
            timeout=TURNS * turn_seconds * 20 + 60,
        ) as client:

            async def converse(session: str) -> None:
                nonlocal failed
                for turn in range(TURNS):
                    body = {
                        "message": {
                            "content": [{"type": "text", "text": f"turn {turn}"}]
                        }
                    }
                    try:
                        answer = await client.post(
                            target.messages(session),
                            params={"wait": "true", "timeout_ms": "600000"},
                            json=body,
                        )
                    except httpx.HTTPError:
                        # Counted (a failed turn), not fatal to the row: its tokens
                        # are then counted lost too.
                        failed += 1
                        continue
                    if answer.status_code != 200 or (
                        answer.json().get("status") != "completed"
                    ):
                        failed += 1

            cpu_before = sum(cpu_seconds(node.pid) for node in nodes)
            bystanders_before = sum(cpu_seconds(b.pid) for b in target.bystanders)
            started = time.monotonic()
            await asyncio.gather(*(converse(s) for s in sessions))
            wall = time.monotonic() - started
        await subs.wait("complete", db.profile.grace)
        cpu = sum(cpu_seconds(node.pid) for node in nodes) - cpu_before
        bystanders_cpu = (
            sum(cpu_seconds(b.pid) for b in target.bystanders) - bystanders_before
        )
        merged = await subs.finish()
    finally:
        await subs.close()
    latencies: list[float] = merged["latencies_ms"]
    received = sum(merged["received"])
    return TurnsResult(
        conversations=n,
        tokens=n * expected,
        cpu_seconds=cpu,
        wall_seconds=wall,
        p50_ms=percentile(latencies, 50) if latencies else math.nan,
        p99_ms=percentile(latencies, 99) if latencies else math.nan,
        lost=n * expected - received,
        failed_turns=failed,
        bystander_cpu_seconds=bystanders_cpu,
    )


def measure(
    db: Database, target: Target, n: int
) -> Callable[[], Awaitable[TurnsResult]]:
    return lambda: conversations(db, target, n)


async def compare(
    db: Database, targets: dict[str, Target], n: int, details: dict[str, object]
) -> dict[str, list[TurnsResult]]:
    """N conversations on each target, side by side, each run kept in `details`."""
    results = await side_by_side(
        {name: measure(db, target, n) for name, target in targets.items()},
        db.profile.runs,
    )
    details[str(n)] = {
        name: [r.as_dict() for r in runs] for name, runs in results.items()
    }
    return results


async def start_provider(db: Database) -> dict[str, str]:
    """The rows' model provider (`bench.baselines.provider`, on the load core), and
    the environment that has a service answer from it with no cap on running turns."""
    chunks = ["--chunks", str(CHUNKS), "--interval-ms", str(INTERVAL_MS)]
    provider = await start_baseline(
        "provider", "bench.baselines.provider", chunks, db.pinning.load, db.tmp / "logs"
    )
    db.procs.append(provider)
    return {
        "MODEL_DRIVER": "openai",
        "OPENAI_BASE_URL": f"{provider.url}/v1",
        "OPENAI_MODEL": "bench",
        "MAX_RUNNING_TURNS_PER_ORG": "100000",
        "MAX_RUNNING_TURNS_PER_PROCESS": "100000",
    }


def service_target(
    db: Database,
    proc: Proc,
    watch: Proc | None = None,
    nodes: list[Proc] | None = None,
    bystanders: list[Proc] | None = None,
) -> Target:
    async def sessions(n: int) -> list[str]:
        api = db.api(proc)
        try:
            return [await api.create_session("turns") for _ in range(n)]
        finally:
            await api.close()

    return Target(
        proc,
        stream=lambda s: f"/v1/sessions/{s}/messages/stream",
        messages=lambda s: f"/v1/sessions/{s}/messages",
        sessions=sessions,
        watch=watch,
        nodes=nodes,
        bystanders=bystanders or [],
    )


def relay_target(proc: Proc) -> Target:
    async def sessions(n: int) -> list[str]:
        return [uuid.uuid4().hex for _ in range(n)]

    return Target(
        proc,
        stream=lambda s: f"/sessions/{s}/stream",
        messages=lambda s: f"/sessions/{s}/messages",
        sessions=sessions,
    )


def lines_for(n: int, results: dict[str, list[TurnsResult]]) -> list[Line]:
    def med(name: str, attr: str) -> float:
        return median([getattr(r, attr) for r in results[name]])

    service_cpu, relay_cpu = (
        med("service", "cpu_per_token_us"),
        med("relay", "cpu_per_token_us"),
    )
    service_p99, relay_p99 = med("service", "p99_ms"), med("relay", "p99_ms")
    lost = max(r.lost + r.failed_turns for r in results["service"])
    # The relay saturates its core when its tokens cost more than the core has: then
    # its latency says how far behind it fell, not what a relay costs.
    saturated = relay_cpu * n * TOKENS_PER_SECOND / 1e6 >= 0.9
    return [
        Line(
            "turns",
            f"N={n}: CPU per token vs relay",
            service_cpu,
            relay_cpu,
            ratio(service_cpu, relay_cpu),
            "≤ 1.00",
            service_cpu <= relay_cpu,
            "µs",
        ),
        Line(
            "turns",
            f"N={n}: p99 token latency vs relay"
            + (" (relay saturated)" if saturated else ""),
            service_p99,
            relay_p99,
            ratio(service_p99, relay_p99),
            "—" if saturated else "≤ 1.50",
            None if saturated else service_p99 <= 1.5 * relay_p99 and lost == 0,
            "ms",
        ),
        Line(
            "turns",
            f"N={n}: p50 token latency vs relay",
            med("service", "p50_ms"),
            med("relay", "p50_ms"),
            ratio(med("service", "p50_ms"), med("relay", "p50_ms")),
            unit="ms",
        ),
        Line(
            "turns",
            f"N={n}: lost tokens and failed turns (worst run)",
            float(lost),
            float(max(r.lost + r.failed_turns for r in results["relay"])),
            None,
            "0",
            lost == 0,
        ),
        Line(
            "turns",
            f"N={n}: conversations per core at {TOKENS_PER_SECOND} tokens/s",
            med("service", "per_core"),
            med("relay", "per_core"),
            ratio(med("service", "per_core"), med("relay", "per_core")),
        ),
    ]


async def row_turns(db: Database) -> list[Line]:
    """The provider, the service on it (`MODEL_DRIVER=openai`) and the relay, then each
    N side by side."""
    model = await start_provider(db)
    service = await db.service("service-turns", db.pinning.server, **model)
    relay = await db.baseline("relay", "relay", "--provider", model["OPENAI_BASE_URL"])
    lines: list[Line] = []
    details: dict[str, object] = {}
    for n in db.profile.conversations:
        targets = {"service": service_target(db, service), "relay": relay_target(relay)}
        results = await compare(db, targets, n, details)
        if any(r.tokens == 0 for runs in results.values() for r in runs):
            raise BenchError(f"N={n}: a run streamed nothing")
        lines += lines_for(n, results)
    db.details["turns"] = details
    return lines
