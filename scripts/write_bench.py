"""Write benchmark: durable checkpoints per second under 64 concurrent writers, against
raw asyncpg write transactions measured in the same run.

    python scripts/write_bench.py [--pg-url postgresql+asyncpg://postgres@127.0.0.1:5432/postgres]
        [--app-dir DIR ...] [--seconds 10] [--connections 64]

For each `--app-dir` (default: this checkout; pass an unpacked older tree to compare) a
`python -m app serve` from that tree runs on a scratch database (`evm_bench_<hex>`,
dropped at the end) pinned to CPU 1, and `wrk` pinned to CPU 0 POSTs a user message
from each of 64 connections. wrk's Lua API has no per-connection hook, so requests go
round-robin over 64 sessions (a connection's next request goes to the next session in
turn). A checkpoint is a revision of a message or a turn outcome: the difference of
`sum(messages.revision) + count(turn.completed|failed|cancelled)` over the run. The
baseline is 8 asyncpg connections on CPU 1 doing `BEGIN; UPDATE counter ... RETURNING;
INSERT a ~500-byte row; COMMIT` for the same time. Needs `wrk` and `taskset`.
"""

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from faultkit import (
    ROOT,
    asyncpg_dsn,
    free_port,
    pg_admin,
    with_database,
)

SESSIONS = 64
BODY = (
    '{"message":{"content":[{"type":"text","text":"hello from a benchmark writer"}]}}'
)
COUNT_SQL = """
SELECT (SELECT coalesce(sum(revision), 0) FROM messages)
     + (SELECT count(*) FROM events
        WHERE type IN ('turn.completed', 'turn.failed', 'turn.cancelled'))
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lua_script(session_ids: list[str]) -> str:
    ids = ", ".join(f'"{sid}"' for sid in session_ids)
    return f"""
local sessions = {{{ids}}}
local n = 0
local body = '{BODY}'
request = function()
  n = n % #sessions + 1
  return wrk.format("POST", "/v1/sessions/" .. sessions[n] .. "/messages",
                    {{["Content-Type"] = "application/json"}}, body)
end
"""


async def raw_baseline(dsn: str, seconds: float, connections: int = 8) -> float:
    """Transactions per second of the plain write transaction, over `connections`."""
    setup = await asyncpg.connect(dsn)
    await setup.execute(
        "CREATE TABLE bench_counter (id int PRIMARY KEY, n int NOT NULL);"
        "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, k int, n int, body text);"
    )
    await setup.executemany(
        "INSERT INTO bench_counter VALUES ($1, 0)", [(i,) for i in range(connections)]
    )
    await setup.close()
    payload = "x" * 500
    done = 0
    deadline = time.monotonic() + seconds

    async def worker(key: int) -> None:
        nonlocal done
        conn = await asyncpg.connect(dsn)
        try:
            while time.monotonic() < deadline:
                async with conn.transaction():
                    n = await conn.fetchval(
                        "UPDATE bench_counter SET n = n + 1 WHERE id = $1 RETURNING n",
                        key,
                    )
                    await conn.execute(
                        "INSERT INTO bench_rows (k, n, body) VALUES ($1, $2, $3)",
                        key,
                        n,
                        payload,
                    )
                done += 1
        finally:
            await conn.close()

    started = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(connections)))
    return done / (time.monotonic() - started)


def parse_wrk(output: str) -> dict[str, float]:
    def value(pattern: str) -> str:
        match = re.search(pattern, output)
        assert match is not None, f"no {pattern!r} in wrk's output:\n{output}"
        return match.group(1)

    def millis(text: str) -> float:
        number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
        return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    return {
        "rps": float(value(r"Requests/sec:\s+([\d.]+)")),
        "p50": millis(value(r"\s50%\s+(\S+)")),
        "p99": millis(value(r"\s99%\s+(\S+)")),
        "non2xx": float(non2xx.group(1)) if non2xx else 0.0,
    }


async def bench_app(
    app_dir: Path, pg_url: str, seconds: float, connections: int
) -> dict[str, float]:
    name = f"evm_bench_{uuid.uuid4().hex[:8]}"
    await pg_admin(pg_url, f'CREATE DATABASE "{name}"')
    url = with_database(pg_url, name)
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="evm_write_bench_"))
    env = {
        **os.environ,
        "PYTHONPATH": str(app_dir),
        "DATABASE_URL": url,
        "AUTO_MIGRATE": "true",
        "RATE_LIMIT_PER_SECOND": "0",
        "LOG_LEVEL": "warning",
    }
    with (workdir / "server.log").open("wb") as log:
        server = await asyncio.create_subprocess_exec(
            *("taskset", "-c", "1", sys.executable, "-m", "app", "serve"),
            *("--port", str(port)),
            cwd=app_dir,
            env=env,
            stdout=log,
            stderr=log,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            for _ in range(300):
                try:
                    if (await http.get("/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    await asyncio.sleep(0.1)
            ids = []
            for index in range(SESSIONS):
                response = await http.post("/v1/sessions", json={"title": f"w{index}"})
                ids.append(response.json()["id"])
        script = workdir / "post.lua"
        script.write_text(lua_script(ids))
        db = await asyncpg.connect(asyncpg_dsn(url))
        before, t0 = await db.fetchval(COUNT_SQL), time.monotonic()
        cpu0 = cpu_seconds(server.pid)
        wrk = await asyncio.create_subprocess_exec(
            *("taskset", "-c", "0", "wrk", "-t1", f"-c{connections}"),
            *(f"-d{seconds:g}s", "--latency", "-s", str(script), base),
            stdout=asyncio.subprocess.PIPE,
        )
        output, _ = await wrk.communicate()
        after, t1 = await db.fetchval(COUNT_SQL), time.monotonic()
        cpu1 = cpu_seconds(server.pid)
        statuses = {
            r["status"]: r["n"]
            for r in await db.fetch(
                "SELECT status, count(*) AS n FROM sessions GROUP BY status"
            )
        }
        turns = await db.fetchval(
            "SELECT count(*) FROM events WHERE type = 'turn.completed'"
        )
        await db.close()
        result = parse_wrk(output.decode())
        result["checkpoints"] = (after - before) / (t1 - t0)
        result["server_cpu"] = (cpu1 - cpu0) / (t1 - t0)
        result["turns_completed"] = float(turns)
        result["sessions_active"] = float(statuses.get("active", 0))
        return result
    finally:
        server.terminate()
        try:
            await asyncio.wait_for(server.wait(), 10)
        except TimeoutError:
            server.kill()
        await pg_admin(pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--pg-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--app-dir", action="append", type=Path)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    name = f"evm_bench_raw_{uuid.uuid4().hex[:8]}"
    await pg_admin(args.pg_url, f'CREATE DATABASE "{name}"')
    try:
        dsn = asyncpg_dsn(with_database(args.pg_url, name))
        os.sched_setaffinity(0, {1})
        raw = await raw_baseline(dsn, args.seconds)
        os.sched_setaffinity(0, {0, 1})
    finally:
        await pg_admin(args.pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"raw asyncpg (8 connections, CPU 1): {raw:,.0f} tx/s")
    for app_dir in args.app_dir or [ROOT]:
        r = await bench_app(
            app_dir.resolve(), args.pg_url, args.seconds, args.connections
        )
        print(
            f"{app_dir}: {r['checkpoints']:,.0f} checkpoints/s"
            f" ({r['checkpoints'] / raw:.0%} of raw); POST {r['rps']:,.0f} req/s,"
            f" p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms,"
            f" non-2xx {r['non2xx']:.0f}; turns completed {r['turns_completed']:.0f},"
            f" sessions active at the end {r['sessions_active']:.0f}/{SESSIONS};"
            f" server CPU {r['server_cpu']:.0%}"
        )


if __name__ == "__main__":
    asyncio.run(main())
