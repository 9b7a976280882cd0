"""Fault: PostgreSQL restarts under a running service.

A throwaway PostgreSQL 15 cluster of our own (initdb into a temp dir, a free port; the
shared server on 5432 is never touched) backs one evermirror server process. Turns
stream on several sessions, and each session has raw-socket clients on both streams
(`/sse` and the Mutation stream). Writers keep POSTing sessions and messages. Then
PostgreSQL is stopped (`pg_ctl stop -m fast`), left down for a few seconds, and started.

Checked and printed:
* while it is down, every write is 503 problem+json with Retry-After (never 500);
* after it is back the same server process recovers: writes succeed, the turns that were
  running when it stopped resume and complete (none fails), and new turns complete;
* half the stream clients drop their connection during the outage and are refused
  with 503 until PostgreSQL is back; the others stay connected and are told to resync.
  All resume from their own cursor (`Last-Event-ID` on `/sse`, `after=` on the
  Mutation stream) and converge: durable events equal GET .../events, merged snapshots
  equal GET .../messages;
* the bus listener reconnects: clients streaming after the restart see live deltas of
  new turns;
* every message acknowledged with 2xx is in the database and no message stays
  `streaming`.

    .venv/bin/python scripts/fault_pg_restart.py [--sessions 4] [--clients 2]
        [--writers 8] [--down-seconds 5]

Exit status 0 when every check passes.
"""

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from faultkit import (
    Frame,
    MutationView,
    ServerProcess,
    StreamRefused,
    ThrowawayCluster,
    all_messages,
    compare_view,
    exit_on_sigterm,
    median,
    migrate,
    pg_admin,
    raw_stream,
    run,
    text_body,
)

DELTA = b"output.message.delta"


@dataclass
class Clock:
    """Phases of the run; every request is tagged with the phase it started in."""

    t0: float = field(default_factory=time.monotonic)
    phase: str = "before"
    marks: dict[str, float] = field(default_factory=dict)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def mark(self, name: str) -> float:
        at = self.now()
        self.marks.setdefault(name, at)
        return at


@dataclass
class WriteLog:
    by_phase: dict[str, Counter[str]] = field(default_factory=dict)
    bad_503: list[str] = field(default_factory=list)
    five_hundreds: list[str] = field(default_factory=list)
    acknowledged: dict[str, str] = field(default_factory=dict)  # message id -> session
    seconds_503: list[float] = field(default_factory=list)

    def record(self, phase: str, outcome: str) -> None:
        self.by_phase.setdefault(phase, Counter())[outcome] += 1


# ---- stream clients ----------------------------------------------------------------


@dataclass
class StreamClient:
    """One raw-socket client that reconnects from its own cursor after every
    disconnect, as a browser EventSource would."""

    base_url: str
    session_id: str
    kind: str  # "sse" or "mutation"
    clock: Clock
    connects: int = 0
    disconnects: int = 0
    refused: Counter[int] = field(default_factory=Counter)
    resets: int = 0
    disconnecting: Counter[str] = field(default_factory=Counter)
    events: list[tuple[int, str]] = field(default_factory=list)  # (sequence, id)
    last_event_id: str | None = None
    view: MutationView = field(default_factory=MutationView)
    deltas: int = 0
    deltas_after_restart: int = 0
    first_delta_after_restart: float | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    bounce: asyncio.Event = field(default_factory=asyncio.Event)
    bounced: int = 0

    def _path(self) -> tuple[str, dict[str, str]]:
        if self.kind == "sse":
            if self.last_event_id is None:
                return f"/v1/sessions/{self.session_id}/sse?after_sequence=0", {}
            return f"/v1/sessions/{self.session_id}/sse", {
                "Last-Event-ID": self.last_event_id
            }
        cursor = self.view.cursor or "0"
        return f"/v1/sessions/{self.session_id}/messages/stream?after={cursor}", {}

    async def run(self, http: httpx.AsyncClient) -> None:
        while not self.stop.is_set():
            path, headers = self._path()
            reading = asyncio.create_task(self._read(path, headers, http))
            bounce = asyncio.create_task(self.bounce.wait())
            await asyncio.wait({reading, bounce}, return_when=asyncio.FIRST_COMPLETED)
            if bounce.done():
                # Drop the connection, as a client whose network blinks would.
                self.bounce.clear()
                self.bounced += 1
                reading.cancel()
            else:
                bounce.cancel()
            try:
                await reading
            except StreamRefused as exc:
                self.refused[exc.status] += 1
                if exc.status == 503 and not (
                    exc.headers.get("content-type", "").startswith(
                        "application/problem+json"
                    )
                    and "retry-after" in exc.headers
                ):
                    self.refused[-503] += 1
                await asyncio.sleep(0.5)
                continue
            except (
                OSError,
                asyncio.IncompleteReadError,
                asyncio.LimitOverrunError,
                asyncio.CancelledError,
            ):
                pass
            except TimeoutError:
                self.refused[0] += 1
            self.disconnects += 1
            await asyncio.sleep(0.1)

    async def _read(
        self, path: str, headers: dict[str, str], http: httpx.AsyncClient
    ) -> None:
        async with raw_stream(self.base_url, path, headers) as frames:
            self.connects += 1
            async for frame in frames:
                await self._on_frame(frame, http)

    async def _on_frame(self, frame: Frame, http: httpx.AsyncClient) -> None:
        if frame.event in (DELTA, b"delta"):
            self.deltas += 1
            if "restarted" in self.clock.marks:
                self.deltas_after_restart += 1
                if self.first_delta_after_restart is None:
                    self.first_delta_after_restart = self.clock.now()
            return
        if frame.event == b"disconnecting":
            self.disconnecting[orjson.loads(frame.data)["reason"]] += 1
            return
        if self.kind == "sse":
            if frame.id is not None:
                body = orjson.loads(frame.data)
                self.events.append((body["sequence"], frame.id))
                self.last_event_id = frame.id
            return
        if frame.event == b"reset":
            # The server cannot continue from our cursor: reload the snapshot.
            self.resets += 1
            messages, cursor = await all_messages(http, self.session_id)
            for message in messages:
                self.view.merge(message)
            self.view.cursor = cursor
            return
        self.view.apply(frame)

    def converged(self, events: list[dict[str, Any]], messages: list[Any]) -> list[str]:
        if self.kind == "sse":
            seen: list[str] = []
            for _, event_id in self.events:
                if event_id not in seen:
                    seen.append(event_id)
            truth = [e["id"] for e in events]
            problems = []
            if seen != truth:
                problems.append(
                    f"events differ: {len(seen)} seen vs {len(truth)} stored "
                    f"(missing {len(set(truth) - set(seen))})"
                )
            duplicates = len(self.events) - len(seen)
            if duplicates:
                problems.append(f"{duplicates} duplicate events")
            return problems
        return compare_view(self.view.messages, messages)


# ---- writers -----------------------------------------------------------------------


async def writer(
    index: int,
    http: httpx.AsyncClient,
    clock: Clock,
    log: WriteLog,
    stop: asyncio.Event,
) -> None:
    """Posts a message to its own session every 0.1 s (the first starts a turn, the rest
    steer it, so turns stay bounded by the number of writers) and every fifth time
    creates a session instead."""
    session_id: str | None = None
    n = 0
    while not stop.is_set():
        n += 1
        phase = clock.phase
        create_session = session_id is None or n % 5 == 0
        started = time.monotonic()
        try:
            if create_session:
                response = await http.post("/v1/sessions", json={"title": f"w{index}"})
            else:
                response = await http.post(
                    f"/v1/sessions/{session_id}/messages",
                    json=text_body(f"writer {index} says {n}", f"w{index}-{n}"),
                )
        except httpx.HTTPError as exc:
            log.record(phase, f"client:{type(exc).__name__}")
            await asyncio.sleep(0.2)
            continue
        status = response.status_code
        log.record(phase, str(status))
        if status == 503:
            log.seconds_503.append(time.monotonic() - started)
            problem = response.headers.get("content-type", "").startswith(
                "application/problem+json"
            )
            if not problem or "retry-after" not in response.headers:
                log.bad_503.append(f"{response.headers} {response.text[:200]}")
        elif status >= 500:
            log.five_hundreds.append(f"{status} {response.text[:300]}")
        elif 200 <= status < 300:
            if "restarted" in clock.marks:
                clock.mark("first_2xx_after_restart")
            body = response.json()
            if session_id is None:
                session_id = body["id"]
            elif not create_session:
                log.acknowledged[body["id"]] = body["session_id"]
        await asyncio.sleep(0.1)


# ---- the scenario ------------------------------------------------------------------


async def wait_idle(
    http: httpx.AsyncClient, session_ids: list[str], within: float
) -> list[str]:
    """Poll until every session is idle; returns the ones that are not."""
    deadline = time.monotonic() + within
    pending = list(session_ids)
    while pending and time.monotonic() < deadline:
        still = []
        for session_id in pending:
            try:
                response = await http.get(f"/v1/sessions/{session_id}")
                if response.status_code != 200 or response.json()["status"] != "idle":
                    still.append(session_id)
            except httpx.HTTPError:
                still.append(session_id)
        pending = still
        if pending:
            await asyncio.sleep(0.25)
    return pending


async def scenario(
    server: ServerProcess, cluster: ThrowawayCluster, args: argparse.Namespace
) -> bool:
    clock = Clock()
    log = WriteLog()
    ok = True
    async with httpx.AsyncClient(
        base_url=server.url,
        timeout=httpx.Timeout(15.0),
        limits=httpx.Limits(max_connections=64),
    ) as http:
        sessions = []
        for i in range(args.sessions):
            response = await http.post("/v1/sessions", json={"title": f"stream {i}"})
            response.raise_for_status()
            sessions.append(response.json()["id"])
        clients = [
            StreamClient(server.url, sid, kind, clock)
            for sid in sessions
            for kind in ("sse", "mutation")
            for _ in range(args.clients)
        ]
        client_tasks = [asyncio.create_task(c.run(http)) for c in clients]
        await asyncio.sleep(1.0)
        for sid in sessions:
            response = await http.post(
                f"/v1/sessions/{sid}/messages",
                json=text_body(f"/scenario long {args.deltas}"),
            )
            response.raise_for_status()
        stop_writers = asyncio.Event()
        writer_tasks = [
            asyncio.create_task(writer(i, http, clock, log, stop_writers))
            for i in range(args.writers)
        ]
        # Let deltas flow, then take PostgreSQL away in the middle of the turns.
        deadline = time.monotonic() + 20
        while sum(c.deltas for c in clients) < 10 * len(clients):
            if time.monotonic() > deadline:
                print("streams never started")
                return False
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        clock.phase = "outage"
        stopped_at = clock.mark("stop")
        print(f"[{stopped_at:6.2f}s] pg_ctl stop -m fast")
        await asyncio.to_thread(cluster.stop, "fast")
        clock.mark("down")
        # Half the clients lose their connection while the database is down: they must
        # be refused cleanly (503) and resume from their cursor once it is back.
        for c in clients[::2]:
            c.bounce.set()
        await asyncio.sleep(args.down_seconds)
        clock.phase = "restarting"
        print(f"[{clock.now():6.2f}s] pg_ctl start")
        await asyncio.to_thread(cluster.start)
        restarted_at = clock.mark("restarted")
        clock.phase = "after"
        print(f"[{restarted_at:6.2f}s] PostgreSQL accepting connections again")

        # Recovery: the first acknowledged write, and a brand-new turn that completes.
        deadline = time.monotonic() + 60
        while "first_2xx_after_restart" not in clock.marks:
            if time.monotonic() > deadline:
                print("no write succeeded within 60 s of the restart")
                ok = False
                break
            await asyncio.sleep(0.05)
        probe_turn_started = clock.now()
        probe = await http.post("/v1/sessions", json={"title": "after restart"})
        probe_sid = probe.json()["id"]
        probe_client = StreamClient(server.url, probe_sid, "sse", clock)
        probe_task = asyncio.create_task(probe_client.run(http))
        await asyncio.sleep(0.5)
        await http.post(
            f"/v1/sessions/{probe_sid}/messages", json=text_body("/scenario long 30")
        )
        if await wait_idle(http, [probe_sid], 60):
            print("the first turn after the restart did not complete")
            ok = False
        clock.mark("first_turn_completed")
        probe_turn_seconds = clock.now() - probe_turn_started

        # The turns running when PostgreSQL stopped resume and complete; then every
        # stream session gets a new turn, whose deltas its resumed clients must see live.
        not_idle = await wait_idle(http, sessions, 60)
        if not_idle:
            print(f"sessions still active 60 s after the restart: {not_idle}")
            ok = False
            if args.pause_on_failure:
                print("pausing 300 s for inspection")
                await asyncio.sleep(300)
        clock.mark("interrupted_turns_resumed")
        for sid in sessions:
            await http.post(
                f"/v1/sessions/{sid}/messages", json=text_body("/scenario long 30")
            )
        await asyncio.sleep(2.0)
        stop_writers.set()
        await asyncio.gather(*writer_tasks)
        writer_sessions = sorted(set(log.acknowledged.values()))
        leftover = await wait_idle(http, [*sessions, *writer_sessions, probe_sid], 60)
        if leftover:
            print(f"sessions still active at the end: {leftover}")
            ok = False

        # Convergence: give each client a moment to read the tail, then compare.
        truth: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        for sid in [*sessions, probe_sid]:
            events = (await http.get(f"/v1/sessions/{sid}/events")).json()["data"]
            messages, _ = await all_messages(http, sid)
            truth[sid] = (events, messages)
        everyone = [*clients, probe_client]
        deadline = time.monotonic() + 20
        while True:
            problems = {
                id(c): c.converged(*truth[c.session_id])
                for c in everyone
                if c.converged(*truth[c.session_id])
            }
            if not problems or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        for c in everyone:
            c.stop.set()
        for task in [*client_tasks, probe_task]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        # Durability: every acknowledged message is stored; none is left streaming.
        present = 0
        streaming = 0
        outcomes: Counter[str] = Counter()
        for sid in sorted({*log.acknowledged.values(), *sessions, probe_sid}):
            messages, _ = await all_messages(http, sid)
            ended = await http.get(
                f"/v1/sessions/{sid}/events",
                params=[("types", "turn.completed"), ("types", "turn.failed")],
            )
            for event in ended.json()["data"]:
                outcomes[
                    event["type"]
                    + (
                        f" ({event['data']['error_code']})"
                        if "error_code" in event["data"]
                        else ""
                    )
                ] += 1
            ids = {m["id"] for m in messages}
            present += sum(
                1 for mid, s in log.acknowledged.items() if s == sid and mid in ids
            )
            streaming += sum(1 for m in messages if m["state"] != "done")

    # ---- report ----------------------------------------------------------------------
    marks = clock.marks
    print()
    print(
        f"PostgreSQL restart fault: {args.sessions} streaming sessions x "
        f"{args.clients} clients per stream, {args.writers} writers, "
        f"down {args.down_seconds:.0f} s (stop took "
        f"{marks['down'] - marks['stop']:.2f} s, start took "
        f"{marks['restarted'] - marks['down'] - args.down_seconds:.2f} s)"
    )
    print("requests by phase and status (client: = no HTTP answer):")
    for phase in ("before", "outage", "restarting", "after"):
        counts = log.by_phase.get(phase, Counter())
        shown = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"
        print(f"  {phase:<10} {shown}")
    outage = log.by_phase.get("outage", Counter()) + log.by_phase.get(
        "restarting", Counter()
    )
    answered_503 = outage.get("503", 0)
    print(
        f"during the outage: {answered_503} x 503 problem+json with Retry-After, "
        f"{len(log.bad_503)} x 503 without them, {len(log.five_hundreds)} x 5xx other than 503; "
        f"a 503 took p50 {median(log.seconds_503) * 1000:.0f} ms, "
        f"max {max(log.seconds_503, default=0) * 1000:.0f} ms"
    )
    if log.five_hundreds:
        print("  first 5xx:", log.five_hundreds[0])
    recovery = marks.get("first_2xx_after_restart", float("nan")) - marks["restarted"]
    print(
        f"seconds to recovery after PostgreSQL accepted connections: first 2xx write "
        f"{recovery:.2f} s, first new turn completed "
        f"{marks.get('first_turn_completed', float('nan')) - marks['restarted']:.2f} s "
        f"(that turn took {probe_turn_seconds:.2f} s), interrupted turns completed "
        f"{marks.get('interrupted_turns_resumed', float('nan')) - marks['restarted']:.2f} s"
    )
    converged = sum(1 for c in everyone if id(c) not in problems)
    print(f"clients converged {converged}/{len(everyone)}")
    for c in everyone:
        if id(c) in problems:
            print(f"  {c.kind} {c.session_id}: {problems[id(c)][:3]}")
    bounced = [c for c in clients if c.bounced]
    kept = [c for c in clients if not c.bounced]
    print(
        f"stream clients: {len(bounced)} dropped their connection during the outage; "
        f"their reconnects were refused {dict(sum((c.refused for c in bounced), Counter()))} "
        f"(-503: a 503 without problem+json or Retry-After) "
        f"until PostgreSQL was back, then {sum(1 for c in bounced if c.connects > 1)}/"
        f"{len(bounced)} resumed from their cursor. {len(kept)} stayed connected: "
        f"{sum(1 for c in kept if c.disconnects)} were disconnected by the server, "
        f"{sum(c.resets for c in kept)} reset frames, disconnecting frames "
        f"{dict(sum((c.disconnecting for c in kept), Counter()))}"
    )
    live = sum(1 for c in clients if c.deltas_after_restart > 0)
    firsts = [
        c.first_delta_after_restart - marks["restarted"]
        for c in everyone
        if c.first_delta_after_restart is not None
    ]
    print(
        f"bus listener: {live}/{len(clients)} resumed clients and "
        f"{'the' if probe_client.deltas_after_restart else 'NOT the'} new client saw live deltas "
        f"after the restart (first {min(firsts) if firsts else float('nan'):.2f} s after it)"
    )
    print(f"turn outcomes: {dict(outcomes)}")
    failed_turns = sum(n for outcome, n in outcomes.items() if "failed" in outcome)
    print(
        f"acknowledged messages {len(log.acknowledged)}, present {present}, "
        f"lost {len(log.acknowledged) - present}; messages left streaming: {streaming}"
    )
    server_log = server.log_text()
    print(
        f"server log: {server_log.count('Traceback')} tracebacks, "
        f"{server_log.count('bus listener reconnected')} 'bus listener reconnected', "
        f"{server_log.count('recovered interrupted turn')} 'recovered interrupted turn'"
    )
    ok = (
        ok
        and answered_503 > 0
        and not log.bad_503
        and not log.five_hundreds
        and not problems
        and not any(c.refused[-503] for c in everyone)
        and live == len(clients)
        and probe_client.deltas_after_restart > 0
        and present == len(log.acknowledged)
        and streaming == 0
        and failed_turns == 0
    )
    print("RESULT:", "PASS" if ok else "FAIL")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--clients", type=int, default=2, help="per stream per session")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--deltas", type=int, default=400)
    parser.add_argument("--delay-ms", type=int, default=20)
    parser.add_argument("--down-seconds", type=float, default=5.0)
    parser.add_argument("--pause-on-failure", action="store_true")
    parser.add_argument(
        "--keep-logs", action="store_true", help="print the log directory"
    )
    args = parser.parse_args()
    exit_on_sigterm()
    cluster = ThrowawayCluster()
    logs = Path(tempfile.mkdtemp(prefix="evm_fault_logs_"))
    server: ServerProcess | None = None
    ok = False
    try:
        cluster.init()
        cluster.start()
        run(pg_admin(cluster.url("postgres"), "CREATE DATABASE evm_fault"))
        url = cluster.url("evm_fault")
        migrate(url)
        server = ServerProcess(
            url,
            logs,
            env={
                "SCRIPTED_DELAY_MS": str(args.delay_ms),
                "RUNNER_SWEEP_SECONDS": "1",
                "SSE_HEARTBEAT_SECONDS": "2",
                "DB_POOL_TIMEOUT_SECONDS": "5",
            },
        )
        server.start()
        print(
            f"throwaway PostgreSQL on port {cluster.port} ({cluster.directory}), "
            f"server pid {server.pid} on {server.url}"
        )
        ok = run(scenario(server, cluster, args))
    finally:
        if server is not None:
            server.stop()
        cluster.remove()
        if args.keep_logs or not ok:
            print(f"server log: {logs}")
        else:
            shutil.rmtree(logs, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
