"""The rows: what each measures, side by side with its baseline, run after run.

Each row returns `Line`s (one per figure with a goal or worth reading) and records its
raw figures in `Database.details`. A row that cannot produce its figure fails alone:
its lines say why and the others still run.
"""

import asyncio
import contextlib
import math
import sqlite3
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import asyncpg
import httpx
import orjson

from bench.client import Api
from bench.load import (
    FanoutResult,
    Probe,
    Subscribers,
    fanout_result,
    run_wrk,
    writers_script,
)
from bench.servers import (
    BENCH_ROOT,
    BenchError,
    Pinning,
    Proc,
    ServiceConfig,
    children_cpu_seconds,
    core_busy,
    core_times,
    cpu_seconds,
    postgres_cpu_seconds,
    python_env,
    spawn,
    start_baseline,
    start_service,
    supports_workers,
)

ROWS = (
    "page",
    "etag",
    "older",
    "writes",
    "search",
    "fanout-mutation",
    "fanout-sse",
    "idle-rss",
    "workers",
    "turns",
    "notify",
    "bus",
    "balanced",
)
POSTGRES_ONLY = frozenset({"older", "workers", "notify", "bus", "balanced"})
SSE_TYPES = "types=output.message.delta&types=turn.completed"
DELTA_INTERVAL_MS = 20


@dataclass(frozen=True)
class Profile:
    """Sizes of one run: the full benchmark, or the smoke run that only proves every
    row still produces its figures."""

    smoke: bool
    runs: int
    duration: float
    warmup: float
    settle: float
    grace: float
    messages: int
    text_bytes: int
    connections: int
    writers: int
    subscribers: int
    deltas: int
    idle_streams: int
    # The turns row's N: concurrent conversations.
    conversations: tuple[int, ...]

    @classmethod
    def create(
        cls,
        *,
        smoke: bool,
        runs: int | None,
        duration: float | None,
        subscribers: int | None,
        deltas: int | None,
        idle_streams: int | None,
        conversations: tuple[int, ...] | None = None,
    ) -> "Profile":
        if smoke:
            base = cls(True, 1, 1.0, 0.0, 0.5, 2.0, 60, 500, 32, 64, 50, 30, 50, (5,))
        else:
            base = cls(
                False,
                3,
                10.0,
                2.0,
                2.0,
                5.0,
                1000,
                500,
                32,
                64,
                1000,
                500,
                1000,
                (50, 100, 200),
            )
        return cls(
            smoke=base.smoke,
            runs=runs or base.runs,
            duration=duration or base.duration,
            warmup=base.warmup,
            settle=base.settle,
            grace=base.grace,
            messages=base.messages,
            text_bytes=base.text_bytes,
            connections=base.connections,
            writers=base.writers,
            subscribers=subscribers or base.subscribers,
            deltas=deltas or base.deltas,
            idle_streams=idle_streams or base.idle_streams,
            conversations=conversations or base.conversations,
        )


@dataclass
class Line:
    row: str
    label: str
    service: float | None = None
    baseline: float | None = None
    ratio: float | None = None
    goal: str = "—"
    met: bool | None = None
    unit: str = ""
    note: str = ""
    failed: bool = False
    # False for figures the service has alone (the writers' POST rate and latency).
    compared: bool = True

    def check(self) -> None:
        """A line without its figures failed, whatever the row function said."""
        if self.note or self.failed:
            return
        missing = [
            name
            for name, value in (("service", self.service), ("baseline", self.baseline))
            if (name == "service" or self.compared)
            and (value is None or math.isnan(value))
        ]
        if missing:
            self.failed = True
            self.note = f"FAILED: no {' or '.join(missing)} figure"

    def as_dict(self) -> dict[str, Any]:
        def clean(value: float | None) -> float | None:
            return None if value is None or math.isnan(value) else round(value, 4)

        return {
            "row": self.row,
            "label": self.label,
            "service": clean(self.service),
            "baseline": clean(self.baseline),
            "ratio": clean(self.ratio),
            "goal": self.goal,
            "met": self.met,
            "unit": self.unit,
            "note": self.note,
            "failed": self.failed,
        }


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return None
    return a / b


def median(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


async def side_by_side(
    targets: dict[str, Callable[[], Awaitable[Any]]], runs: int
) -> dict[str, list[Any]]:
    """Every target once per run, the order rotated each run, so drift and noise from
    the rest of the machine fall on all of them alike."""
    names = list(targets)
    results: dict[str, list[Any]] = {name: [] for name in names}
    for run in range(runs):
        shift = run % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(await targets[name]())
    return results


@dataclass
class Database:
    """One database's run: its scratch database, the processes of the current phase,
    the seeded conversation, and every raw figure (for --json)."""

    name: str
    profile: Profile
    pinning: Pinning
    config: ServiceConfig
    key: str
    tmp: Path
    pg_dsn: str | None = None
    sqlite_path: Path | None = None
    procs: list[Proc] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    page_session: str | None = None
    page_body: bytes = b""
    page_etag: str = ""
    writer_sessions: list[str] = field(default_factory=list)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def is_postgres(self) -> bool:
        return self.name == "postgresql"

    async def service(self, name: str, pin: list[str], **env: str) -> Proc:
        proc = await start_service(self.config, name, pin, env)
        self.procs.append(proc)
        return proc

    async def baseline(self, name: str, module: str, *args: str) -> Proc:
        proc = await start_baseline(
            name,
            f"bench.baselines.{module}",
            args,
            self.pinning.server,
            self.tmp / "logs",
        )
        self.procs.append(proc)
        return proc

    async def stop_all(self) -> None:
        for proc in self.procs:
            await proc.stop()
        self.procs.clear()

    def api(self, proc: Proc) -> Api:
        return Api(proc.url, self.key)


# ---- the newest page, 304, an older page ----------------------------------------------


async def seed(db: Database, server: Proc) -> None:
    """One session with ~`messages` messages of ~500 bytes of text each, posted one
    turn at a time through the API; then its newest page and ETag as the service
    serves them."""
    if db.page_session is not None:
        return
    api = db.api(server)
    try:
        session = await api.create_session("page")
        started = time.monotonic()
        total = await api.seed(
            session, db.profile.messages, db.profile.text_bytes, within=600
        )
        response = await api.page(session, "limit=50")
        if response.status_code != 200:
            raise BenchError(f"newest page answered {response.status_code}")
        db.page_session = session
        db.page_body = response.content
        db.page_etag = response.headers.get("etag", "")
        db.details["seed"] = {
            "messages": total,
            "seconds": round(time.monotonic() - started, 1),
            "page_bytes": len(response.content),
            "etag": db.page_etag,
        }
        db.notes.append(
            f"seeded {total} messages in {time.monotonic() - started:.1f} s; "
            f"newest page {len(response.content) / 1024:.1f} KB"
        )
    finally:
        await api.close()


async def wrk_targets(
    db: Database, urls: dict[str, str], headers: dict[str, str]
) -> dict[str, list[Any]]:
    profile = db.profile
    if profile.warmup > 0:
        for url in urls.values():
            await run_wrk(
                url, pin=db.pinning.load, duration=profile.warmup, headers=headers
            )

    def measure(url: str) -> Callable[[], Awaitable[Any]]:
        async def once() -> Any:
            return await run_wrk(
                url,
                pin=db.pinning.load,
                duration=profile.duration,
                connections=profile.connections,
                headers=headers,
            )

        return once

    return await side_by_side(
        {name: measure(url) for name, url in urls.items()}, profile.runs
    )


def rates(results: list[Any]) -> float:
    return median([r.requests_per_s for r in results])


def wrk_details(results: dict[str, list[Any]]) -> dict[str, Any]:
    return {name: [r.as_dict() for r in runs] for name, runs in results.items()}


def check_clean(row: str, results: dict[str, list[Any]]) -> str:
    bad = [
        f"{name}: {sum(r.errors for r in runs)} socket errors, "
        f"{sum(r.non_2xx_3xx for r in runs)} non-2xx/3xx"
        for name, runs in results.items()
        if any(r.errors or r.non_2xx_3xx for r in runs)
    ]
    return f"{row}: " + "; ".join(bad) if bad else ""


async def fixed_bytes_baseline(db: Database) -> Proc:
    for proc in db.procs:
        if proc.name == "fixed-bytes":
            return proc
    body = db.tmp / "page.json"
    body.write_bytes(db.page_body)
    return await db.baseline(
        "fixed-bytes", "fixed_bytes", "--body", str(body), "--etag", db.page_etag
    )


async def row_page(db: Database, server: Proc) -> list[Line]:
    await seed(db, server)
    baseline = await fixed_bytes_baseline(db)
    path = f"/v1/sessions/{db.page_session}/messages?limit=50"
    async with httpx.AsyncClient(headers=db.auth, timeout=10) as client:
        same = (await client.get(baseline.url + path)).content == db.page_body
    if not same:
        raise BenchError("the fixed-bytes baseline does not serve the service's page")
    results = await wrk_targets(
        db, {"service": server.url + path, "fastapi": baseline.url + path}, db.auth
    )
    db.details["page"] = wrk_details(results)
    if warning := check_clean("page", results):
        db.notes.append(warning)
    service, fastapi = rates(results["service"]), rates(results["fastapi"])
    r = ratio(service, fastapi)
    return [
        Line(
            "page",
            "newest page, req/s vs FastAPI fixed bytes",
            service,
            fastapi,
            r,
            "≥ 0.70",
            r is not None and r >= 0.70,
            "req/s",
        )
    ]


async def row_etag(db: Database, server: Proc) -> list[Line]:
    await seed(db, server)
    baseline = await fixed_bytes_baseline(db)
    path = f"/v1/sessions/{db.page_session}/messages?limit=50"
    headers = {**db.auth, "If-None-Match": db.page_etag}
    async with httpx.AsyncClient(headers=headers, timeout=10) as client:
        status = (await client.get(server.url + path)).status_code
    if status != 304:
        raise BenchError(
            f"If-None-Match with the page's ETag answered {status}, not 304"
        )
    results = await wrk_targets(
        db, {"service": server.url + path, "fastapi": baseline.url + path}, headers
    )
    db.details["etag"] = wrk_details(results)
    if warning := check_clean("etag", results):
        db.notes.append(warning)
    service, fastapi = rates(results["service"]), rates(results["fastapi"])
    r = ratio(service, fastapi)
    return [
        Line(
            "etag",
            "304 on If-None-Match, req/s vs FastAPI fixed bytes (200)",
            service,
            fastapi,
            r,
            "≥ 0.90",
            r is not None and r >= 0.90,
            "req/s",
        )
    ]


async def row_older(db: Database, server: Proc) -> list[Line]:
    await seed(db, server)
    assert db.pg_dsn is not None
    newest = orjson.loads(db.page_body)
    before = max(2, int(newest["end_sequence"]) // 2)
    query = f"limit=50&before_sequence={before}"
    path = f"/v1/sessions/{db.page_session}/messages?{query}"
    api = db.api(server)
    try:
        response = await api.page(str(db.page_session), query)
    finally:
        await api.close()
    if response.status_code != 200:
        raise BenchError(f"the older page answered {response.status_code}")
    page = response.json()
    common = (
        "--dsn",
        db.pg_dsn,
        "--total",
        str(page["total"]),
        "--cursor",
        str(page["cursor"]),
    )
    join, naive = await asyncio.gather(
        db.baseline("asyncpg-join", "pg_page", "--mode", "join", *common),
        db.baseline("pydantic", "pg_page", "--mode", "pydantic", *common),
    )
    async with httpx.AsyncClient(headers=db.auth, timeout=10) as client:
        joined = await client.get(join.url + path)
        naive_page = await client.get(naive.url + path)
    if joined.status_code != 200 or naive_page.status_code != 200:
        raise BenchError(
            f"baselines answered {joined.status_code} (join), {naive_page.status_code} (pydantic)"
        )
    identical = joined.content == response.content
    results = await wrk_targets(
        db,
        {
            "service": server.url + path,
            "join": join.url + path,
            "pydantic": naive.url + path,
        },
        db.auth,
    )
    db.details["older"] = {
        "before_sequence": before,
        "page_bytes": len(response.content),
        "join_bytes_identical": identical,
        **wrk_details(results),
    }
    db.notes.append(
        f"older: before_sequence={before}, {len(response.content) / 1024:.1f} KB; "
        f"byte-join body identical to the service's: {'yes' if identical else 'NO'}"
    )
    if warning := check_clean("older", results):
        db.notes.append(warning)
    service = rates(results["service"])
    join_rate, naive_rate = rates(results["join"]), rates(results["pydantic"])
    r_join, r_naive = ratio(service, join_rate), ratio(service, naive_rate)
    return [
        Line(
            "older",
            "older page, req/s vs asyncpg byte-join",
            service,
            join_rate,
            r_join,
            "≥ 0.90",
            r_join is not None and r_join >= 0.90,
            "req/s",
        ),
        Line(
            "older",
            "older page, req/s vs naive pydantic",
            service,
            naive_rate,
            r_naive,
            "≥ 1.80",
            r_naive is not None and r_naive >= 1.80,
            "req/s",
        ),
    ]


# ---- durable checkpoints under concurrent writers --------------------------------------

CHECKPOINTS_SQL = (
    "SELECT (SELECT COALESCE(SUM(revision), 0) FROM messages)"
    " + (SELECT COUNT(*) FROM events"
    " WHERE type IN ('turn.completed', 'turn.failed', 'turn.cancelled')),"
    " (SELECT COUNT(*) FROM events)"
)


def _sqlite_checkpoints(path: Path) -> tuple[int, int]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        checkpoints, events = conn.execute(CHECKPOINTS_SQL).fetchone()
        return int(checkpoints), int(events)
    finally:
        conn.close()


async def count_checkpoints(db: Database) -> tuple[int, int]:
    """Checkpoints and committed event rows so far. Every checkpoint bumps one
    message's revision (a new message starts at 1) or ends a turn (with its outcome
    event): the sum of revisions plus the outcome events counts them."""
    if db.pg_dsn is not None:
        conn = await asyncio.wait_for(asyncpg.connect(db.pg_dsn), 15)
        try:
            row = await asyncio.wait_for(conn.fetchrow(CHECKPOINTS_SQL), 60)
            return int(row[0]), int(row[1])
        finally:
            await conn.close()
    assert db.sqlite_path is not None
    return await asyncio.wait_for(
        asyncio.to_thread(_sqlite_checkpoints, db.sqlite_path), 60
    )


def writer_text(size: int) -> str:
    """~`size` bytes in ten long words: the scripted echo then streams ten deltas per
    reply, so the row weighs checkpoints, not delta publishing (the fan-out rows do)."""
    words = [
        (f"w{i}" + "abcdefghijklmnopqrstuvwxyz" * 4)[: size // 10 - 1]
        for i in range(10)
    ]
    return " ".join(words)


async def wait_all_idle(api: Api, sessions: list[str], within: float) -> float:
    started = time.monotonic()
    deadline = started + within
    pending = list(sessions)
    while pending and time.monotonic() < deadline:
        statuses = await asyncio.gather(*(api.status(s) for s in pending))
        pending = [
            s for s, status in zip(pending, statuses, strict=True) if status != "idle"
        ]
        if pending:
            await asyncio.sleep(0.2)
    if pending:
        raise BenchError(
            f"{len(pending)} writer sessions still running after {within:.0f} s"
        )
    return time.monotonic() - started


async def baseline_writes(
    db: Database,
    connections: int = 8,
    notify: bool | None = None,
    nats_url: str | None = None,
) -> dict[str, float]:
    """Raw write transactions (bench.baselines.writes) where the service runs; on
    PostgreSQL with `connections` writers, and with `notify` a NOTIFY in each
    transaction (True) or the same round trip without it (False), then with
    `nats_url` each wake-up published to NATS after the commit."""
    profile = db.profile
    if db.pg_dsn is not None:
        target = ["--dsn", db.pg_dsn, "--connections", str(connections)]
        if notify is not None:
            target += ["--notify", "yes" if notify else "no"]
        if nats_url is not None:
            target += ["--nats", nats_url]
    else:
        target = ["--sqlite", str(db.tmp / "writes-baseline.db")]
    proc = await spawn(
        "writes-baseline",
        [
            *db.pinning.server,
            sys.executable,
            "-m",
            "bench.baselines.writes",
            *target,
            "--duration",
            str(profile.duration),
            "--warmup",
            str(min(profile.warmup, 0.5)),
        ],
        cwd=BENCH_ROOT,
        env=python_env(BENCH_ROOT),
        log=db.tmp / "logs" / "writes-baseline.log",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.process.stdout is not None
        out = await asyncio.wait_for(proc.process.stdout.read(), profile.duration + 60)
        await asyncio.wait_for(proc.process.wait(), 30)
    finally:
        await proc.stop()
    if proc.process.returncode != 0 or not out.strip():
        raise BenchError(f"writes baseline failed: {proc.log_tail()}")
    result: dict[str, float] = orjson.loads(out)
    return result


def cpu_between(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def per_post_us(seconds: float | None, posts: float) -> float | None:
    return None if seconds is None else seconds / posts * 1e6


def writes_cpu_note(wrk: list[dict[str, Any]], client: list[dict[str, Any]]) -> str:
    """Where a POST's CPU goes under each client, medians: the service, the client
    itself, PostgreSQL (all of its processes), and the service's share of its core.
    Both clients share the load core with PostgreSQL, so a client's own CPU is what
    PostgreSQL cannot run there."""

    def figure(results: list[dict[str, Any]], key: str, scale: float = 1.0) -> str:
        values = [r[key] for r in results if r.get(key) is not None]
        return f"{median(values) * scale:.0f}" if values else "—"

    def both(key: str, scale: float = 1.0) -> str:
        return f"{figure(wrk, key, scale)} / {figure(client, key, scale)}"

    return (
        "writes: CPU per POST under wrk / under the aiohttp client: service "
        f"{both('server_cpu_per_post_us')} µs (its share of its core "
        f"{both('server_core_share', 100)} %), the client itself "
        f"{both('client_cpu_per_post_us')} µs, PostgreSQL "
        f"{both('postgres_cpu_per_post_us')} µs; cores busy under wrk "
        f"{busy_text(wrk)}, under the client {busy_text(client)}"
    )


def busy_text(results: list[dict[str, Any]]) -> str:
    """Each core's median busy fraction over runs, as `core 0 61 %, core 1 96 %`."""
    cores = sorted(results[0]["core_busy"])
    return ", ".join(
        f"core {c} {median([r['core_busy'][c] for r in results]) * 100:.0f} %"
        for c in cores
    )


async def writers_client(
    db: Database,
    url: str,
    pid: int,
    authorization: str,
    text: str,
    count: Callable[[], Awaitable[tuple[int, int]]],
) -> dict[str, Any]:
    """The `writes` row's writers from an aiohttp client of their own
    (bench.writers_client) against the server at `url` (process `pid`), with what
    `count` reads from the database (checkpoints and rows) counted around them, as
    around wrk."""
    profile = db.profile
    config = {
        "url": url,
        "sessions": db.writer_sessions,
        "authorization": authorization,
        "text": text,
        "run": uuid.uuid4().hex[:8],
        "duration": profile.duration,
    }
    proc = await spawn(
        "writers-client",
        [
            *db.pinning.load,
            sys.executable,
            "-m",
            "bench.writers_client",
            orjson.dumps(config).decode(),
        ],
        cwd=BENCH_ROOT,
        env=python_env(BENCH_ROOT),
        log=db.tmp / "logs" / "writers-client.log",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.process.stdout is not None
        assert proc.process.stdin is not None
        await asyncio.wait_for(proc.process.stdout.readline(), 30)
        before = await count()
        cpu_before = cpu_seconds(pid)
        postgres_before = postgres_cpu_seconds()
        cores = core_times()
        started = time.monotonic()
        proc.process.stdin.write(b"go\n")
        await proc.process.stdin.drain()
        out = await asyncio.wait_for(
            proc.process.stdout.readline(), profile.duration + 60
        )
        elapsed = time.monotonic() - started
        server_cpu = cpu_seconds(pid) - cpu_before
        postgres_cpu = cpu_between(postgres_before, postgres_cpu_seconds())
        busy = core_busy(cores)
        after = await count()
        await asyncio.wait_for(proc.process.wait(), 30)
    finally:
        await proc.stop()
    if not out.strip():
        raise BenchError(f"writers client failed: {proc.log_tail()}")
    result = orjson.loads(out)
    posts = max(result["ok"], 1)
    return {
        **result,
        "requests_per_s": result["ok"] / result["seconds"],
        "server_cpu_per_post_us": server_cpu / posts * 1e6,
        "server_core_share": server_cpu / elapsed,
        "client_cpu_per_post_us": result["cpu_seconds"] / posts * 1e6,
        "postgres_cpu_per_post_us": per_post_us(postgres_cpu, posts),
        "core_busy": busy,
        "checkpoints_per_s": (after[0] - before[0]) / elapsed,
        "events_per_s": (after[1] - before[1]) / elapsed,
    }


async def aiohttp_writers(
    db: Database, server: Proc, api: Api, text: str
) -> dict[str, Any]:
    """The aiohttp client's writers against the service, its checkpoints and event
    rows counted; then the time the runner needs to finish its turns."""
    result = await writers_client(
        db,
        server.url,
        server.pid,
        api.authorization,
        text,
        lambda: count_checkpoints(db),
    )
    drain = await wait_all_idle(api, db.writer_sessions, 120)
    return {**result, "drain_seconds": round(drain, 2)}


async def floor_writes(db: Database, text: str) -> dict[str, Any]:
    """The same aiohttp client's writers against the bare HTTP writer
    (bench.baselines.http_writes) on the service's core and database, its rows counted:
    what the `writes` row would read if the service did nothing of its own."""
    assert db.pg_dsn is not None
    dsn = db.pg_dsn

    async def rows() -> tuple[int, int]:
        # Each POST is one row here: the row is its checkpoint and its event.
        conn = await asyncio.wait_for(asyncpg.connect(dsn), 15)
        try:
            n = int(await conn.fetchval("SELECT count(*) FROM bench_rows"))
            return n, n
        finally:
            await conn.close()

    proc = await start_baseline(
        "writes-floor",
        "bench.baselines.http_writes",
        ["--dsn", dsn],
        db.pinning.server,
        db.tmp / "logs",
    )
    try:
        return await writers_client(db, proc.url, proc.pid, "", text, rows)
    finally:
        await proc.stop()


async def row_writes(db: Database, server: Proc) -> list[Line]:
    profile = db.profile
    api = db.api(server)
    try:
        if not db.writer_sessions:
            db.writer_sessions = [
                await api.create_session(f"writer-{i}") for i in range(profile.writers)
            ]
        text = writer_text(profile.text_bytes)

        async def service() -> dict[str, Any]:
            script = writers_script(
                db.tmp,
                db.writer_sessions,
                api.authorization,
                text,
                uuid.uuid4().hex[:8],
            )
            before = await count_checkpoints(db)
            cpu_before = cpu_seconds(server.pid)
            postgres_before = postgres_cpu_seconds()
            wrk_before = children_cpu_seconds()
            cores = core_times()
            started = time.monotonic()
            result = await run_wrk(
                server.url + "/",
                pin=db.pinning.load,
                duration=profile.duration,
                connections=profile.writers,
                threads=profile.writers,
                script=script,
            )
            # Counted at the moment wrk stops: what the runner still has in flight is
            # left out (measured separately as the drain time).
            elapsed = time.monotonic() - started
            server_cpu = cpu_seconds(server.pid) - cpu_before
            postgres_cpu = cpu_between(postgres_before, postgres_cpu_seconds())
            wrk_cpu = children_cpu_seconds() - wrk_before
            busy = core_busy(cores)
            after = await count_checkpoints(db)
            drain = await wait_all_idle(api, db.writer_sessions, 120)
            posts = max(result.requests_per_s * elapsed, 1)
            return {
                **result.as_dict(),
                "core_busy": busy,
                "server_cpu_per_post_us": server_cpu / posts * 1e6,
                "server_core_share": server_cpu / elapsed,
                "client_cpu_per_post_us": wrk_cpu / posts * 1e6,
                "postgres_cpu_per_post_us": per_post_us(postgres_cpu, posts),
                "checkpoints": after[0] - before[0],
                "seconds": round(elapsed, 3),
                "checkpoints_per_s": (after[0] - before[0]) / elapsed,
                "events_per_s": (after[1] - before[1]) / elapsed,
                "drain_seconds": round(drain, 2),
            }

        targets: dict[str, Callable[[], Awaitable[Any]]] = {
            "service": service,
            "client": lambda: aiohttp_writers(db, server, api, text),
            "baseline": lambda: baseline_writes(db),
        }
        if db.is_postgres:
            targets["floor"] = lambda: floor_writes(db, text)
        results = await side_by_side(targets, profile.runs)
    finally:
        await api.close()
    db.details["writes"] = results
    errors = sum(r["errors"] + r["non_2xx_3xx"] for r in results["service"])
    errors += sum(r["failed"] for r in results["client"])
    if errors:
        db.notes.append(f"writes: {errors} failed POSTs (socket errors or non-2xx)")
    db.notes.append(writes_cpu_note(results["service"], results["client"]))
    drains = [r["drain_seconds"] for r in results["service"]]
    db.notes.append(
        f"writes: after wrk stopped the runner needed {median(drains):.1f} s (median) "
        "to finish its in-flight turns; those checkpoints are not counted"
    )
    checkpoints = median([r["checkpoints_per_s"] for r in results["service"]])
    events = median([r["events_per_s"] for r in results["service"]])
    posts = median([r["requests_per_s"] for r in results["service"]])
    p99 = median([r["p99_ms"] for r in results["service"]])
    raw = median([r["tx_per_s"] for r in results["baseline"]])
    raw_label = (
        "raw asyncpg tx/s (8 conns)"
        if db.is_postgres
        else "raw sqlite3 tx/s (1 writer)"
    )
    client_events = median([r["events_per_s"] for r in results["client"]])
    client_posts = median([r["requests_per_s"] for r in results["client"]])
    compared = []
    for name, figure in (
        ("checkpoints/s", checkpoints),
        ("event rows/s", events),
        ("event rows/s, aiohttp client", client_events),
    ):
        r = ratio(figure, raw)
        goal, met = (
            ("≥ 0.60", r is not None and r >= 0.60)
            if db.is_postgres
            else ("— (PG goal)", None)
        )
        compared.append(
            Line("writes", f"{name} vs {raw_label}", figure, raw, r, goal, met, "/s")
        )
    if "floor" in results:
        # Where the service's own work leaves the row: the bare HTTP writer is the
        # same client's writers committing the same text, and nothing else.
        floor = median([r["events_per_s"] for r in results["floor"]])
        floor_cpu = median([r["server_cpu_per_post_us"] for r in results["floor"]])
        client_cpu = median([r["server_cpu_per_post_us"] for r in results["client"]])
        compared += [
            Line(
                "writes",
                f"bare HTTP writer rows/s, aiohttp client vs {raw_label}",
                floor,
                raw,
                ratio(floor, raw),
            ),
            Line(
                "writes",
                "event rows/s, aiohttp client vs bare HTTP writer rows/s",
                client_events,
                floor,
                ratio(client_events, floor),
            ),
        ]
        db.notes.append(
            f"writes: the bare HTTP writer (bench/baselines/http_writes.py) spends "
            f"{floor_cpu:.0f} µs of its core per POST where the service spends "
            f"{client_cpu:.0f} µs, under the same aiohttp client"
        )
    return [
        *compared,
        Line(
            "writes",
            f"POST req/s, {profile.writers} writers",
            posts,
            unit="req/s",
            compared=False,
        ),
        Line(
            "writes",
            f"POST req/s, {profile.writers} writers, aiohttp client",
            client_posts,
            unit="req/s",
            compared=False,
        ),
        Line(
            "writes",
            f"POST p99 ms, {profile.writers} writers",
            p99,
            unit="ms",
            compared=False,
        ),
    ]


# ---- fan-out -----------------------------------------------------------------------------


def stream_path(session: str, stream: str) -> str:
    if stream == "mutation":
        return f"/v1/sessions/{session}/messages/stream"
    return f"/v1/sessions/{session}/sse?{SSE_TYPES}"


async def fanout_service(db: Database, server: Proc, stream: str) -> FanoutResult:
    """One turn of `deltas` deltas at 50/s to `subscribers` subscribers of a new
    session, counted from its first delta: the first turn after the streams opened,
    as a user sees it (no warm-up turn to pay for the start)."""
    profile = db.profile
    api = db.api(server)
    probe: Probe | None = None
    subs: Subscribers | None = None
    try:
        session = await api.create_session("fanout")
        probe = Probe(server.url, f"/v1/sessions/{session}/sse?{SSE_TYPES}", db.auth)
        await probe.start()
        turn_seconds = profile.deltas * DELTA_INTERVAL_MS / 1000
        subs = await Subscribers.start(
            url=server.url,
            path=stream_path(session, stream),
            headers=db.auth,
            total=profile.subscribers,
            expected=profile.deltas,
            pin=db.pinning.load,
            log_dir=db.tmp / "logs",
            run_timeout=turn_seconds * 4 + 180,
            interval_ms=DELTA_INTERVAL_MS,
        )
        await subs.connect(60 + profile.subscribers / 20)
        await asyncio.sleep(profile.settle / 2)
        await api.post_message(session, f"/scenario long {profile.deltas}")
        if not await probe.wait_completed(1, turn_seconds * 3 + 30):
            raise BenchError("the measured turn did not complete in time")
        await subs.wait("complete", profile.grace)
        ts_map = probe.write_map(db.tmp) if stream == "mutation" else None
        merged = await subs.finish(ts_map)
        pace = probe.pace(DELTA_INTERVAL_MS / 1000)
        result = fanout_result(merged, profile.subscribers, profile.deltas, pace)
        if probe.delta_count() != profile.deltas:
            db.notes.append(
                f"fanout-{stream}: the probe saw {probe.delta_count()} of {profile.deltas} deltas"
            )
        return result
    finally:
        if subs is not None:
            await subs.close()
        if probe is not None:
            await probe.close()
        await api.close()


async def fanout_baseline(db: Database, proc: Proc, shape: str) -> FanoutResult:
    profile = db.profile
    turn_seconds = profile.deltas * DELTA_INTERVAL_MS / 1000
    subs = await Subscribers.start(
        url=proc.url,
        path=f"/stream?shape={shape}",
        headers=db.auth,
        total=profile.subscribers,
        expected=profile.deltas,
        pin=db.pinning.load,
        log_dir=db.tmp / "logs",
        run_timeout=turn_seconds * 4 + 180,
        interval_ms=DELTA_INTERVAL_MS,
    )
    try:
        await subs.connect(60 + profile.subscribers / 20)
        await asyncio.sleep(profile.settle / 2)
        async with httpx.AsyncClient(
            base_url=proc.url, timeout=turn_seconds * 3 + 30
        ) as client:
            published = await client.post(
                f"/publish?n={profile.deltas}&interval_ms={DELTA_INTERVAL_MS}&shape={shape}"
            )
            published.raise_for_status()
        seconds = float(published.json()["seconds"])
        pace = turn_seconds / seconds if seconds > 0 else math.nan
        await subs.wait("complete", profile.grace)
        merged = await subs.finish()
        return fanout_result(merged, profile.subscribers, profile.deltas, pace)
    finally:
        await subs.close()


def fanout_lines(row: str, results: dict[str, list[FanoutResult]]) -> list[Line]:
    def med(name: str, attr: str) -> float:
        return median([getattr(r, attr) for r in results[name]])

    def versus(
        label: str,
        attr: str,
        unit: str,
        goal: str = "—",
        met: Callable[[float, float], bool] | None = None,
        baseline: str = "raw",
    ) -> Line:
        """The service's median of `attr` against a baseline's."""
        ours, theirs = med("service", attr), med(baseline, attr)
        return Line(
            row,
            label,
            ours,
            theirs,
            ratio(ours, theirs),
            goal,
            met(ours, theirs) if met is not None else None,
            unit,
        )

    def worst_lost(name: str) -> float:
        return float(max(r.lost for r in results[name]))

    s_lost = worst_lost("service")
    return [
        versus(
            "p99 ms from the model's schedule vs hand-written (≤ and 0 lost)",
            "scheduled_p99_ms",
            "ms",
            "≤ 1.00",
            lambda ours, theirs: (
                not math.isnan(ours) and ours <= theirs and s_lost == 0
            ),
        ),
        versus(
            "p99 ms from the schedule vs sse-starlette",
            "scheduled_p99_ms",
            "ms",
            baseline="sse-starlette",
        ),
        versus("p50 ms from the schedule vs hand-written", "scheduled_p50_ms", "ms"),
        versus("p99 ms from the delta's ts vs hand-written", "p99_ms", "ms"),
        versus(
            "first 50 deltas: p50 ms vs hand-written (≤ 50 ms)",
            "early_p50_ms",
            "ms",
            "≤ 50 ms",
            lambda ours, _: ours <= 50,
        ),
        versus("first 50 deltas: max ms vs hand-written", "early_max_ms", "ms"),
        versus(
            "turn pace: share of the model's vs hand-written (≥ 0.95)",
            "pace",
            "share",
            "≥ 0.95",
            lambda ours, _: ours >= 0.95,
        ),
        versus("delivered deltas/s vs hand-written", "deltas_per_s", "/s"),
        Line(
            row,
            "lost deltas (worst run) vs hand-written",
            s_lost,
            worst_lost("raw"),
            None,
            "0",
            s_lost == 0,
            "",
        ),
    ]


async def row_fanout(
    db: Database, server: Proc, stream: str, baselines: dict[str, Proc]
) -> list[Line]:
    row = f"fanout-{stream}"
    results = await side_by_side(
        {
            "service": lambda: fanout_service(db, server, stream),
            "raw": lambda: fanout_baseline(db, baselines["raw"], stream),
            "sse-starlette": lambda: fanout_baseline(
                db, baselines["sse-starlette"], stream
            ),
        },
        db.profile.runs,
    )
    db.details[row] = {
        name: [r.as_dict() for r in runs] for name, runs in results.items()
    }
    db.notes.append(
        f"{row}: sse-starlette lost (worst run) {max(r.lost for r in results['sse-starlette'])}, "
        f"{db.profile.subscribers} subscribers x {db.profile.deltas} deltas"
    )
    return fanout_lines(row, results)


# ---- idle streams ------------------------------------------------------------------------


async def open_idle(
    db: Database, proc: Proc, path: str, count: int
) -> tuple[Subscribers, int]:
    subs = await Subscribers.start(
        url=proc.url,
        path=path,
        headers=db.auth,
        total=count,
        expected=0,
        pin=db.pinning.load,
        log_dir=db.tmp / "logs",
        run_timeout=300,
    )
    try:
        await subs.connect(60 + count / 20)
    except BenchError:
        await subs.close()
        raise
    return subs, subs.connected()


async def idle_rss(db: Database, proc: Proc, path: str) -> float:
    """Server RSS growth per open idle stream, in KB. A few streams are opened and closed
    first, so one-time allocations (imports, first buffers) are not charged to them."""
    profile = db.profile
    warm, _ = await open_idle(db, proc, path, min(20, profile.idle_streams))
    await warm.finish()
    await asyncio.sleep(profile.settle)
    before = proc.rss_kb()
    subs, connected = await open_idle(db, proc, path, profile.idle_streams)
    try:
        await asyncio.sleep(profile.settle)
        after = proc.rss_kb()
    finally:
        await subs.finish()
    if connected < profile.idle_streams:
        raise BenchError(f"only {connected}/{profile.idle_streams} idle streams opened")
    return (after - before) / connected


IDLE_TARGETS = ("service", "raw", "sse-starlette")


async def idle_process(db: Database, target: str) -> tuple[Proc, str]:
    """A process of its own and the stream path to open on it."""
    if target == "service":
        proc = await start_service(db.config, "service-idle", db.pinning.server, {})
        api = db.api(proc)
        try:
            return proc, stream_path(await api.create_session("idle"), "mutation")
        finally:
            await api.close()
    module = "fanout_raw" if target == "raw" else "fanout_sse_starlette"
    proc = await start_baseline(
        f"idle-{target}",
        f"bench.baselines.{module}",
        [],
        db.pinning.server,
        db.tmp / "logs",
    )
    return proc, "/stream"


async def row_idle_rss(db: Database) -> list[Line]:
    """Every run measures fresh processes (started together, measured one at a time):
    memory a process freed after earlier streams is reused by later ones and would
    hide their cost."""
    results: dict[str, list[float]] = {target: [] for target in IDLE_TARGETS}
    for run in range(db.profile.runs):
        started = await asyncio.gather(
            *(idle_process(db, t) for t in IDLE_TARGETS), return_exceptions=True
        )
        try:
            for item in started:
                if isinstance(item, BaseException):
                    raise item
            processes = dict(zip(IDLE_TARGETS, started, strict=True))
            shift = run % len(IDLE_TARGETS)
            for target in IDLE_TARGETS[shift:] + IDLE_TARGETS[:shift]:
                proc, path = cast(tuple[Proc, str], processes[target])
                results[target].append(await idle_rss(db, proc, path))
        finally:
            for item in started:
                if not isinstance(item, BaseException):
                    await item[0].stop()
    db.details["idle-rss"] = {**results, "streams": db.profile.idle_streams}
    service, raw, lib = (
        median(results["service"]),
        median(results["raw"]),
        median(results["sse-starlette"]),
    )
    return [
        Line(
            "idle-rss",
            f"KB per idle Mutation stream ({db.profile.idle_streams}) vs hand-written",
            service,
            raw,
            ratio(service, raw),
            "≤ 20 KB",
            service <= 20,
            "KB",
        ),
        Line(
            "idle-rss",
            "KB per idle stream vs sse-starlette",
            service,
            lib,
            ratio(service, lib),
            unit="KB",
        ),
    ]


# ---- one worker vs two -------------------------------------------------------------------


async def row_workers(db: Database) -> list[Line]:
    if not await supports_workers(db.config):
        return [
            Line("workers", "page req/s, 2 workers vs 1", note="n/a (not supported)"),
            Line(
                "workers",
                "fanout-mutation p99 ms, 2 workers vs 1",
                note="n/a (not supported)",
            ),
        ]
    env = {"SCRIPTED_DELAY_MS": str(DELTA_INTERVAL_MS)}
    # Unpinned: two workers need both cores; the load generators stay on theirs.
    one = await db.service("service-1w", db.pinning.all_cores, **env)
    two = await start_service(
        db.config, "service-2w", db.pinning.all_cores, env, workers=2
    )
    db.procs.append(two)
    if db.page_session is None:
        raise BenchError("no seeded session to page")
    path = f"/v1/sessions/{db.page_session}/messages?limit=50"
    pages = await wrk_targets(db, {"2w": two.url + path, "1w": one.url + path}, db.auth)
    fanouts = await side_by_side(
        {
            "2w": lambda: fanout_service(db, two, "mutation"),
            "1w": lambda: fanout_service(db, one, "mutation"),
        },
        db.profile.runs,
    )
    db.details["workers"] = {
        "page": wrk_details(pages),
        "fanout-mutation": {k: [r.as_dict() for r in v] for k, v in fanouts.items()},
    }
    two_rate, one_rate = rates(pages["2w"]), rates(pages["1w"])
    two_p99 = median([r.scheduled_p99_ms for r in fanouts["2w"]])
    one_p99 = median([r.scheduled_p99_ms for r in fanouts["1w"]])
    lost = max(r.lost for r in fanouts["2w"])
    if lost:
        db.notes.append(f"workers: 2 workers lost {lost} deltas in the worst run")
    return [
        Line(
            "workers",
            "page req/s, 2 workers vs 1",
            two_rate,
            one_rate,
            ratio(two_rate, one_rate),
            unit="req/s",
        ),
        Line(
            "workers",
            "fanout-mutation p99 ms, 2 workers vs 1",
            two_p99,
            one_p99,
            ratio(two_p99, one_p99),
            unit="ms",
        ),
    ]


# ---- a database's run --------------------------------------------------------------------


def failed(row: str, error: BaseException) -> Line:
    message = str(error) or type(error).__name__
    return Line(row, "", note=f"FAILED: {message[:300]}", failed=True)


async def guarded(
    db: Database,
    row: str,
    lines: list[Line],
    run: Callable[[], Awaitable[list[Line]]],
) -> None:
    started = time.monotonic()
    try:
        lines.extend(await run())
    except Exception as exc:
        # A row fails alone; its line says why and the other rows still run.
        lines.append(failed(row, exc))
    db.timings[row] = round(time.monotonic() - started, 1)


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


async def cleanup_dir(path: Path) -> None:
    import shutil

    with contextlib.suppress(OSError):
        await asyncio.to_thread(shutil.rmtree, path)
