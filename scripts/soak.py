"""Bounded soak: a few minutes of mixed load against one server process on loopback,
then a full consistency check. Stops by itself.

Load (all on 127.0.0.1, one server process):
* hundreds of SSE subscribers on raw sockets (cheap for the client), spread over the
  sessions, half on `/sse`, half on the Mutation stream; every stream is cycled by the
  server (SSE_CYCLE_SECONDS) and the client resumes from its own cursor;
* turn workers: post a message (a mix of scenarios) to a random session and wait until
  it is idle again;
* list workers: GET sessions, messages (with and without If-None-Match) and events.

At the end every turn is let finish, every subscriber is given a moment to read the
tail, and then:
* every message acknowledged with 201 is in GET .../messages;
* every Mutation-stream client holds exactly GET .../messages (each message id with its
  final revision and snapshot), every /sse client exactly GET .../events (ids in order);
* server RSS (VmRSS from /proc) after warm-up and at the end, against a stated bound.

    .venv/bin/python scripts/soak.py [--minutes 3] [--subscribers 300] [--sessions 20]
        [--turn-workers 6] [--list-workers 4] [--database sqlite|postgresql]
        [--rss-bound-mb 32]

Exit status 0 when nothing was lost, no request failed with 5xx and RSS stayed in bound.
"""

import argparse
import asyncio
import contextlib
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
from faultkit import (
    Frame,
    MutationView,
    ServerProcess,
    StreamRefused,
    add_database_options,
    all_messages,
    compare_view,
    median,
    percentile,
    raw_stream,
    run_with_server,
    text_body,
)

SCENARIOS = (
    "a short message to echo back word by word",
    "/scenario long 30",
    "/scenario tool soak",
    "/scenario reasoning",
    "/scenario citations",
)


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    acknowledged: dict[str, str] = field(default_factory=dict)  # message id -> session

    async def call(
        self, http: httpx.AsyncClient, kind: str, method: str, url: str, **kw: Any
    ) -> httpx.Response | None:
        started = time.monotonic()
        try:
            response = await http.request(method, url, **kw)
        except httpx.HTTPError as exc:
            self.statuses[f"client:{type(exc).__name__}"] += 1
            return None
        self.latencies.setdefault(kind, []).append(time.monotonic() - started)
        self.statuses[str(response.status_code)] += 1
        if response.status_code >= 500:
            self.failures.append(f"{method} {url}: {response.text[:200]}")
        return response


# ---- subscribers -------------------------------------------------------------------


@dataclass
class Subscriber:
    base_url: str
    session_id: str
    kind: str  # "sse" | "mutation"
    view: MutationView = field(default_factory=MutationView)
    event_ids: list[str] = field(default_factory=list)
    last_event_id: str | None = None
    connects: int = 0
    refused: Counter[int] = field(default_factory=Counter)
    resets: int = 0
    frames: int = 0

    def _path(self) -> tuple[str, dict[str, str]]:
        if self.kind == "sse":
            if self.last_event_id is None:
                return f"/v1/sessions/{self.session_id}/sse?after_sequence=0", {}
            return f"/v1/sessions/{self.session_id}/sse", {
                "Last-Event-ID": self.last_event_id
            }
        return (
            f"/v1/sessions/{self.session_id}/messages/stream?after={self.view.cursor or '0'}",
            {},
        )

    async def run(self, http: httpx.AsyncClient) -> None:
        while True:
            path, headers = self._path()
            try:
                async with raw_stream(self.base_url, path, headers) as frames:
                    self.connects += 1
                    async for frame in frames:
                        self.frames += 1
                        await self._on_frame(frame, http)
            except StreamRefused as exc:
                self.refused[exc.status] += 1
                await asyncio.sleep(1.0)
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                await asyncio.sleep(0.5)
            await asyncio.sleep(random.uniform(0.05, 0.2))

    async def _on_frame(self, frame: Frame, http: httpx.AsyncClient) -> None:
        if frame.id is None:
            if frame.event == b"reset":
                self.resets += 1
                messages, cursor = await all_messages(http, self.session_id)
                for message in messages:
                    self.view.merge(message)
                self.view.cursor = cursor
            return
        if self.kind == "sse":
            self.event_ids.append(frame.id)
            self.last_event_id = frame.id
        else:
            self.view.apply(frame)


# ---- workers -----------------------------------------------------------------------


async def turn_worker(
    http: httpx.AsyncClient, sessions: list[str], stats: Stats, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        sid = random.choice(sessions)
        response = await stats.call(
            http,
            "POST messages",
            "POST",
            f"/v1/sessions/{sid}/messages",
            json=text_body(random.choice(SCENARIOS), uuid.uuid4().hex),
        )
        if response is not None and response.status_code == 201:
            stats.acknowledged[response.json()["id"]] = sid
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stop.is_set():
            await asyncio.sleep(0.2)
            got = await stats.call(http, "GET session", "GET", f"/v1/sessions/{sid}")
            if (
                got is not None
                and got.status_code == 200
                and got.json()["status"] == "idle"
            ):
                break


async def list_worker(
    http: httpx.AsyncClient, sessions: list[str], stats: Stats, stop: asyncio.Event
) -> None:
    etags: dict[str, str] = {}
    while not stop.is_set():
        sid = random.choice(sessions)
        choice = random.random()
        if choice < 0.25:
            await stats.call(
                http, "GET sessions", "GET", "/v1/sessions", params={"limit": 20}
            )
        elif choice < 0.6:
            headers = {"If-None-Match": etags[sid]} if sid in etags else {}
            response = await stats.call(
                http,
                "GET messages",
                "GET",
                f"/v1/sessions/{sid}/messages",
                headers=headers,
            )
            if response is not None and "etag" in response.headers:
                etags[sid] = response.headers["etag"]
        else:
            await stats.call(
                http,
                "GET events",
                "GET",
                f"/v1/sessions/{sid}/events",
                params={"limit": 100},
            )
        await asyncio.sleep(0.05)


# ---- the run -----------------------------------------------------------------------


async def soak(server: ServerProcess, args: argparse.Namespace) -> bool:
    stats = Stats()
    stop = asyncio.Event()
    rss: list[tuple[float, int]] = []
    t0 = time.monotonic()
    async with httpx.AsyncClient(
        base_url=server.url,
        timeout=httpx.Timeout(30.0),
        limits=httpx.Limits(max_connections=args.turn_workers + args.list_workers + 8),
    ) as http:
        sessions = []
        for i in range(args.sessions):
            created = await http.post("/v1/sessions", json={"title": f"soak {i}"})
            created.raise_for_status()
            sessions.append(created.json()["id"])
        rss_idle = server.rss_kb()
        subscribers = [
            Subscriber(
                server.url,
                sessions[i % len(sessions)],
                "sse" if i % 2 == 0 else "mutation",
            )
            for i in range(args.subscribers)
        ]
        sub_tasks = []
        for sub in subscribers:
            sub_tasks.append(asyncio.create_task(sub.run(http)))
            await asyncio.sleep(0.005)
        while sum(1 for s in subscribers if s.connects) < len(subscribers):
            if time.monotonic() - t0 > 60:
                print("not every subscriber could connect within 60 s")
                break
            await asyncio.sleep(0.1)
        print(
            f"[{time.monotonic() - t0:5.1f}s] {len(subscribers)} subscribers connected; "
            f"server RSS {rss_idle / 1024:.1f} MB before them, {server.rss_kb() / 1024:.1f} MB now"
        )
        workers = [
            asyncio.create_task(turn_worker(http, sessions, stats, stop))
            for _ in range(args.turn_workers)
        ] + [
            asyncio.create_task(list_worker(http, sessions, stats, stop))
            for _ in range(args.list_workers)
        ]
        load_started = time.monotonic()
        duration = args.minutes * 60
        warmup = min(30.0, duration / 4)
        rss_warm: int | None = None
        while time.monotonic() - load_started < duration:
            await asyncio.sleep(5)
            elapsed = time.monotonic() - load_started
            rss.append((elapsed, server.rss_kb()))
            if rss_warm is None and elapsed >= warmup:
                rss_warm = rss[-1][1]
            if int(elapsed) % 30 < 5:
                served = sum(len(v) for v in stats.latencies.values())
                print(
                    f"[{time.monotonic() - t0:5.1f}s] {served} requests, "
                    f"{len(stats.acknowledged)} messages posted, "
                    f"{sum(s.frames for s in subscribers)} frames read, "
                    f"RSS {rss[-1][1] / 1024:.1f} MB"
                )
        rss_end = server.rss_kb()
        stop.set()
        await asyncio.gather(*workers)
        load_seconds = time.monotonic() - load_started

        # Let every turn finish, then let every subscriber read the tail.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            active = (
                await http.get("/v1/sessions", params={"status": "active", "limit": 1})
            ).json()["total"]
            if active == 0:
                break
            await asyncio.sleep(0.5)
        truth: dict[str, tuple[list[str], list[dict[str, Any]]]] = {}
        for sid in sessions:
            events = (await http.get(f"/v1/sessions/{sid}/events")).json()["data"]
            messages, _ = await all_messages(http, sid)
            truth[sid] = ([e["id"] for e in events], messages)

        def problems(sub: Subscriber) -> list[str]:
            ids, messages = truth[sub.session_id]
            if sub.kind == "sse":
                seen = list(dict.fromkeys(sub.event_ids))
                out = []
                if seen != ids:
                    out.append(f"{len(set(ids) - set(seen))} events missing")
                if len(seen) != len(sub.event_ids):
                    out.append(f"{len(sub.event_ids) - len(seen)} duplicate events")
                return out
            return compare_view(sub.view.messages, messages)

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            bad = {id(s): problems(s) for s in subscribers if problems(s)}
            if not bad:
                break
            await asyncio.sleep(0.5)
        for task in sub_tasks:
            task.cancel()
        for task in sub_tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        stored = {m["id"] for _, messages in truth.values() for m in messages}
        missing_acked = [mid for mid in stats.acknowledged if mid not in stored]

    # ---- report ----------------------------------------------------------------------
    everything = [x for v in stats.latencies.values() for x in v]
    errors = {k: v for k, v in stats.statuses.items() if not k.startswith(("2", "3"))}
    mutation_subs = [s for s in subscribers if s.kind == "mutation"]
    sse_subs = [s for s in subscribers if s.kind == "sse"]
    lost_in_views = sum(
        len(compare_view(s.view.messages, truth[s.session_id][1]))
        for s in mutation_subs
    )
    lane = "postgresql" if server.database_url.startswith("postgresql") else "sqlite"
    print()
    print(
        f"soak on {lane}: {load_seconds / 60:.1f} min, {len(subscribers)} SSE subscribers "
        f"({len(sse_subs)} /sse, {len(mutation_subs)} Mutation) over {len(sessions)} "
        f"sessions, {args.turn_workers} turn workers, {args.list_workers} list workers"
    )
    print(
        f"requests served: {len(everything)} ({len(everything) / load_seconds:.0f}/s); "
        f"statuses {dict(sorted(stats.statuses.items()))}; errors by status {errors or 'none'}"
    )
    print(
        f"latency all requests: p50 {median(everything) * 1000:.1f} ms, "
        f"p99 {percentile(everything, 99) * 1000:.1f} ms"
    )
    for kind, values in sorted(stats.latencies.items()):
        print(
            f"  {kind:<14} n={len(values):>6}  p50 {median(values) * 1000:7.1f} ms  "
            f"p99 {percentile(values, 99) * 1000:7.1f} ms"
        )
    frames = sum(s.frames for s in subscribers)
    print(
        f"streams: {frames} frames read ({frames / load_seconds:.0f}/s), "
        f"{sum(s.connects for s in subscribers) - len(subscribers)} reconnects "
        f"(server connection cycling), resets {sum(s.resets for s in subscribers)}, "
        f"refused {dict(sum((s.refused for s in subscribers), Counter()))}"
    )
    converged = len(subscribers) - len(bad)
    print(
        f"turns: {len(stats.acknowledged)} messages posted and acknowledged, "
        f"{len(stored)} messages stored"
    )
    print(
        f"messages lost: {len(missing_acked)} acknowledged but not stored, "
        f"{lost_in_views} missing or stale in Mutation-stream clients; clients "
        f"converged {converged}/{len(subscribers)}"
    )
    for s in subscribers:
        if id(s) in bad:
            print(f"  {s.kind} {s.session_id}: {bad[id(s)][:3]}")
            break
    warm = rss_warm or (rss[0][1] if rss else rss_end)
    growth_mb = (rss_end - warm) / 1024
    print(
        f"server RSS: {rss_idle / 1024:.1f} MB idle, {warm / 1024:.1f} MB after warm-up, "
        f"{rss_end / 1024:.1f} MB at the end: growth {growth_mb:+.1f} MB "
        f"(bound {args.rss_bound_mb} MB: {'ok' if growth_mb <= args.rss_bound_mb else 'EXCEEDED'})"
    )
    half = [kb for t, kb in rss if t >= load_seconds / 2]
    if len(half) >= 2:
        print(
            f"  second half of the run: {half[0] / 1024:.1f} -> {half[-1] / 1024:.1f} MB"
        )
    ok = (
        not stats.failures
        and not missing_acked
        and lost_in_views == 0
        and not bad
        and growth_mb <= args.rss_bound_mb
    )
    if stats.failures:
        print(f"first 5xx: {stats.failures[0]}")
    print("RESULT:", "PASS" if ok else "FAIL")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--subscribers", type=int, default=300)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--turn-workers", type=int, default=6)
    parser.add_argument("--list-workers", type=int, default=4)
    parser.add_argument("--delay-ms", type=int, default=10)
    parser.add_argument("--cycle-seconds", type=float, default=60.0)
    parser.add_argument("--rss-bound-mb", type=float, default=32.0)
    add_database_options(parser)
    args = parser.parse_args()
    env = {
        "SCRIPTED_DELAY_MS": str(args.delay_ms),
        "SSE_MAX_PER_SESSION": "100000",
        "SSE_MAX_PER_PROCESS": "100000",
        "SSE_CYCLE_SECONDS": str(args.cycle_seconds),
        "SSE_HEARTBEAT_SECONDS": "15",
    }
    run_with_server(
        args,
        prefix="evm_soak_",
        env=env,
        scenario=lambda server, _sqlite_path: soak(server, args),
    )


if __name__ == "__main__":
    main()
