"""Stream lifecycle and limits: disconnecting never cancels a turn and cancel does;
connection limits answer 429; heartbeats and connection cycling keep their pace; an
open stream never holds a pooled database connection while it waits."""

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.live.streams import StreamConfig, message_mutations, upstream_events
from app.settings import Settings
from tests.support.api import (
    create_session,
    get_session,
    list_events,
    list_messages,
    post_message,
    uuid_of,
)
from tests.support.in_process import Running
from tests.support.problems import assert_too_many
from tests.support.servers import (
    Server,
    api_fixture,
    live_server_fixture,
    server_process,
    start_server,
)
from tests.support.sse import (
    DELTA,
    Frame,
    SSEStream,
    agent_done,
    events,
    expect_connected,
    is_delta,
    is_idled,
    open_stream,
    session_streams,
)
from tests.support.waits import wait_idle, wait_until

live_server = live_server_fixture("stream-limits", SCRIPTED_DELAY_MS="10")
api = api_fixture()


# ---- stop is not disconnect -----------------------------------------------------------


async def test_disconnecting_mid_turn_does_not_cancel_it(
    api: httpx.AsyncClient,
) -> None:
    sid = await create_session(api)
    async with session_streams(api, sid) as (sse, mutations):
        await post_message(api, sid, "/scenario long 40")
        for _ in range(3):
            await sse.until(is_delta, 10)
        await mutations.until(lambda f: f.event == "delta", 10)
        assert (await get_session(api, sid))["status"] == "active"
    # Every client is gone mid-stream; the turn runs to its end regardless.
    await wait_idle(api, sid)
    names = [e["type"] for e in await list_events(api, sid)]
    assert names[-2:] == ["turn.completed", "session.idled"]
    assert "turn.cancelled" not in names
    assert "turn.failed" not in names
    agent = (await list_messages(api, sid))["data"][-1]
    assert agent["state"] == "done"
    assert [p["type"] for p in agent["content"]] == ["text"]
    assert agent["content"][0]["text"] == "".join(f"chunk{i} " for i in range(40))


async def test_cancel_stops_the_turn_and_closes_the_message_with_an_error(
    api: httpx.AsyncClient,
) -> None:
    sid = await create_session(api)
    async with open_stream(api, f"/v1/sessions/{sid}/sse") as sse:
        await expect_connected(sse)
        posted = await post_message(api, sid, "/scenario long 500")
        for _ in range(3):
            await sse.until(is_delta, 10)
        cancelled = await api.post(f"/v1/sessions/{sid}/cancel")
        assert cancelled.status_code == 200
        assert cancelled.json()["status"] == "cancelled"
        tail = events(await sse.until(is_idled, 10))
    durable = [f for f in tail if f.event != DELTA]
    assert [f.event for f in durable] == [
        "output.message.completed",
        "turn.cancelled",
        "session.idled",
    ]
    completed = durable[0].json()["data"]
    assert completed["error_code"] == "cancelled"
    closing = completed["message"]
    assert closing["state"] == "done"
    assert closing["content"][-1]["type"] == "error"
    assert closing["content"][-1]["code"] == "cancelled"
    outcome = durable[1].json()["data"]
    assert outcome["turn_id"] == posted["turn_id"]
    assert "reason" in outcome

    session = await wait_idle(api, sid, within=5)
    assert session["status"] == "idle"
    agent = (await list_messages(api, sid))["data"][-1]
    assert agent == closing
    # What the unfinished step streamed is kept, then the error part.
    assert [p["type"] for p in agent["content"]] == ["text", "error"]
    assert agent["content"][0]["text"].startswith("chunk0 chunk1 chunk2 ")
    names = [e["type"] for e in await list_events(api, sid)]
    assert "turn.completed" not in names
    again = await api.post(f"/v1/sessions/{sid}/cancel")
    assert again.status_code == 200
    assert again.json()["status"] == "no_op"


# ---- connection limits ----------------------------------------------------------------


@contextlib.asynccontextmanager
async def own_server(
    settings: Settings, tmp_path: Path, **env: str
) -> AsyncIterator[httpx.AsyncClient]:
    """A server of the test's own, configured by `env`, and a client of it."""
    async with (
        server_process(settings.database_url, tmp_path, kill=False, **env) as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as api,
    ):
        yield api


async def open_until_admitted(
    api: httpx.AsyncClient, url: str, within: float = 10.0, count: int = 1
) -> None:
    """The server frees a slot when it notices the disconnect: retry until `count`
    streams of `url` are admitted at once."""
    deadline = time.monotonic() + within
    while True:
        async with contextlib.AsyncExitStack() as stack:
            streams = [
                await stack.enter_async_context(open_stream(api, url))
                for _ in range(count)
            ]
            statuses = [stream.status_code for stream in streams]
            if statuses == [200] * count:
                return
            assert set(statuses) <= {200, 429}, statuses
        assert time.monotonic() < deadline, f"{url} still refused"
        await asyncio.sleep(0.1)


async def test_per_session_stream_limit(settings: Settings, tmp_path: Path) -> None:
    async with own_server(settings, tmp_path, SSE_MAX_PER_SESSION="2") as api:
        sid = await create_session(api)
        other = await create_session(api)
        sse = f"/v1/sessions/{sid}/sse"
        mutations = f"/v1/sessions/{sid}/messages/stream"
        async with (
            open_stream(api, sse) as first,
            open_stream(api, mutations) as second,
        ):
            assert (first.status_code, second.status_code) == (200, 200)
            for url in (sse, mutations):
                async with open_stream(api, url) as refused:
                    assert_too_many(
                        refused.response,
                        detail="per-session SSE connection limit reached (open streams and waits)",
                    )
            # Another session has slots of its own.
            async with open_stream(api, f"/v1/sessions/{other}/sse") as elsewhere:
                assert elsewhere.status_code == 200
            # Refusals did not take a slot: the open streams still work.
            await post_message(api, sid, "still live")
            await first.until(is_idled, 10)
        # Closed streams give their slots back: both of them.
        await open_until_admitted(api, sse, count=2)


async def test_per_process_stream_limit(settings: Settings, tmp_path: Path) -> None:
    async with own_server(settings, tmp_path, SSE_MAX_PER_PROCESS="3") as api:
        sids = [await create_session(api) for _ in range(4)]
        async with (
            open_stream(api, f"/v1/sessions/{sids[0]}/sse") as a,
            open_stream(api, f"/v1/sessions/{sids[1]}/messages/stream") as b,
            open_stream(api, f"/v1/sessions/{sids[2]}/sse") as c,
        ):
            assert [s.status_code for s in (a, b, c)] == [200, 200, 200]
            for url in (
                f"/v1/sessions/{sids[3]}/sse",
                f"/v1/sessions/{sids[3]}/messages/stream",
                f"/v1/sessions/{sids[0]}/sse",
            ):
                async with open_stream(api, url) as refused:
                    assert_too_many(
                        refused.response,
                        detail="SSE connection limit for this server reached (open streams and waits)",
                    )
        await open_until_admitted(api, f"/v1/sessions/{sids[3]}/sse")


# ---- heartbeats and connection cycling ------------------------------------------------

HEARTBEAT = 0.5
CYCLE = 3.0


@pytest.fixture
def paced_server(settings: Settings, tmp_path: Path) -> Iterator[Server]:
    server = start_server(
        settings.database_url,
        tmp_path,
        SSE_HEARTBEAT_SECONDS=str(HEARTBEAT),
        SSE_CYCLE_SECONDS=str(CYCLE),
    )
    yield server
    server.stop()


def heartbeat_times(stream: SSEStream, frames: list[Frame], text: str) -> list[float]:
    times = [f.received_at for f in frames if f.is_comment and text in f.comments]
    return [stream.opened_at, *times]


def assert_paced(times: list[float]) -> None:
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(gaps) >= 3, gaps
    # The first gap also counts the connection set-up, the rest are the interval.
    for gap in gaps:
        assert HEARTBEAT * 0.5 <= gap <= HEARTBEAT * 1.5, gaps


async def test_sse_heartbeats_and_connection_cycle(paced_server: Server) -> None:
    async with httpx.AsyncClient(base_url=paced_server.url, timeout=10) as api:
        sid = await create_session(api)
        async with open_stream(api, f"/v1/sessions/{sid}/sse") as stream:
            frames = await stream.drain(CYCLE * 1.2 + 3)
            assert stream.closed
            ended = time.monotonic()
    assert frames[0].event == "connected"
    # `retry:` on the first frame and on the last: a quiet stream sends no other.
    assert frames[0].retry == 100
    assert_paced(heartbeat_times(stream, frames, "heartbeat"))
    last = frames[-1]
    assert last.event == "disconnecting"
    assert last.id is None
    assert last.retry == 100
    assert last.json() == {"reason": "connection_cycle", "retry_ms": 100}
    elapsed = last.received_at - stream.opened_at
    assert CYCLE * 0.8 - 0.1 <= elapsed <= CYCLE * 1.2 + 0.5, elapsed
    # The server closes right after saying so.
    assert ended - last.received_at < 1.0
    assert [f.event for f in events(frames)] == ["connected", "disconnecting"]


async def test_mutation_stream_keepalive_and_cycle(paced_server: Server) -> None:
    async with httpx.AsyncClient(base_url=paced_server.url, timeout=10) as api:
        sid = await create_session(api)
        async with open_stream(api, f"/v1/sessions/{sid}/messages/stream") as stream:
            frames = await stream.drain(CYCLE * 1.2 + 3)
            ended = time.monotonic()
    # A quiet Mutation stream opens with `retry:` alone (a block that is no event, so
    # an EventSource dispatches nothing), carries keep-alive comments only, then cycles
    # as `/sse` does: `disconnecting` with `retry:`, and the close right after it.
    first = frames[0]
    assert (first.retry, first.event, first.data, first.comments) == (
        100,
        None,
        None,
        [],
    )
    assert [f.event for f in events(frames)] == ["disconnecting"]
    comments = {text for f in frames for text in f.comments}
    assert comments == {"ping"}, comments
    assert_paced(heartbeat_times(stream, frames, "ping"))
    last = frames[-1]
    assert last.event == "disconnecting"
    assert last.id is None
    assert last.retry == 100
    assert last.json() == {"reason": "connection_cycle", "retry_ms": 100}
    elapsed = last.received_at - stream.opened_at
    assert CYCLE * 0.8 - 0.1 <= elapsed <= CYCLE * 1.2 + 0.5, elapsed
    assert ended - last.received_at < 1.0


# ---- streams hold no database connection while they wait -------------------------------


async def test_open_streams_hold_no_pooled_connection(running: Running) -> None:
    state = running.app.state.app
    database = state.database
    reader, writer = database.reader.pool, database.writer.pool
    sid = await create_session(running.client)
    session_uuid = uuid_of(sid)
    baseline = (reader.checkedout(), writer.checkedout())
    config = StreamConfig(retry_ms=100, cycle_seconds=60)
    streams: list[AsyncGenerator[bytes, None]] = []
    for index in range(20):
        common: dict[str, Any] = {
            "database": database,
            "fanout": state.fanout,
            "session_id": session_uuid,
            "config": config,
            "release": state.limits.acquire(session_uuid, "sse").release,
        }
        stream = (
            message_mutations(**common, after=0, include_internal=False)
            if index % 2
            else upstream_events(**common, cursor=None, accept=lambda _: True)
        )
        streams.append(stream)
    received: list[list[bytes]] = [[] for _ in streams]

    async def consume(stream: AsyncGenerator[bytes, None], out: list[bytes]) -> None:
        async for chunk in stream:
            out.append(chunk)

    consumers = [
        asyncio.create_task(consume(stream, out))
        for stream, out in zip(streams, received, strict=True)
    ]

    async def settle(predicate: Callable[[], bool], what: str) -> None:
        await wait_until(predicate, what, within=10, interval=0.02)

    try:
        await settle(
            lambda: state.fanout.count(session_uuid) == 20, "20 streams subscribed"
        )
        await settle(
            lambda: all(received[i] for i in range(0, 20, 2)), "`connected` frames"
        )

        # A stream's start reads once (its cursor, its replay) and gives the
        # connection back; on a loaded machine the last of those may still run, or
        # not have begun when another ended: wait for a quiet 0.3 s.
        def pooled() -> tuple[int, int]:
            return (reader.checkedout(), writer.checkedout())

        async def quiet() -> bool:
            if pooled() != baseline:
                return False
            await asyncio.sleep(0.3)
            return pooled() == baseline

        await wait_until(quiet, "the streams' start-up reads to end", within=10)
        assert not any(task.done() for task in consumers)
        assert (reader.checkedout(), writer.checkedout()) == baseline

        # A turn wakes every stream; once it is over they wait again, holding nothing.
        await post_message(running.client, sid, "wake every stream")
        await wait_idle(running.client, sid)

        def all_saw_the_end() -> bool:
            for index, out in enumerate(received):
                marker = (
                    b"event: session.idled" if index % 2 == 0 else b'"state":"done"'
                )
                if not any(marker in chunk for chunk in out):
                    return False
            return True

        await settle(all_saw_the_end, "every stream saw the end of the turn")
        # The turn's last writes each wake the streams for one shared read; on a
        # loaded machine the last of those can come after a first quiet moment.
        await wait_until(quiet, "the pool back to its baseline", within=10)
        assert not any(task.done() for task in consumers)
        assert state.fanout.count(session_uuid) == 20
        assert (reader.checkedout(), writer.checkedout()) == baseline
    finally:
        for task in consumers:
            task.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
    assert state.fanout.count(session_uuid) == 0
    assert state.limits.total == 0


async def test_twenty_streams_over_http_leave_the_pool_free(
    settings: Settings, tmp_path: Path
) -> None:
    """More open streams than the pool has connections (SQLite readers: 16; PostgreSQL:
    2 here), and the service still answers and runs a turn."""
    async with own_server(
        settings,
        tmp_path,
        DB_POOL_SIZE="2",
        DB_MAX_OVERFLOW="0",
        DB_POOL_TIMEOUT_SECONDS="3",
    ) as api:
        sid = await create_session(api)
        urls = [
            f"/v1/sessions/{sid}/sse"
            if i % 2 == 0
            else f"/v1/sessions/{sid}/messages/stream"
            for i in range(20)
        ]
        async with contextlib.AsyncExitStack() as stack:
            streams = [
                await stack.enter_async_context(open_stream(api, u)) for u in urls
            ]
            assert all(s.status_code == 200 for s in streams)
            started = time.monotonic()
            listed = await api.get(f"/v1/sessions/{sid}/messages")
            assert listed.status_code == 200
            assert time.monotonic() - started < 2
            await post_message(api, sid, "twenty listeners")
            for index, stream in enumerate(streams):
                await stream.until(is_idled if index % 2 == 0 else agent_done, 15)
            await wait_idle(api, sid)
