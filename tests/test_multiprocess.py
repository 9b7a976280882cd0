"""Two server processes on one PostgreSQL database (DESIGN.md 3.2, 3.3).

The bus is PostgreSQL LISTEN/NOTIFY and the runner lease an advisory lock, so a client of
process B sees, steers and cancels a turn that process A runs, and B takes over the
recovery of A's turn when A dies.
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.support.api import (
    TURN_EVENTS,
    create_session,
    get_session,
    list_events,
    list_messages,
    post_message,
    text_of,
)
from tests.support.servers import Server, server_process
from tests.support.sse import Frame, SSEReader, durable, merge_snapshots

pytestmark = pytest.mark.postgres_only

TEST_DEADLINE = 90.0


@dataclass
class Pair:
    """Server A runs turns; clients watch, steer and cancel through server B."""

    a: Server
    b: Server
    client_a: httpx.AsyncClient
    client_b: httpx.AsyncClient
    readers: list[SSEReader] = field(default_factory=list)

    async def watch(self, url: str) -> SSEReader:
        reader = await SSEReader(self.client_b, url).start()
        self.readers.append(reader)
        return reader

    async def watched_session(self) -> tuple[str, SSEReader]:
        """A session made through A, and upstream's stream of it from the start, read
        through B."""
        sid = await create_session(self.client_a, "multiprocess")
        return sid, await self.watch(f"/v1/sessions/{sid}/sse?after_sequence=0")

    async def start_turn(self, sid: str, text: str) -> dict[str, Any]:
        """Post `text` through A, which starts a turn there."""
        posted = await post_message(self.client_a, sid, text, role="user")
        assert posted["delivery"] == "started"
        return posted


@contextlib.asynccontextmanager
async def two_servers(
    settings: Settings, tmp_path: Path, **env: str
) -> AsyncIterator[Pair]:
    """Two servers on one database, for at most TEST_DEADLINE seconds."""
    async with (
        asyncio.timeout(TEST_DEADLINE),
        server_process(settings.database_url, tmp_path, kill=True, **env) as a,
        server_process(settings.database_url, tmp_path, kill=True, **env) as b,
        httpx.AsyncClient(base_url=a.url, timeout=10) as client_a,
        httpx.AsyncClient(base_url=b.url, timeout=10) as client_b,
    ):
        pair = Pair(a, b, client_a, client_b)
        try:
            yield pair
        finally:
            for reader in pair.readers:
                await reader.close()


def agent_id_of(reader: SSEReader) -> str:
    started = reader.events("output.message.started")
    assert started, "no output.message.started yet"
    message_id: str = started[0]["data"]["message_id"]
    return message_id


def delta_count(frames: list[Frame]) -> int:
    return sum(f.event == "output.message.delta" for f in frames)


async def assert_stopped(
    client: httpx.AsyncClient, sid: str, message_id: str, code: str
) -> None:
    """The stopped turn's agent message is closed: what its unfinished step streamed
    is kept (text only, here) and an error part gives the reason. The session idles."""
    response = await client.get(f"/v1/sessions/{sid}/messages/{message_id}")
    assert response.status_code == 200
    agent = response.json()
    assert agent["state"] == "done"
    kinds = [p["type"] for p in agent["content"]]
    assert kinds[-1] == "error", kinds
    assert set(kinds[:-1]) <= {"text"}, kinds
    assert agent["content"][-1]["code"] == code
    assert (await get_session(client, sid))["status"] == "idle"


# ---- the tests ---------------------------------------------------------------------------


async def test_turn_run_by_a_streams_to_clients_of_b(
    settings: Settings, tmp_path: Path
) -> None:
    async with two_servers(settings, tmp_path, SCRIPTED_DELAY_MS="20") as pair:
        sid, sse = await pair.watched_session()
        mutations = await pair.watch(f"/v1/sessions/{sid}/messages/stream?after=0")

        posted = await pair.start_turn(sid, "/scenario long 60")
        turn_id = posted["turn_id"]

        await sse.wait_for(lambda _: sse.has("session.idled"), "session.idled on B")
        agent_id = agent_id_of(sse)

        def agent_done(frames: list[Frame]) -> bool:
            return any(
                f.event == "message"
                and f.json()["message"]["id"] == agent_id
                and f.json()["message"]["state"] == "done"
                for f in frames
            )

        await mutations.wait_for(agent_done, "the closed agent message on B")

        # Upstream's stream on B: every durable event once, in order, with the deltas
        # of A's runner between output.message.started and output.message.completed.
        events = await list_events(pair.client_b, sid)
        assert events == await list_events(pair.client_a, sid)
        assert [f.json() for f in durable(sse.frames)] == events
        assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
        assert [e["type"] for e in events] == TURN_EVENTS
        assert all(e["context"].get("turn_id") == turn_id for e in events)
        names = [f.event for f in sse.frames]
        first_delta = names.index("output.message.delta")
        last_delta = len(names) - 1 - names[::-1].index("output.message.delta")
        assert names.index("output.message.started") < first_delta
        assert last_delta < names.index("output.message.completed")
        delta_frames = [f for f in sse.frames if f.event == "output.message.delta"]
        assert all(f.id is None for f in delta_frames)  # deltas are not resumable
        deltas = [f.json()["data"] for f in delta_frames]
        # The bus joins deltas of one part that queue up behind a NOTIFY (a run of
        # them within 5 ms): fewer frames under load, never a gap or a repeat.
        assert 1 <= len(deltas) <= 60
        accumulated = ""
        for delta in deltas:
            assert delta["message_id"] == agent_id
            assert delta["turn_id"] == turn_id
            assert delta["accumulated"] == accumulated + delta["delta"]
            accumulated = delta["accumulated"]
        assert accumulated == "".join(f"chunk{index} " for index in range(60))
        completed = events[4]["data"]["message"]
        assert text_of(completed) == accumulated
        assert events[5]["data"]["final_message_id"] == agent_id

        # The Mutation stream on B: snapshots, then the live part and its deltas with
        # contiguous offsets, then the closed snapshot.
        kinds = [f.event for f in mutations.frames]
        assert "reset" not in kinds
        parts = [f.json() for f in mutations.frames if f.event == "part"]
        assert len(parts) == 1
        part = parts[0]
        assert part["message_id"] == agent_id
        assert part["revision"] == 1
        assert part["part"]["type"] == "text"
        offset = len(part["part"]["text"])
        text = part["part"]["text"]
        mutation_deltas = [f.json() for f in mutations.frames if f.event == "delta"]
        assert mutation_deltas
        for delta in mutation_deltas:
            assert delta["message_id"] == agent_id
            assert delta["part_id"] == part["part"]["part_id"]
            assert delta["revision"] == 1
            assert delta["offset"] == offset, "a gap or overlap in the deltas"
            offset += len(delta["text"])
            text += delta["text"]
        assert text == accumulated
        assert kinds.index("part") < kinds.index("delta")
        snapshots = [
            f.json()["message"] for f in mutations.frames if f.event == "message"
        ]
        assert [(m["id"], m["revision"], m["state"]) for m in snapshots] == [
            (posted["id"], 1, "done"),
            (agent_id, 1, "streaming"),
            (agent_id, 2, "done"),
        ]
        last_snapshot = len(kinds) - 1 - kinds[::-1].index("message")
        assert kinds.index("part") < last_snapshot
        assert "delta" not in kinds[last_snapshot:]
        cursors = [int(f.id) for f in mutations.frames if f.id is not None]
        assert cursors == sorted(cursors)
        state: dict[str, dict[str, Any]] = {}
        merge_snapshots(state, mutations.frames)
        converged = sorted(state.values(), key=lambda m: m["sequence"])
        assert converged == (await list_messages(pair.client_b, sid))["data"]
        assert converged == (await list_messages(pair.client_a, sid))["data"]
        assert text_of(converged[-1]) == accumulated
        assert (await get_session(pair.client_b, sid))["status"] == "idle"


async def test_cancel_sent_to_b_stops_a_turn_running_on_a(
    settings: Settings, tmp_path: Path
) -> None:
    async with two_servers(settings, tmp_path, SCRIPTED_DELAY_MS="20") as pair:
        sid, sse = await pair.watched_session()
        turn_id = (await pair.start_turn(sid, "/scenario long 500"))["turn_id"]
        await sse.wait_for(lambda f: delta_count(f) >= 10, "deltas flowing on B")
        assert (await get_session(pair.client_b, sid))["status"] == "active"

        cancel_sent = time.monotonic()
        cancelled = await pair.client_b.post(f"/v1/sessions/{sid}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        await sse.wait_for(
            lambda _: sse.has("turn.cancelled"), "turn.cancelled", within=5.0
        )
        elapsed = time.monotonic() - cancel_sent
        assert elapsed < 2.5, f"the cancel took {elapsed:.2f}s to stop the turn"
        await sse.wait_for(lambda _: sse.has("session.idled"), "session.idled")

        events = await list_events(pair.client_b, sid)
        assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
        assert [e["type"] for e in events][-3:] == [
            "output.message.completed",
            "turn.cancelled",
            "session.idled",
        ]
        assert events[-2]["data"]["turn_id"] == turn_id
        assert events[-1]["data"]["turn_id"] == turn_id
        assert not any(e["type"] in ("turn.completed", "turn.failed") for e in events)
        assert [f.json() for f in durable(sse.frames)] == events

        for client in (pair.client_a, pair.client_b):
            await assert_stopped(client, sid, agent_id_of(sse), "cancelled")

        # The turn really stopped: it streamed far fewer than its 500 chunks, and no
        # delta follows the cancellation.
        names = [f.event for f in sse.frames]
        assert names.count("output.message.delta") < 500
        seen = len(sse.frames)
        await asyncio.sleep(0.5)
        assert "output.message.delta" not in [f.event for f in sse.frames[seen:]]
        assert "output.message.delta" not in names[names.index("turn.cancelled") :]

        again = await pair.client_b.post(f"/v1/sessions/{sid}/cancel")
        assert again.status_code == 200
        assert again.json()["status"] == "no_op"


async def test_steering_message_posted_to_b_joins_the_turn_on_a(
    settings: Settings, tmp_path: Path
) -> None:
    async with two_servers(settings, tmp_path, SCRIPTED_DELAY_MS="20") as pair:
        sid, sse = await pair.watched_session()
        posted = await pair.start_turn(sid, "/scenario long 80")
        turn_id = posted["turn_id"]
        await sse.wait_for(lambda f: delta_count(f) >= 5, "deltas flowing on B")

        steer = await post_message(
            pair.client_b, sid, "please also say banana", role="user"
        )
        assert steer["delivery"] == "steered"
        assert steer["turn_id"] == turn_id

        await sse.wait_for(lambda _: sse.has("session.idled"), "the turn to end")
        events = await list_events(pair.client_b, sid)
        assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
        types = [e["type"] for e in events]
        assert types.count("turn.started") == 1
        assert types.count("turn.completed") == 1
        assert types[-2:] == ["turn.completed", "session.idled"]
        inputs = [e for e in events if e["type"] == "input.message"]
        assert [e["data"]["message"]["id"] for e in inputs] == [
            posted["id"],
            steer["id"],
        ]
        assert all(e["context"].get("turn_id") == turn_id for e in events)

        messages = (await list_messages(pair.client_a, sid))["data"]
        assert messages == (await list_messages(pair.client_b, sid))["data"]
        agents = [m for m in messages if m["role"] == "agent"]
        assert agents
        assert all(m["state"] == "done" and m["turn_id"] == turn_id for m in agents)
        # A's runner saw the steering message and answered it within the same turn.
        texts = [p["text"] for m in agents for p in m["content"] if p["type"] == "text"]
        assert texts[0].startswith("chunk0 chunk1 ")
        assert texts[-1] == "please also say banana"
        assert (await get_session(pair.client_b, sid))["status"] == "idle"


async def test_b_recovers_a_turn_when_a_is_killed(
    settings: Settings, tmp_path: Path
) -> None:
    async with two_servers(
        settings, tmp_path, SCRIPTED_DELAY_MS="20", RUNNER_SWEEP_SECONDS="1"
    ) as pair:
        sid, sse = await pair.watched_session()
        turn_id = (await pair.start_turn(sid, "/scenario long 500"))["turn_id"]
        await sse.wait_for(lambda f: delta_count(f) >= 10, "deltas flowing on B")
        events_before = await list_events(pair.client_b, sid)

        pair.a.kill()
        killed = time.monotonic()
        await sse.wait_for(
            lambda _: sse.has("turn.failed"), "B to recover the turn", within=10.0
        )
        elapsed = time.monotonic() - killed
        assert elapsed < 6.0, f"recovery took {elapsed:.2f}s"
        await sse.wait_for(lambda _: sse.has("session.idled"), "session.idled")
        # No delta after the kill is attributed to a live runner: the stream stays up.
        assert not sse.ended

        events = await list_events(pair.client_b, sid)
        assert events[: len(events_before)] == events_before
        assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
        assert [e["type"] for e in events[len(events_before) :]] == [
            "output.message.completed",
            "turn.failed",
            "session.idled",
        ]
        failed = events[-2]
        assert failed["data"]["turn_id"] == turn_id
        assert failed["data"]["error_code"] == "interrupted"
        assert [f.json() for f in durable(sse.frames)] == events
        await assert_stopped(pair.client_b, sid, agent_id_of(sse), "interrupted")

        # B serves the session from now on: a new message runs a turn to completion.
        again = await post_message(pair.client_b, sid, "still here", role="user")
        assert again["delivery"] == "started"
        await sse.wait_for(
            lambda _: any(
                e["data"].get("turn_id") == again["turn_id"]
                for e in sse.events("turn.completed")
            ),
            "the new turn on B to complete",
        )
        messages = (await list_messages(pair.client_b, sid))["data"]
        assert text_of(messages[-1]) == "still here"
        assert messages[-1]["state"] == "done"
