"""The graceful drain (app/ops/drain.py) on real server processes sent SIGTERM: new turns
and streams are refused while it lasts, open streams are told to reconnect elsewhere,
short turns finish where they run, a long one is handed to another process (PostgreSQL)
and completes there, and the process exits cleanly within DRAIN_SECONDS and a margin.
"""

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.support.api import (
    all_messages,
    create_session,
    list_events,
    post_message,
    text_of,
)
from tests.support.problems import assert_problem
from tests.support.servers import Server, server_process
from tests.support.sse import Frame, SSEStream, open_stream
from tests.support.waits import wait_idle

TEST_DEADLINE = 60.0
# How long past DRAIN_SECONDS a drained process may take to exit: uvicorn's own
# shutdown and the lifespan's, on a busy machine.
EXIT_MARGIN = 6.0


def long_text(count: int) -> str:
    """What `/scenario long N` answers."""
    return "".join(f"chunk{i} " for i in range(count))


def sigterm(server: Server) -> float:
    server.process.send_signal(signal.SIGTERM)
    return time.monotonic()


async def exits(server: Server, within: float) -> int:
    code = await asyncio.to_thread(server.process.wait, within)
    return code


class Follower:
    """A Mutation stream client as the seed describes one: newest snapshot per message,
    live parts by id (a `part` frame replaces one, a `delta` extends it at its offset),
    and `Last-Event-ID` (the last `id:`) when it reconnects."""

    def __init__(self) -> None:
        self.messages: dict[str, dict[str, Any]] = {}
        self.parts: dict[str, str] = {}
        self.last_id: str | None = None
        self.frames: list[Frame] = []

    def apply(self, frame: Frame) -> None:
        self.frames.append(frame)
        if frame.id is not None:
            self.last_id = frame.id
        if frame.event == "message":
            message = frame.json()["message"]
            current = self.messages.get(message["id"])
            if current is None or message["revision"] > current["revision"]:
                self.messages[message["id"]] = message
        elif frame.event == "part":
            part = frame.json()["part"]
            self.parts[part["part_id"]] = part.get("text", "")
        elif frame.event == "delta":
            body = frame.json()
            text = self.parts.get(body["part_id"], "")
            assert body["offset"] <= len(text), f"a gap before {body}"
            self.parts[body["part_id"]] = text[: body["offset"]] + body["text"]

    async def follow(self, stream: SSEStream, until: Any, within: float) -> None:
        deadline = time.monotonic() + within
        while True:
            frame = await stream.next(deadline - time.monotonic())
            if frame is None:
                return
            self.apply(frame)
            if until(self):
                return

    def agent_done(self) -> bool:
        return any(
            m["role"] == "agent" and m["state"] == "done"
            for m in self.messages.values()
        )


@asynccontextmanager
async def mutations(
    client: httpx.AsyncClient, sid: str, last_id: str | None = None
) -> AsyncIterator[SSEStream]:
    headers = {"Last-Event-ID": last_id} if last_id else {}
    async with open_stream(
        client, f"/v1/sessions/{sid}/messages/stream", headers=headers
    ) as stream:
        assert stream.status_code == 200, stream.response.text
        yield stream


@pytest.mark.postgres_only
async def test_sigterm_mid_turn_hands_the_turn_and_its_streams_to_the_other_process(
    settings: Settings, tmp_path: Path
) -> None:
    """A turn that outlasts the drain: the client following it on the drained process
    is told `disconnecting`, resumes on the other process with Last-Event-ID, and ends
    with exactly what GET .../messages answers; the other process takes the turn over
    at once and completes it, with the whole reply once."""
    database_url = settings.database_url
    count = 80
    env = {"DRAIN_SECONDS": "1", "SCRIPTED_DELAY_MS": "40", "LOG_LEVEL": "info"}
    async with (
        asyncio.timeout(TEST_DEADLINE),
        server_process(database_url, tmp_path, kill=True, **env) as a,
        server_process(database_url, tmp_path, kill=True, **env) as b,
        httpx.AsyncClient(base_url=a.url, timeout=10) as client_a,
        httpx.AsyncClient(base_url=b.url, timeout=10) as client_b,
    ):
        sid = await create_session(client_a, "drain")
        follower = Follower()
        async with mutations(client_a, sid) as stream:
            posted = await post_message(client_a, sid, f"/scenario long {count}")
            assert posted["delivery"] == "started"
            await follower.follow(
                stream,
                lambda f: sum(x.event == "delta" for x in f.frames) >= 5,
                within=10,
            )
            signalled = sigterm(a)
            await follower.follow(stream, lambda f: False, within=5)
        told = [f for f in follower.frames if f.event == "disconnecting"]
        assert told, [f.event for f in follower.frames]
        assert told[-1].json()["retry_ms"] <= 1000
        assert not follower.agent_done()

        async with mutations(client_b, sid, follower.last_id) as stream:
            await follower.follow(stream, Follower.agent_done, within=30)

        assert await exits(a, 1 + EXIT_MARGIN) == 0
        assert time.monotonic() - signalled < 1 + EXIT_MARGIN
        await wait_idle(client_b, sid)
        stored = await all_messages(client_b, sid)
        assert sorted(follower.messages.values(), key=lambda m: m["sequence"]) == (
            stored
        )
        agents = [m for m in stored if m["role"] == "agent"]
        assert len(agents) == 1
        assert text_of(agents[0]) == long_text(count)
        # The live text the client assembled was the reply, once.
        assert list(follower.parts.values()) == [long_text(count)]
        types = [e["type"] for e in await list_events(client_b, sid)]
        assert types.count("turn.completed") == 1
        assert "turn.failed" not in types
        log = a.log.read_text()
        assert "draining: 1 turn(s) running" in log, log
        assert "0 turn(s) finished, 1 interrupted (handed over)" in log, log
        assert "turn resumed" in b.log.read_text()


async def test_a_turn_shorter_than_the_drain_finishes_before_the_process_exits(
    database_url: str, tmp_path: Path
) -> None:
    env = {"DRAIN_SECONDS": "8", "SCRIPTED_DELAY_MS": "30", "LOG_LEVEL": "info"}
    async with asyncio.timeout(TEST_DEADLINE):
        async with (
            server_process(database_url, tmp_path, kill=True, **env) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as client,
        ):
            sid = await create_session(client, "drain")
            posted = await post_message(client, sid, "/scenario long 40")
            assert posted["delivery"] == "started"
            signalled = sigterm(server)
            assert await exits(server, 8 + EXIT_MARGIN) == 0
            # Done well before DRAIN_SECONDS: the drain ends when its turns do.
            assert time.monotonic() - signalled < 8
            log = server.log.read_text()
            assert "1 turn(s) finished, 0 interrupted" in log, log
        async with (
            server_process(database_url, tmp_path, kill=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as client,
        ):
            stored = await all_messages(client, sid)
            agents = [m for m in stored if m["role"] == "agent"]
            assert [m["state"] for m in agents] == ["done"]
            assert text_of(agents[0]) == long_text(40)
            types = [e["type"] for e in await list_events(client, sid)]
            assert "turn.completed" in types
            assert "turn.failed" not in types


async def test_while_draining_new_turns_and_streams_are_refused_and_ready_is_503(
    database_url: str, tmp_path: Path
) -> None:
    """A drain held open by a long turn: new streams (both kinds) and a message that
    would start a turn are 503 problem+json with Retry-After, /ready is 503 `draining`
    and /health 200; a message that steers the running turn is accepted. The process
    then exits cleanly within DRAIN_SECONDS and a margin."""
    drain_seconds = 3
    env = {
        "DRAIN_SECONDS": str(drain_seconds),
        "SCRIPTED_DELAY_MS": "100",
        "LOG_LEVEL": "info",
    }
    async with (
        asyncio.timeout(TEST_DEADLINE),
        server_process(database_url, tmp_path, kill=True, **env) as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as client,
    ):
        busy = await create_session(client, "drain")
        idle = await create_session(client, "drain")
        async with open_stream(client, f"/v1/sessions/{busy}/sse") as stream:
            await post_message(client, busy, "/scenario long 200")
            signalled = sigterm(server)
            # The open stream is told to go, with the short retry hint.
            frames = await stream.drain(within=5)
            told = [f for f in frames if f.event == "disconnecting"]
            assert [f.json()["reason"] for f in told] == ["connection_cycle"]
            assert (await client.get("/health")).status_code == 200
            ready = await client.get("/ready")
            assert_problem(ready, 503, code="draining")
            for path in (
                f"/v1/sessions/{busy}/sse",
                f"/v1/sessions/{busy}/messages/stream",
                f"/api/v1/sessions/{idle}/sse",
                f"/v1/sessions/{idle}/messages/stream?after=0",
            ):
                async with open_stream(client, path) as refused:
                    assert_problem(refused.response, 503, code="draining")
                    assert refused.response.headers["retry-after"] == "1"
            started = await client.post(
                f"/v1/sessions/{idle}/messages",
                json={"message": {"content": [{"type": "text", "text": "hi"}]}},
            )
            body = assert_problem(started, 503, code="draining")
            assert started.headers["retry-after"] == "1"
            assert body["retry_after_seconds"] == 1
            steered = await post_message(client, busy, "and this too")
            assert steered["delivery"] == "steered"
            assert time.monotonic() - signalled < drain_seconds
        assert await exits(server, drain_seconds + EXIT_MARGIN) == 0
        assert time.monotonic() - signalled < drain_seconds + EXIT_MARGIN
        log = server.log.read_text()
        assert "0 turn(s) finished, 1 interrupted" in log, log
        assert "Traceback" not in log, log
