"""Fenced runner leases on PostgreSQL (docs/deployment.md, "Scale-out on PostgreSQL").

One runner per session holds across lost lease connections, takeovers and database
restarts: a runner whose lease connection dies stops publishing and writing until it has
regained the lease; one whose session was taken over meanwhile never writes or publishes
again; a database restart under two nodes resumes the turn instead of failing it; a
restarted node closes the turns of a dead one at start-up.
"""

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.db.leases import PgLeases, Regain, lease_key
from app.db.migrate import upgrade
from app.ids import parse_id
from app.settings import Settings
from tests.support.api import create_session, list_events, post_message
from tests.support.lanes import ROOT
from tests.support.servers import server_process, start_server
from tests.support.sse import Frame, SSEReader
from tests.support.waits import wait_until
from tests.test_multiprocess import delta_count, two_servers

pytestmark = pytest.mark.postgres_only

TEST_DEADLINE = 90.0


def long_text(count: int) -> str:
    """What `/scenario long <count>` answers."""
    return "".join(f"chunk{i} " for i in range(count))


def dsn(database_url: str) -> str:
    return database_url.replace("postgresql+asyncpg://", "postgresql://")


@contextlib.asynccontextmanager
async def admin(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(dsn(database_url))
    try:
        yield conn
    finally:
        await conn.close()


async def terminate_leases(conn: asyncpg.Connection) -> int:
    """Kill the runner lease connections of this test's database only (what an
    idle-connection killer or a failover does to them); the servers' pools and bus
    connections stay up."""
    killed: list[bool] = await conn.fetch(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'evermirror-lease' AND datname = current_database()"
    )
    return len(killed)


def live_text(frames: list[Frame], message_id: str) -> str:
    """The text the deltas of `message_id` carried, joined in the order they came."""
    return "".join(
        frame.json()["data"]["delta"]
        for frame in frames
        if frame.event == "output.message.delta"
        and frame.json()["data"]["message_id"] == message_id
    )


def agent_message_id(frames: list[Frame]) -> str:
    started = [f.json() for f in frames if f.event == "output.message.started"]
    assert started, "no output.message.started yet"
    message_id: str = started[0]["data"]["message_id"]
    return message_id


async def agent_message(client: httpx.AsyncClient, sid: str, mid: str) -> Any:
    response = await client.get(f"/v1/sessions/{sid}/messages/{mid}")
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_lock_answered_on_a_connection_lost_meanwhile_is_not_held(
    settings: Settings, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regaining a lease, the lock's answers arrive, and then, before the regain goes
    on, asyncpg sees the connection close and the lease set is told (the order the
    event loop may run them in). The lock died with the connection: the lease is not
    held, and the runner goes on waiting instead of publishing unfenced."""
    session_id = parse_id("session", await create_session(client, "regain"))
    leases = PgLeases(settings.database_url, renew_seconds=60)
    real_fetchval = asyncpg.Connection.fetchval
    async with admin(settings.database_url) as conn:

        async def killed_after_answering(
            self: asyncpg.Connection, query: str, *args: Any, **kwargs: Any
        ) -> Any:
            value = await real_fetchval(self, query, *args, **kwargs)
            if query.startswith("SELECT runner_epoch"):
                await terminate_leases(conn)
                await wait_until(self.is_closed, "the connection to close", 10, 0.01)
                await asyncio.sleep(0.05)  # the termination listener's turn
            return value

        try:
            assert await leases.try_acquire(session_id)
            await terminate_leases(conn)
            await wait_until(
                lambda: not leases.holds(session_id), "the lease to be lost", 10, 0.01
            )
            monkeypatch.setattr(asyncpg.Connection, "fetchval", killed_after_answering)
            assert await leases.regain(session_id, None) is Regain.BUSY
            assert not leases.holds(session_id)
            monkeypatch.undo()
            # With the connection up, the lease comes back as before.
            assert await leases.regain(session_id, None) is Regain.HELD
            assert leases.holds(session_id)
        finally:
            await leases.stop()


async def test_the_keeper_outlives_a_connection_broken_mid_statement(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease connection the server terminated while it sat idle can raise asyncpg's
    InternalClientError on its next statement, before asyncpg has seen the socket
    close. The keeper counts that as a lost connection: the lease is given up, renewal
    goes on over a new connection, and stopping raises nothing."""
    session_id = uuid.uuid4()
    leases = PgLeases(settings.database_url, renew_seconds=0.05)
    real_execute = asyncpg.Connection.execute
    broken: list[asyncpg.Connection] = []

    async def breaks_once(
        self: asyncpg.Connection, query: str, *args: Any, **kwargs: Any
    ) -> Any:
        if query.startswith("UPDATE sessions SET runner_renewed_at") and not broken:
            broken.append(self)
            raise asyncpg.InternalClientError(
                "cannot switch to state 11; another operation (2) is in progress"
            )
        return await real_execute(self, query, *args, **kwargs)

    monkeypatch.setattr(asyncpg.Connection, "execute", breaks_once)
    try:
        assert await leases.try_acquire(session_id)
        connected_at = leases.connected_at
        await leases.start()
        await wait_until(lambda: bool(broken), "the renewal to break", 10, 0.01)
        assert not leases.holds(session_id)
        await wait_until(
            lambda: leases.connected_at != connected_at,
            "the keeper to renew over a new connection",
            10,
            0.01,
        )
        assert broken[0].is_closed()
    finally:
        await leases.stop()


async def test_lost_lease_connections_mid_turn_leave_one_runner_and_the_whole_reply(
    settings: Settings, tmp_path: Path
) -> None:
    """The adversarial trial: the lease connections of both nodes are killed twice in
    one turn, each time for longer than the sweeper's grace. The runner regains its
    lease, nobody else takes the turn, and the reply streams and commits whole: every
    delta exactly once, in order, and no `turn.failed`."""
    count = 400
    async with (
        two_servers(
            settings, tmp_path, SCRIPTED_DELAY_MS="10", RUNNER_SWEEP_SECONDS="1"
        ) as pair,
        admin(settings.database_url) as conn,
    ):
        sid, sse = await pair.watched_session()
        await pair.start_turn(sid, f"/scenario long {count}")
        await sse.wait_for(lambda f: delta_count(f) >= 20, "deltas flowing")
        for _ in range(2):
            assert await terminate_leases(conn) >= 1
            # Longer than the sweeper's grace (RUNNER_SWEEP_SECONDS=1).
            await asyncio.sleep(1.5)
        await sse.wait_for(
            lambda _: sse.has("turn.completed") or sse.has("turn.failed"),
            "the turn to end",
            within=60,
        )
        await sse.wait_for(lambda _: sse.has("session.idled"), "session.idled")

        types = [e["type"] for e in await list_events(pair.client_b, sid)]
        assert "turn.failed" not in types
        assert types.count("turn.completed") == 1
        mid = agent_message_id(sse.frames)
        agent = await agent_message(pair.client_b, sid, mid)
        assert agent["state"] == "done"
        assert [p["type"] for p in agent["content"]] == ["text"]
        assert agent["content"][0]["text"] == long_text(count)
        # One runner's output: each delta once, in order, none missing.
        assert live_text(sse.frames, mid) == long_text(count)


async def test_a_runner_whose_session_was_taken_over_writes_and_publishes_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    """A takeover while the runner is cut off from its lease: another holder takes the
    lock and claims the session (the runner epoch). The old runner, which is alive and
    mid-stream, publishes no delta and commits nothing from then on; the turn is
    closed once, as interrupted, by the recovery."""
    async with (
        two_servers(
            settings, tmp_path, SCRIPTED_DELAY_MS="10", RUNNER_SWEEP_SECONDS="1"
        ) as pair,
        admin(settings.database_url) as conn,
    ):
        sid, sse = await pair.watched_session()
        turn_id = (await pair.start_turn(sid, "/scenario long 3000"))["turn_id"]
        await sse.wait_for(lambda f: delta_count(f) >= 10, "deltas flowing")
        key = lease_key(parse_id("session", sid))

        # Cut the runner off and take the lock before it can regain it.
        deadline = time.monotonic() + 10
        while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", key):
            assert time.monotonic() < deadline, "could not take the lease"
            await terminate_leases(conn)
        # Frames the runner sent before it saw its connection die are still delivered;
        # after that it is silent, waiting to regain the lease.
        await asyncio.sleep(0.5)
        cut_off = len(sse.frames)
        await asyncio.sleep(0.5)
        assert delta_count(sse.frames[cut_off:]) == 0
        await conn.execute(
            "UPDATE sessions SET runner_epoch = runner_epoch + 1 WHERE id = $1",
            parse_id("session", sid),
        )
        taken_over = len(sse.frames)
        events_at_takeover = await list_events(pair.client_b, sid)
        await asyncio.sleep(1.5)
        # Nothing from the old runner while the new holder has the lease.
        assert delta_count(sse.frames[taken_over:]) == 0
        assert await list_events(pair.client_b, sid) == events_at_takeover
        await conn.fetchval("SELECT pg_advisory_unlock($1)", key)

        # The holder went away without finishing: the sweeper closes the turn.
        await sse.wait_for(
            lambda _: sse.has("turn.failed"), "the turn to be recovered", within=15
        )
        await sse.wait_for(lambda _: sse.has("session.idled"), "session.idled")
        events = await list_events(pair.client_b, sid)
        assert events[: len(events_at_takeover)] == events_at_takeover
        assert [e["type"] for e in events[len(events_at_takeover) :]] == [
            "output.message.completed",
            "turn.failed",
            "session.idled",
        ]
        assert events[-2]["data"]["error_code"] == "interrupted"
        assert events[-2]["data"]["turn_id"] == turn_id
        assert delta_count(sse.frames[taken_over:]) == 0
        logs = pair.a.log.read_text() + pair.b.log.read_text()
        assert "another runner took the session over" in logs


async def test_a_restarted_node_closes_a_dead_nodes_turn_at_start_up(
    settings: Settings, tmp_path: Path
) -> None:
    """SIGKILL mid-turn, then a new process: its start-up closes the interrupted turn
    (the lease is free and unrenewed), long before the sweeper's grace of 30 s."""
    env = {"SCRIPTED_DELAY_MS": "10", "RUNNER_SWEEP_SECONDS": "30"}
    async with asyncio.timeout(TEST_DEADLINE):
        first = await asyncio.to_thread(
            start_server, settings.database_url, tmp_path, None, **env
        )
        try:
            async with httpx.AsyncClient(base_url=first.url, timeout=10) as client:
                sid = await create_session(client, "restart")
                reader = await SSEReader(
                    client, f"/v1/sessions/{sid}/sse?after_sequence=0"
                ).start()
                await post_message(client, sid, "/scenario long 3000", role="user")
                await reader.wait_for(lambda f: delta_count(f) >= 10, "deltas")
                await reader.close()
        finally:
            first.kill()
        # Two renewal periods (1 s each here) pass while the process is down.
        await asyncio.sleep(2.0)
        async with (
            server_process(
                settings.database_url, tmp_path, kill=False, **env
            ) as second,
            httpx.AsyncClient(base_url=second.url, timeout=10) as client,
        ):
            session = (await client.get(f"/v1/sessions/{sid}")).json()
            assert session["status"] == "idle"
            types = [e["type"] for e in await list_events(client, sid)]
            assert types[-2:] == ["turn.failed", "session.idled"]


def throwaway_cluster() -> Any:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from faultkit import ThrowawayCluster  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return ThrowawayCluster()


async def poll(
    client: httpx.AsyncClient, url: str, within: float = 60.0
) -> dict[str, Any]:
    """GET `url` until it answers 200 (it is 503 while the database is down)."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(httpx.HTTPError):
            response = await client.get(url)
            if response.status_code == 200:
                body: dict[str, Any] = response.json()
                return body
        assert time.monotonic() < deadline, f"{url} did not answer 200"
        await asyncio.sleep(0.2)


async def test_a_database_restart_under_two_nodes_resumes_the_turn(
    tmp_path: Path,
) -> None:
    """PostgreSQL (a cluster of the test's own) restarts mid-turn under two nodes: the
    runner regains its lease, retries its checkpoint once the database is back, and
    the turn completes with the whole reply; nobody fails or takes it over."""
    count = 600
    cluster = throwaway_cluster()
    await asyncio.to_thread(cluster.init)
    await asyncio.to_thread(cluster.start)
    try:
        async with admin(cluster.url("postgres")) as conn:
            await conn.execute("CREATE DATABASE evermirror")
        url = cluster.url("evermirror")
        await asyncio.to_thread(upgrade, url)
        async with (
            asyncio.timeout(TEST_DEADLINE),
            two_servers(
                Settings(database_url=url),
                tmp_path,
                SCRIPTED_DELAY_MS="10",
                RUNNER_SWEEP_SECONDS="1",
            ) as pair,
        ):
            sid = await create_session(pair.client_a, "restart")
            posted = await pair.start_turn(sid, f"/scenario long {count}")
            deadline = time.monotonic() + 20
            while True:
                page = await poll(pair.client_b, f"/v1/sessions/{sid}/messages")
                agents = [m for m in page["data"] if m["role"] == "agent"]
                if agents:
                    break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)

            await asyncio.to_thread(cluster.stop, "fast")
            await asyncio.sleep(2.0)
            await asyncio.to_thread(cluster.start)

            deadline = time.monotonic() + 60
            while True:
                session = await poll(pair.client_b, f"/v1/sessions/{sid}")
                if session["status"] == "idle":
                    break
                assert time.monotonic() < deadline, "the turn did not end"
                await asyncio.sleep(0.2)
            events = (
                await poll(pair.client_b, f"/v1/sessions/{sid}/events?limit=1000")
            )["data"]
            types = [e["type"] for e in events]
            assert "turn.failed" not in types
            completed = [e for e in events if e["type"] == "turn.completed"]
            assert [e["data"]["turn_id"] for e in completed] == [posted["turn_id"]]
            agent = await agent_message(pair.client_b, sid, agents[0]["id"])
            assert agent["state"] == "done"
            assert agent["content"][0]["text"] == long_text(count)
    finally:
        await asyncio.to_thread(cluster.remove)
