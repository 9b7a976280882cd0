"""The `balanced` row (PostgreSQL): the `turns` row's conversations through HAProxy.

Three service processes on one database behind HAProxy (Debian's `haproxy`,
round-robin, no affinity, on the load core), all reading the `turns` row's model
provider. N sessions are created, posted to (three turns each, `?wait=true`) and
watched through the balancer, so a session's requests and its stream land on different
processes and most tokens reach their watcher through the bus. The baseline is the same
conversations sent to one of the three processes directly, measured side by side; the
CPU of all three processes is counted both ways (the others hear the bus either way).
`--bus-url` carries the lane's live traffic over NATS instead of LISTEN/NOTIFY.

Per N (16 and 64): p50 and p99 token latency, CPU per token, lost tokens (goal 0).
"""

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

SESSIONS = (16, 64)
SMOKE_SESSIONS = (2,)
NODES = 3

CONFIG = """global
    maxconn 8000
defaults
    mode http
    # Stream frames go out as they come (HAProxy otherwise holds small writes back,
    # up to 200 ms, for more).
    option http-no-delay
    timeout connect 5s
    timeout client 600s
    timeout server 600s
frontend front
    bind 127.0.0.1:{port}
    default_backend nodes
backend nodes
    balance roundrobin
{servers}
"""


async def start_haproxy(db: Database, nodes: list[Proc]) -> Proc | None:
    """HAProxy round-robin over `nodes`, or None where it is not installed."""
    binary = shutil.which("haproxy")
    if binary is None:
        db.notes.append("balanced: haproxy is not installed; the row was not measured")
        return None
    port = free_port()
    servers = "\n".join(
        f"    server node{i} {node.url.removeprefix('http://')}"
        for i, node in enumerate(nodes)
    )
    config = db.tmp / f"haproxy-{port}.cfg"
    config.write_text(CONFIG.format(port=port, servers=servers))
    proc = await spawn(
        "haproxy",
        [*db.pinning.load, binary, "-db", "-f", str(config)],
        cwd=BENCH_ROOT,
        env=python_env(BENCH_ROOT),
        log=db.tmp / "logs" / f"haproxy-{port}.log",
    )
    db.procs.append(proc)
    proc.url = f"http://127.0.0.1:{port}"
    if await listening(port):
        return proc
    db.notes.append(f"balanced: haproxy did not start: {proc.log_tail(3)}")
    return None


async def row_balanced(db: Database) -> list[Line]:
    model = await start_provider(db)
    nodes = [
        await db.service(f"service-node-{i}", db.pinning.server, **model)
        for i in range(NODES)
    ]
    balancer = await start_haproxy(db, nodes)
    if balancer is None:
        return []
    lines: list[Line] = []
    details: dict[str, object] = {}
    for n in SMOKE_SESSIONS if db.profile.smoke else SESSIONS:
        targets = {
            "balanced": service_target(db, balancer, nodes=nodes),
            "one": service_target(db, nodes[0], nodes=nodes),
        }
        lines += lines_for(n, await compare(db, targets, n, details))
    db.details["balanced"] = details
    return lines


def lines_for(n: int, results: dict[str, list[TurnsResult]]) -> list[Line]:
    def med(name: str, attr: str) -> float:
        return median([getattr(r, attr) for r in results[name]])

    def pair(label: str, attr: str, unit: str) -> Line:
        service, baseline = med("balanced", attr), med("one", attr)
        return Line(
            "balanced",
            f"N={n}: {label}, through HAProxy vs one node",
            service,
            baseline,
            ratio(service, baseline),
            unit=unit,
        )

    lost = max(r.lost + r.failed_turns for r in results["balanced"])
    return [
        pair("p99 token latency", "p99_ms", "ms"),
        pair("p50 token latency", "p50_ms", "ms"),
        pair(f"CPU per token of the {NODES} nodes", "cpu_per_token_us", "µs"),
        Line(
            "balanced",
            f"N={n}: lost tokens and failed turns through HAProxy (worst run)",
            float(lost),
            float(max(r.lost + r.failed_turns for r in results["one"])),
            None,
            "0",
            lost == 0,
        ),
    ]
