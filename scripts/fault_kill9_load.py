"""Fault: the server is SIGKILLed again and again under write load.

Concurrent writers post messages (each starts or steers a turn, so the runner commits
checkpoints all the time) against one server process. At random moments the process is
killed with SIGKILL, aimed at an open write transaction: on PostgreSQL the kill waits
until `pg_stat_activity` shows one of the server's connections holding a transaction
id; on SQLite until a probe `BEGIN IMMEDIATE` from this script finds the write lock
taken. The server is restarted on the same database each time (start-up recovery closes
interrupted turns). Writers retry a post that got no answer with the same
`client_message_id`, so every message is eventually acknowledged exactly once.

At the end the database is read directly and checked:
* no partial message: every message is `done`, its snapshot is valid JSON that agrees
  with its row (id, revision, state);
* per-session event sequences are dense 1..last_sequence, no gap, no duplicate, and
  every turn that started has exactly one terminal event;
* every message acknowledged with 2xx is present (same id for its client_message_id).

    .venv/bin/python scripts/fault_kill9_load.py --database sqlite|postgresql
        [--kills 6] [--writers 16] [--pg-url postgresql+asyncpg://postgres@127.0.0.1:5432/postgres]

On PostgreSQL it creates a database `evm_fault_<hex>` on the given server and drops it
at the end. Exit status 0 when every check passes.
"""

import argparse
import asyncio
import json
import random
import sqlite3
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from faultkit import (
    ServerProcess,
    add_database_options,
    asyncpg_dsn,
    run_with_server,
    text_body,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

TEXTS = (
    "/scenario long 30",
    "an echo of a few words",
    "/scenario tool the weather",
    "/scenario reasoning",
)


@dataclass
class Load:
    acknowledged: dict[str, tuple[str, str]] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    deliveries: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def writer(index: int, base_url: str, load: Load) -> None:
    """Posts to its own session; a post without an answer is retried with the same
    client_message_id until it is acknowledged."""
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        session_id = None
        while session_id is None:
            try:
                response = await http.post(
                    "/v1/sessions", json={"title": f"k9 {index}"}
                )
                if response.status_code == 201:
                    session_id = response.json()["id"]
                    continue
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
        n = 0
        while not load.stop.is_set():
            n += 1
            cmid = f"k9-{index}-{n}"
            body = text_body(TEXTS[n % len(TEXTS)], cmid)
            while True:
                try:
                    response = await http.post(
                        f"/v1/sessions/{session_id}/messages", json=body
                    )
                except httpx.HTTPError as exc:
                    load.statuses[f"client:{type(exc).__name__}"] += 1
                    await asyncio.sleep(0.2)
                    continue
                load.statuses[str(response.status_code)] += 1
                if response.status_code == 201:
                    message = response.json()
                    load.acknowledged[cmid] = (session_id, message["id"])
                    load.deliveries[message["delivery"]] += 1
                    break
                if response.status_code >= 500 and response.status_code != 503:
                    load.unexpected.append(
                        f"{response.status_code} {response.text[:300]}"
                    )
                await asyncio.sleep(0.2)
            await asyncio.sleep(random.uniform(0.02, 0.1))


# ---- aiming the kill at an open write transaction --------------------------------------


def sqlite_write_in_flight(path: Path) -> bool:
    """True when another connection holds the write lock (a checkpoint transaction is
    open): our BEGIN IMMEDIATE with no busy timeout fails with 'database is locked'."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:
        return True
    else:
        conn.execute("ROLLBACK")
        return False
    finally:
        conn.close()


async def pg_write_in_flight(conn: asyncpg.Connection) -> bool:
    """True when one of the server's connections holds a transaction id (has written
    inside a transaction that has not ended)."""
    found = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = 'evermirror' "
        "AND backend_xid IS NOT NULL"
    )
    return bool(found)


# ---- checks on the database --------------------------------------------------------


def _hex(value: Any) -> str:
    return uuid.UUID(str(value)).hex


async def verify(database_url: str, load: Load) -> dict[str, Any]:
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            sessions = {
                _hex(row[0]): (row[1], row[2])
                for row in await conn.execute(
                    text("SELECT id, last_sequence, active_turn_id FROM sessions")
                )
            }
            events: dict[str, list[tuple[int, str, Any]]] = {}
            for sid, sequence, kind, turn in await conn.execute(
                text("SELECT session_id, sequence, type, turn_id FROM events")
            ):
                events.setdefault(_hex(sid), []).append((sequence, kind, turn))
            messages = list(
                await conn.execute(
                    text(
                        "SELECT id, session_id, sequence, state, revision, snapshot, "
                        "client_message_id FROM messages"
                    )
                )
            )
    finally:
        await engine.dispose()

    figures: dict[str, Any] = {"sessions": len(sessions), "messages": len(messages)}
    gaps = duplicates = 0
    unterminated = 0
    terminal: Counter[str] = Counter()
    for sid, (last, _) in sessions.items():
        sequences = sorted(s for s, _, _ in events.get(sid, []))
        duplicates += len(sequences) - len(set(sequences))
        gaps += len(set(range(1, last + 1)) - set(sequences))
        gaps += len({s for s in sequences if s > last})  # beyond the counter
        started = {t for _, k, t in events.get(sid, []) if k == "turn.started"}
        ended: Counter[Any] = Counter(
            t
            for _, k, t in events.get(sid, [])
            if k in ("turn.completed", "turn.failed", "turn.cancelled")
        )
        for _, k, _ in events.get(sid, []):
            if k in ("turn.completed", "turn.failed", "turn.cancelled"):
                terminal[k] += 1
        unterminated += sum(1 for t in started if ended[t] != 1)
    figures["event_gaps"] = gaps
    figures["event_duplicates"] = duplicates
    figures["turns_without_one_end"] = unterminated
    figures["turn_ends"] = dict(terminal)
    figures["active_turns_left"] = sum(1 for _, a in sessions.values() if a)

    partial = invalid = 0
    by_cmid: dict[str, str] = {}
    interrupted = 0
    for mid, sid, _sequence, state, revision, snapshot, cmid in messages:
        if state != "done":
            partial += 1
        try:
            wire = json.loads(snapshot)
            if (
                wire["id"] != "message_" + _hex(mid)
                or wire["revision"] != revision
                or wire["state"] != state
            ):
                invalid += 1
            if any(
                p.get("type") == "error" and p.get("code") == "interrupted"
                for p in wire["content"]
            ):
                interrupted += 1
        except (ValueError, KeyError, TypeError):
            invalid += 1
        if cmid is not None:
            by_cmid[f"{_hex(sid)}/{cmid}"] = "message_" + _hex(mid)
    figures["partial_messages"] = partial
    figures["invalid_snapshots"] = invalid
    figures["interrupted_messages"] = interrupted
    present = sum(
        1
        for cmid, (sid, mid) in load.acknowledged.items()
        if by_cmid.get(f"{sid.removeprefix('session_')}/{cmid}") == mid
    )
    figures["acknowledged"] = len(load.acknowledged)
    figures["present"] = present
    figures["lost"] = len(load.acknowledged) - present
    return figures


# ---- the run -----------------------------------------------------------------------


async def scenario(
    server: ServerProcess, args: argparse.Namespace, sqlite_path: Path | None
) -> bool:
    load = Load()
    writers = [
        asyncio.create_task(writer(i, server.url, load)) for i in range(args.writers)
    ]
    pg: asyncpg.Connection | None = None
    if sqlite_path is None:
        pg = await asyncpg.connect(asyncpg_dsn(server.database_url))
    kills: list[dict[str, Any]] = []
    rng = random.Random(args.seed)
    try:
        # Kill only once every writer has had a message acknowledged.
        while len(load.acknowledged) < args.writers:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        for _ in range(args.kills):
            await asyncio.sleep(rng.uniform(args.min_gap, args.max_gap))
            # Aim: poll until a write transaction is open, then kill at once.
            deadline = time.monotonic() + 5
            confirmed = False
            polls = 0
            while time.monotonic() < deadline:
                polls += 1
                if pg is not None:
                    confirmed = await pg_write_in_flight(pg)
                else:
                    assert sqlite_path is not None
                    confirmed = sqlite_write_in_flight(sqlite_path)
                if confirmed:
                    break
                await asyncio.sleep(0.001)
            acknowledged_before = len(load.acknowledged)
            server.sigkill()
            killed_at = time.monotonic()
            log_before = server.log_text().count("recovered interrupted turn")
            await asyncio.to_thread(server.start)
            restart = time.monotonic() - killed_at
            kills.append(
                {
                    "in_transaction": confirmed,
                    "polls": polls,
                    "restart_s": restart,
                    "acknowledged_so_far": acknowledged_before,
                    "log_before": log_before,
                }
            )
            print(
                f"kill {len(kills)}: SIGKILL {'inside an open write transaction' if confirmed else 'NOT confirmed inside a transaction'} "
                f"(after {polls} polls), {acknowledged_before} messages acknowledged so far, "
                f"server back in {restart:.2f} s"
            )
        await asyncio.sleep(2.0)
    finally:
        load.stop.set()
        await asyncio.wait_for(asyncio.gather(*writers), 120)
        if pg is not None:
            await pg.close()
    # Let every turn end (start-up recovery and the sweep close interrupted ones).
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            listed = (
                await http.get("/v1/sessions", params={"status": "active", "limit": 1})
            ).json()
            if listed["total"] == 0:
                break
            await asyncio.sleep(0.5)
    recovered = server.log_text().count("recovered interrupted turn")
    figures = await verify(server.database_url, load)

    print()
    lane = "sqlite" if sqlite_path is not None else "postgresql"
    print(
        f"SIGKILL under load on {lane}: {args.writers} writers, {len(kills)} kills "
        f"({sum(1 for k in kills if k['in_transaction'])} confirmed inside an open write "
        f"transaction), restarts took "
        f"{min(k['restart_s'] for k in kills):.2f}-{max(k['restart_s'] for k in kills):.2f} s"
    )
    print(
        f"requests: {dict(load.statuses)}; deliveries: {dict(load.deliveries)} "
        f"(duplicate = a retried post whose first attempt had committed before the kill)"
    )
    print(
        f"acknowledged {figures['acknowledged']}, present {figures['present']}, "
        f"lost {figures['lost']}"
    )
    print(
        f"messages {figures['messages']} in {figures['sessions']} sessions: partial "
        f"(not done) {figures['partial_messages']}, invalid snapshots "
        f"{figures['invalid_snapshots']}, closed as interrupted "
        f"{figures['interrupted_messages']}"
    )
    print(
        f"events: gaps {figures['event_gaps']}, duplicates {figures['event_duplicates']}; "
        f"turns without exactly one end {figures['turns_without_one_end']}, turn ends "
        f"{figures['turn_ends']}, active turns left {figures['active_turns_left']}; "
        f"'recovered interrupted turn' logged {recovered} times"
    )
    if load.unexpected:
        print(f"unexpected 5xx: {len(load.unexpected)}; first: {load.unexpected[0]}")
    ok = (
        figures["lost"] == 0
        and figures["partial_messages"] == 0
        and figures["invalid_snapshots"] == 0
        and figures["event_gaps"] == 0
        and figures["event_duplicates"] == 0
        and figures["turns_without_one_end"] == 0
        and figures["active_turns_left"] == 0
        and not load.unexpected
    )
    print("RESULT:", "PASS" if ok else "FAIL")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_options(parser)
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--min-gap", type=float, default=1.0)
    parser.add_argument("--max-gap", type=float, default=4.0)
    parser.add_argument("--delay-ms", type=int, default=5)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()
    env = {"SCRIPTED_DELAY_MS": str(args.delay_ms), "RUNNER_SWEEP_SECONDS": "1"}
    run_with_server(
        args,
        prefix="evm_fault_k9_",
        env=env,
        scenario=lambda server, sqlite_path: scenario(server, args, sqlite_path),
    )


if __name__ == "__main__":
    main()
