"""Two server processes on one PostgreSQL database (DESIGN.md 3.2, 3.3).

The bus is PostgreSQL LISTEN/NOTIFY and the runner lease an advisory lock, so a client of
process B sees, steers and cancels a turn that process A runs, and B takes over the
recovery of A's turn when A dies.
"""

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.conftest import Server, start_server

pytestmark = pytest.mark.postgres_only

TEST_DEADLINE = 90.0
WAIT = 15.0


@pytest.fixture
def pg_settings(settings: Settings) -> Settings:
    if not os.environ.get("TEST_DATABASE_URL") or not settings.database_url.startswith(
        "postgresql"
    ):
        pytest.skip("needs PostgreSQL (set TEST_DATABASE_URL)")
    return settings


# ---- a small SSE client ---------------------------------------------------------------


@dataclass
class Frame:
    event: str
    data: str
    id: str | None

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class SSEReader:
    """Reads one SSE response in a background task and records every frame."""

    client: httpx.AsyncClient
    url: str
    frames: list[Frame] = field(default_factory=list)
    status: int | None = None
    error: BaseException | None = None
    ended: bool = False
    _task: asyncio.Task[None] | None = None
    _opened: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> "SSEReader":
        self._task = asyncio.create_task(self._run())
        async with asyncio.timeout(WAIT):
            await self._opened.wait()
        assert self.status == 200, f"{self.url}: status {self.status} ({self.error})"
        return self

    async def _run(self) -> None:
        try:
            async with self.client.stream(
                "GET", self.url, timeout=httpx.Timeout(10.0, read=30.0)
            ) as response:
                self.status = response.status_code
                self._opened.set()
                event, data, frame_id = "", [], None
                async for line in response.aiter_lines():
                    if line == "":
                        if data or event:
                            self.frames.append(
                                Frame(event or "message", "\n".join(data), frame_id)
                            )
                        event, data, frame_id = "", [], None
                    elif line.startswith(":"):
                        continue
                    else:
                        name, _, value = line.partition(":")
                        value = value.removeprefix(" ")
                        if name == "event":
                            event = value
                        elif name == "data":
                            data.append(value)
                        elif name == "id":
                            frame_id = value
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self.ended = True
            self._opened.set()

    def events(self, name: str) -> list[dict[str, Any]]:
        return [f.json() for f in self.frames if f.event == name]

    def has(self, name: str) -> bool:
        return any(f.event == name for f in self.frames)

    async def wait_for(
        self, predicate: Callable[[list[Frame]], bool], what: str, within: float = WAIT
    ) -> None:
        deadline = time.monotonic() + within
        while not predicate(self.frames):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {within}s waiting for {what}; "
                    f"{len(self.frames)} frames: {[f.event for f in self.frames][-20:]}"
                )
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


# ---- helpers ---------------------------------------------------------------------------


async def wait_until(
    check: Callable[[], Awaitable[bool]], what: str, within: float = WAIT
) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.05)


async def create_session(client: httpx.AsyncClient) -> str:
    response = await client.post("/v1/sessions", json={"title": "multiprocess"})
    assert response.status_code == 201, response.text
    sid: str = response.json()["id"]
    return sid


async def post_text(client: httpx.AsyncClient, sid: str, text: str) -> dict[str, Any]:
    response = await client.post(
        f"/v1/sessions/{sid}/messages",
        json={"message": {"role": "user", "content": [{"type": "text", "text": text}]}},
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def list_events(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/sessions/{sid}/events")
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


async def list_messages(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/sessions/{sid}/messages")
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


async def session_status(client: httpx.AsyncClient, sid: str) -> str:
    response = await client.get(f"/v1/sessions/{sid}")
    assert response.status_code == 200, response.text
    status: str = response.json()["status"]
    return status


def text_of(message: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in message["content"] if p["type"] == "text")


def durable_sequences(reader: SSEReader) -> list[int]:
    return [f.json()["sequence"] for f in reader.frames if f.id is not None]


async def start(database_url: str, tmp_path: Path, **env: str) -> Server:
    return await asyncio.to_thread(start_server, database_url, tmp_path, **env)


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


@contextlib.asynccontextmanager
async def two_servers(
    settings: Settings, tmp_path: Path, **env: str
) -> AsyncIterator[Pair]:
    servers: list[Server] = []
    try:
        servers.append(await start(settings.database_url, tmp_path, **env))
        servers.append(await start(settings.database_url, tmp_path, **env))
        async with (
            httpx.AsyncClient(base_url=servers[0].url, timeout=10) as client_a,
            httpx.AsyncClient(base_url=servers[1].url, timeout=10) as client_b,
        ):
            pair = Pair(servers[0], servers[1], client_a, client_b)
            try:
                yield pair
            finally:
                for reader in pair.readers:
                    await reader.close()
    finally:
        for server in servers:
            server.kill()


def agent_id_of(reader: SSEReader) -> str:
    started = reader.events("output.message.started")
    assert started, "no output.message.started yet"
    message_id: str = started[0]["data"]["message_id"]
    return message_id


def delta_count(frames: list[Frame]) -> int:
    return sum(f.event == "output.message.delta" for f in frames)


# ---- the tests ---------------------------------------------------------------------------


async def test_turn_run_by_a_streams_to_clients_of_b(
    pg_settings: Settings, tmp_path: Path
) -> None:
    async with (
        asyncio.timeout(TEST_DEADLINE),
        two_servers(pg_settings, tmp_path, SCRIPTED_DELAY_MS="20") as pair,
    ):
        sid = await create_session(pair.client_a)
        sse = await pair.watch(f"/v1/sessions/{sid}/sse?after_sequence=0")
        mutations = await pair.watch(f"/v1/sessions/{sid}/messages/stream?after=0")

        posted = await post_text(pair.client_a, sid, "/scenario long 60")
        assert posted["delivery"] == "started"
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
        durable = [f.json() for f in sse.frames if f.id is not None]
        assert durable == events
        assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
        assert [e["type"] for e in events] == [
            "input.message",
            "session.activated",
            "turn.started",
            "output.message.started",
            "output.message.completed",
            "turn.completed",
            "session.idled",
        ]
        assert all(e["context"].get("turn_id") == turn_id for e in events)
        names = [f.event for f in sse.frames]
        first_delta = names.index("output.message.delta")
        last_delta = len(names) - 1 - names[::-1].index("output.message.delta")
        assert names.index("output.message.started") < first_delta
        assert last_delta < names.index("output.message.completed")
        delta_frames = [f for f in sse.frames if f.event == "output.message.delta"]
        assert all(f.id is None for f in delta_frames)  # deltas are not resumable
        deltas = [f.json()["data"] for f in delta_frames]
        assert len(deltas) == 60
        accumulated = ""
        for index, delta in enumerate(deltas):
            assert delta["message_id"] == agent_id
            assert delta["turn_id"] == turn_id
            assert delta["delta"] == f"chunk{index} "
            accumulated += delta["delta"]
            assert delta["accumulated"] == accumulated
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
        for message in snapshots:
            if message["id"] not in state or (
                message["revision"] > state[message["id"]]["revision"]
            ):
                state[message["id"]] = message
        converged = sorted(state.values(), key=lambda m: m["sequence"])
        assert converged == await list_messages(pair.client_b, sid)
        assert converged == await list_messages(pair.client_a, sid)
        assert text_of(converged[-1]) == accumulated
        assert await session_status(pair.client_b, sid) == "idle"


async def test_cancel_sent_to_b_stops_a_turn_running_on_a(
    pg_settings: Settings, tmp_path: Path
) -> None:
    async with (
        asyncio.timeout(TEST_DEADLINE),
        two_servers(pg_settings, tmp_path, SCRIPTED_DELAY_MS="20") as pair,
    ):
        sid = await create_session(pair.client_a)
        sse = await pair.watch(f"/v1/sessions/{sid}/sse?after_sequence=0")
        posted = await post_text(pair.client_a, sid, "/scenario long 500")
        assert posted["delivery"] == "started"
        turn_id = posted["turn_id"]
        await sse.wait_for(lambda f: delta_count(f) >= 10, "deltas flowing on B")
        assert await session_status(pair.client_b, sid) == "active"

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
        assert [f.json() for f in sse.frames if f.id is not None] == events

        agent_id = agent_id_of(sse)
        for client in (pair.client_a, pair.client_b):
            response = await client.get(f"/v1/sessions/{sid}/messages/{agent_id}")
            assert response.status_code == 200
            agent = response.json()
            assert agent["state"] == "done"
            # The unfinished step is discarded; the stop reason is an error part.
            assert [p["type"] for p in agent["content"]] == ["error"]
            assert agent["content"][0]["code"] == "cancelled"
            assert await session_status(client, sid) == "idle"

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
    pg_settings: Settings, tmp_path: Path
) -> None:
    async with (
        asyncio.timeout(TEST_DEADLINE),
        two_servers(pg_settings, tmp_path, SCRIPTED_DELAY_MS="20") as pair,
    ):
        sid = await create_session(pair.client_a)
        sse = await pair.watch(f"/v1/sessions/{sid}/sse?after_sequence=0")
        posted = await post_text(pair.client_a, sid, "/scenario long 80")
        assert posted["delivery"] == "started"
        turn_id = posted["turn_id"]
        await sse.wait_for(lambda f: delta_count(f) >= 5, "deltas flowing on B")

        steer = await post_text(pair.client_b, sid, "please also say banana")
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

        messages = await list_messages(pair.client_a, sid)
        assert messages == await list_messages(pair.client_b, sid)
        agents = [m for m in messages if m["role"] == "agent"]
        assert agents
        assert all(m["state"] == "done" and m["turn_id"] == turn_id for m in agents)
        # A's runner saw the steering message and answered it within the same turn.
        texts = [p["text"] for m in agents for p in m["content"] if p["type"] == "text"]
        assert texts[0].startswith("chunk0 chunk1 ")
        assert texts[-1] == "please also say banana"
        assert await session_status(pair.client_b, sid) == "idle"


async def test_b_recovers_a_turn_when_a_is_killed(
    pg_settings: Settings, tmp_path: Path
) -> None:
    async with (
        asyncio.timeout(TEST_DEADLINE),
        two_servers(
            pg_settings, tmp_path, SCRIPTED_DELAY_MS="20", RUNNER_SWEEP_SECONDS="1"
        ) as pair,
    ):
        sid = await create_session(pair.client_a)
        sse = await pair.watch(f"/v1/sessions/{sid}/sse?after_sequence=0")
        posted = await post_text(pair.client_a, sid, "/scenario long 500")
        assert posted["delivery"] == "started"
        turn_id = posted["turn_id"]
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
        assert [f.json() for f in sse.frames if f.id is not None] == events

        agent_id = agent_id_of(sse)
        response = await pair.client_b.get(f"/v1/sessions/{sid}/messages/{agent_id}")
        assert response.status_code == 200
        agent = response.json()
        assert agent["state"] == "done"
        assert [p["type"] for p in agent["content"]] == ["error"]
        assert agent["content"][0]["code"] == "interrupted"
        assert await session_status(pair.client_b, sid) == "idle"

        # B serves the session from now on: a new message runs a turn to completion.
        again = await post_text(pair.client_b, sid, "still here")
        assert again["delivery"] == "started"
        await sse.wait_for(
            lambda _: any(
                e["data"].get("turn_id") == again["turn_id"]
                for e in sse.events("turn.completed")
            ),
            "the new turn on B to complete",
        )
        messages = await list_messages(pair.client_b, sid)
        assert text_of(messages[-1]) == "still here"
        assert messages[-1]["state"] == "done"
