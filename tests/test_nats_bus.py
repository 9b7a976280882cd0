"""The NATS bus (BUS_URL=nats://...): two server processes on one PostgreSQL database
carry their live traffic over a nats-server of the test's own (Debian's `nats-server`;
CI installs it and sets REQUIRE_NATS). A turn run by A streams to a client of B
without a NOTIFY in the database; NATS lost mid-turn loses nothing committed, and the
processes reconnect by themselves; an unreachable BUS_URL is a one-line refusal. A
process hears the tokens of the sessions it streams only, and every wake-up once."""

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from app.db.outbox import Outbox
from app.live.items import BusItem, TextDelta, Wakeup
from app.live.nats_bus import NatsBus
from app.settings import Settings
from tests.support.api import create_session, list_events, post_message, text_of
from tests.support.nats import Nats
from tests.support.notify import notifications
from tests.support.servers import free_port, server_process
from tests.support.sse import Frame, SSEReader
from tests.support.waits import wait_until

pytestmark = pytest.mark.postgres_only

ROOT = Path(__file__).resolve().parents[1]


def agent_done(frames: list[Frame]) -> bool:
    return any(
        f.event == "message"
        and f.json()["message"]["role"] == "agent"
        and f.json()["message"]["state"] == "done"
        for f in frames
    )


def live_text(frames: list[Frame]) -> str:
    """The agent's text as the Mutation stream's part and deltas built it, checking
    that each delta continues where the text so far ends."""
    (part,) = [f.json()["part"] for f in frames if f.event == "part"]
    text: str = part["text"]
    for delta in (f.json() for f in frames if f.event == "delta"):
        assert delta["offset"] == len(text), "a gap or overlap in the deltas"
        text += delta["text"]
    return text


async def test_a_turn_run_by_a_streams_to_b_over_nats_without_notify(
    settings: Settings, tmp_path: Path, nats_server: Nats
) -> None:
    async with (
        asyncio.timeout(90),
        notifications(settings.database_url) as heard,
        server_process(
            settings.database_url,
            tmp_path,
            BUS_URL=nats_server.url,
            SCRIPTED_DELAY_MS="10",
        ) as a,
        server_process(
            settings.database_url,
            tmp_path,
            BUS_URL=nats_server.url,
            SCRIPTED_DELAY_MS="10",
        ) as b,
        httpx.AsyncClient(base_url=a.url, timeout=10) as client_a,
        httpx.AsyncClient(base_url=b.url, timeout=10) as client_b,
    ):
        sid = await create_session(client_a, "nats")
        stream = await SSEReader(
            client_b, f"/v1/sessions/{sid}/messages/stream?after=0"
        ).start()
        try:
            await post_message(client_a, sid, "/scenario long 40", role="user")
            await stream.wait_for(agent_done, "the closed agent message on B")
        finally:
            await stream.close()
        frames = stream.frames
        assert "reset" not in [f.event for f in frames]
        assert any(f.event == "delta" for f in frames), "no live delta reached B"
        final = [f.json()["message"] for f in frames if f.event == "message"][-1]
        assert live_text(frames) == text_of(final)
        assert text_of(final) == "".join(f"chunk{i} " for i in range(40))
        assert await list_events(client_b, sid) == await list_events(client_a, sid)
    # Nothing of it went through PostgreSQL's NOTIFY.
    assert heard == []


def rebuilt_text(frames: list[Frame]) -> str:
    """The agent's text as a client builds it from a stream that joined mid-turn: a
    `part` frame is the part as it stands (it may come again, when the process asked
    the runner for it), and each delta continues where the text so far ends."""
    text = ""
    for frame in frames:
        if frame.event == "part":
            text = frame.json()["part"]["text"]
        elif frame.event == "delta":
            assert frame.json()["offset"] == len(text), "a gap or overlap in the deltas"
            text += frame.json()["text"]
    return text


async def text_deltas_heard(client: httpx.AsyncClient) -> float:
    """How many text deltas the bus brought this process (its metrics)."""
    answer = await client.get("/metrics")
    for family in text_string_to_metric_families(answer.text):
        if family.name == "evermirror_bus_notifications":
            return sum(
                s.value for s in family.samples if s.labels.get("kind") == "TextDelta"
            )
    return 0.0


async def test_a_process_hears_the_tokens_of_the_sessions_it_streams_only(
    settings: Settings, tmp_path: Path, nats_server: Nats
) -> None:
    """B streams session one: the turn A runs on session two costs B none of its
    deltas. A stream B opens on session two mid-turn still gets the whole live text
    (B asks the runner for the parts so far) and converges."""
    env = {"BUS_URL": nats_server.url, "SCRIPTED_DELAY_MS": "15"}
    async with (
        asyncio.timeout(90),
        server_process(settings.database_url, tmp_path, kill=False, **env) as a,
        server_process(settings.database_url, tmp_path, kill=False, **env) as b,
        httpx.AsyncClient(base_url=a.url, timeout=10) as client_a,
        httpx.AsyncClient(base_url=b.url, timeout=10) as client_b,
    ):
        one = await create_session(client_a, "watched on B")
        two = await create_session(client_a, "not watched on B")
        watching = await SSEReader(
            client_b, f"/v1/sessions/{one}/messages/stream?after=0"
        ).start()
        try:
            await post_message(client_a, two, "/scenario long 60", role="user")
            # The turn streams on A; B hears its wake-ups, not its deltas.
            mid_turn = SSEReader(client_a, f"/v1/sessions/{two}/messages/stream")
            await (await mid_turn.start()).wait_for(
                lambda frames: sum(f.event == "delta" for f in frames) >= 20,
                "twenty deltas on A",
            )
            await mid_turn.close()
            assert await text_deltas_heard(client_b) == 0
            late = await SSEReader(
                client_b, f"/v1/sessions/{two}/messages/stream?after=0"
            ).start()
            try:
                await late.wait_for(agent_done, "the closed agent message on B")
            finally:
                await late.close()
            assert await text_deltas_heard(client_b) > 0
            final = [f.json()["message"] for f in late.frames if f.event == "message"]
            assert text_of(final[-1]) == "".join(f"chunk{i} " for i in range(60))
            assert rebuilt_text(late.frames) == text_of(final[-1])
            # And session one, watched all along, still streams to B.
            await post_message(client_a, one, "/scenario long 10", role="user")
            await watching.wait_for(agent_done, "session one's reply on B")
        finally:
            await watching.close()
        assert live_text(watching.frames) == "".join(f"chunk{i} " for i in range(10))


async def test_nats_lost_mid_turn_loses_nothing_committed(
    settings: Settings, tmp_path: Path, nats_server: Nats
) -> None:
    env = {"BUS_URL": nats_server.url, "SCRIPTED_DELAY_MS": "20"}
    async with (
        asyncio.timeout(120),
        server_process(settings.database_url, tmp_path, kill=False, **env) as a,
        server_process(settings.database_url, tmp_path, kill=False, **env) as b,
        httpx.AsyncClient(base_url=a.url, timeout=10) as client_a,
        httpx.AsyncClient(base_url=b.url, timeout=10) as client_b,
    ):
        sid = await create_session(client_a, "nats lost")
        stream = await SSEReader(
            client_b, f"/v1/sessions/{sid}/messages/stream?after=0"
        ).start()
        try:
            await post_message(client_a, sid, "/scenario long 150", role="user")
            await stream.wait_for(
                lambda frames: any(f.event == "delta" for f in frames), "a first delta"
            )
            nats_server.stop()
            await asyncio.sleep(1.0)
            nats_server.start()
            # The turn goes on on A; B hears its end once both are back on NATS.
            await stream.wait_for(agent_done, "the closed agent message on B")
            healthy = await client_b.get("/health")
            assert healthy.status_code == 200, healthy.text
        finally:
            await stream.close()
        final = [f.json()["message"] for f in stream.frames if f.event == "message"][-1]
        assert text_of(final) == "".join(f"chunk{i} " for i in range(150))
        events = await list_events(client_b, sid)
        assert events == await list_events(client_a, sid)
        assert events[-1]["type"] == "session.idled"
        assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))


def test_an_unreachable_bus_is_a_one_line_refusal(settings: Settings) -> None:
    closed = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--port", str(free_port())],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": settings.database_url,
            "BUS_URL": f"nats://127.0.0.1:{closed}",
            "LOG_LEVEL": "warning",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        f"refusing to serve: BUS_URL: cannot reach NATS at nats://127.0.0.1:{closed}"
        f" within 5 s ([Errno 111] Connect call failed ('127.0.0.1', {closed}))"
    ], result.stderr


def test_a_bus_url_is_refused_where_it_cannot_apply() -> None:
    with pytest.raises(ValidationError, match="BUS_URL needs DATABASE_URL on Postgre"):
        Settings(database_url="sqlite+aiosqlite:///one.db", bus_url="nats://x:4222")
    with pytest.raises(ValidationError, match="must be a nats:// or tls:// URL"):
        Settings(
            database_url="postgresql+asyncpg://h/db", bus_url="redis://127.0.0.1:6379"
        )


async def test_a_watch_hears_a_sessions_wake_ups_once_and_each_after_it_ends(
    nats_server: Nats,
) -> None:
    """Two buses on one NATS server, in this process. While B watches a session it
    hears the session's deltas and each wake-up once (from the session's subject, not
    again from the committed copy); after it stops watching, no deltas, and every
    wake-up still, once. A session it never watched: wake-ups only."""
    sender, watcher = NatsBus(nats_server.url), NatsBus(nats_server.url)
    heard: list[BusItem] = []
    watcher.sink = heard.append
    watched, other = uuid.uuid4(), uuid.uuid4()

    def delta(session: uuid.UUID, offset: int) -> TextDelta:
        return TextDelta(
            session, session, 1, None, "part", offset, "x", "delta", "event_x", "ts"
        )

    def commit(session: uuid.UUID, sequence: int) -> None:
        outbox = Outbox()
        outbox.wake(session, sequence)
        sender.after_commit(outbox)

    def wakeups(session: uuid.UUID) -> list[int]:
        return [
            i.sequence for i in heard if type(i) is Wakeup and i.session_id == session
        ]

    def deltas(session: uuid.UUID) -> int:
        return sum(type(i) is TextDelta and i.session_id == session for i in heard)

    await sender.start()
    await watcher.start()
    try:
        watcher.watch(watched)
        await wait_until(lambda: watched in watcher._confirmed, "the watch confirmed")
        for sequence in (1, 2, 3):
            sender.publish(delta(watched, sequence))
            sender.publish(delta(other, sequence))
            commit(watched, sequence)
            commit(other, sequence)
        await wait_until(
            lambda: len(wakeups(other)) == 3, "three wake-ups of the other"
        )
        await wait_until(lambda: len(wakeups(watched)) == 3, "three wake-ups")
        await asyncio.sleep(0.2)
        assert wakeups(watched) == [1, 2, 3]
        assert deltas(watched) >= 1
        assert wakeups(other) == [1, 2, 3]
        assert deltas(other) == 0

        watcher.unwatch(watched)
        await wait_until(lambda: watched not in watcher._confirmed, "the watch ended")
        before = deltas(watched)
        for sequence in (4, 5):
            sender.publish(delta(watched, sequence))
            commit(watched, sequence)
        await wait_until(lambda: len(wakeups(watched)) == 5, "two more wake-ups")
        await asyncio.sleep(0.2)
        assert wakeups(watched) == [1, 2, 3, 4, 5]
        assert deltas(watched) == before
    finally:
        await watcher.stop()
        await sender.stop()
