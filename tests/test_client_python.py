"""The Python client (clients/python, `evermirror_client`) against a real server on each
lane: its calls and typed errors, `subscribe()` reconnecting with `Last-Event-ID` only,
and `sync()` converging to exactly `GET .../messages` while its stream is cut at random
moments of streaming turns. The server has an API key (every call proves it is sent)
and cycles its streams every second (reconnects happen as in production)."""

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from evermirror_client import (
    DeltaMutation,
    Evermirror,
    EvermirrorError,
    Message,
    MessageMutation,
    Mutation,
    OtherMutation,
    PartMutation,
    SessionMessagePage,
    SessionMutation,
    SyncView,
    TurnMutation,
    utf16_index,
    utf16_length,
)
from tests.support.servers import KeyedServer, keyed_server_fixture
from tests.support.waits import wait_until

pytestmark = pytest.mark.e2e

keyed_server = keyed_server_fixture(
    "python-client", SCRIPTED_DELAY_MS="10", SSE_CYCLE_SECONDS="1"
)

MISSING = "session_00000000000000000000000000000000"
STREAM_PATH = "/messages/stream"


# ---- a transport that records requests and cuts streams ------------------------------


class _CutStream(httpx.AsyncByteStream):
    """A response body that fails like a dropped connection after `after` seconds."""

    def __init__(self, inner: httpx.AsyncByteStream, after: float) -> None:
        self.inner = inner
        self.after = after

    async def __aiter__(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.after
        chunks = aiter(self.inner)
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise httpx.ReadError("connection dropped by the test")
            try:
                chunk = await asyncio.wait_for(anext(chunks), remaining)
            except TimeoutError:
                raise httpx.ReadError("connection dropped by the test") from None
            except StopAsyncIteration:
                return
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Arrival(httpx.AsyncByteStream):
    """A response body that calls `arrived` once its first chunk is read."""

    def __init__(self, inner: httpx.AsyncByteStream, arrived: Callable[[], None]):
        self.inner = inner
        self.arrived: Callable[[], None] | None = arrived

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            if self.arrived is not None:
                self.arrived()
                self.arrived = None
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class RecordingTransport(httpx.AsyncBaseTransport):
    """Records every request, and counts the Mutation stream connections whose first
    frame arrived (`subscribed`: the service sends it once the stream is subscribed);
    when `cut` is given, each such connection is dropped after `cut()` seconds (None:
    left alone)."""

    def __init__(self, cut: Callable[[], float | None] | None = None) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.cut = cut
        self.requests: list[httpx.Request] = []
        self.subscribed = 0

    def streams(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path.endswith(STREAM_PATH)]

    def _arrived(self) -> None:
        self.subscribed += 1

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith(STREAM_PATH):
            return response
        assert isinstance(response.stream, httpx.AsyncByteStream)
        body: httpx.AsyncByteStream = _Arrival(response.stream, self._arrived)
        after = self.cut() if self.cut else None
        if after is not None:
            body = _CutStream(body, after)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=body,
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


@contextlib.asynccontextmanager
async def make_client(
    server: KeyedServer,
    transport: httpx.AsyncBaseTransport | None = None,
    **options: Any,
) -> AsyncIterator[Evermirror]:
    """A client of `server`; over `transport` when given (its httpx client is this
    one's to close: the client closes only one it made itself)."""
    async with contextlib.AsyncExitStack() as stack:
        http = None
        if transport is not None:
            http = await stack.enter_async_context(
                httpx.AsyncClient(transport=transport)
            )
        async with Evermirror(
            base_url=server.url,
            api_key=server.api_key,
            http_client=http,
            retry_seconds=0.02,
            **options,
        ) as client:
            yield client


async def wait_idle(session: Any, within: float = 20.0) -> None:
    async def idle() -> bool:
        return bool((await session.get())["status"] == "idle")

    await wait_until(idle, f"{session.id} to be idle", within)


async def next_until(
    stream: AsyncIterator[Mutation],
    done: Callable[[list[Mutation]], bool],
    within: float = 15.0,
) -> list[Mutation]:
    """Mutations of `stream` until `done(seen)` holds."""
    seen: list[Mutation] = []
    async with asyncio.timeout(within):
        async for mutation in stream:
            seen.append(mutation)
            if done(seen):
                return seen
    raise AssertionError(f"the stream ended: {seen}")


def agent_done(seen: list[Mutation], count: int = 1) -> bool:
    return (
        sum(
            isinstance(m, MessageMutation)
            and m.message["role"] == "agent"
            and m.message["state"] == "done"
            for m in seen
        )
        >= count
    )


# ---- calls and errors ---------------------------------------------------------------


async def test_pages_follow_the_seed_and_walk_back(keyed_server: KeyedServer) -> None:
    async with make_client(keyed_server) as client:
        session = await client.create_session(title="pages")
        assert session.info is not None
        assert session.info["title"] == "pages"
        for word in ("one", "two", "three"):
            sent = await session.send(word)
            assert sent["delivery"] == "started"
            await wait_idle(session)
        page = await session.messages(limit=4)
        assert isinstance(page, SessionMessagePage)
        assert page.total == 6
        assert page.has_more
        assert len(page.items) == 4
        assert page.start_sequence == page.items[0]["sequence"]
        assert page.end_sequence == page.items[-1]["sequence"]
        assert page.next_before_sequence == page.start_sequence
        assert page.cursor is not None
        assert page.cursor.isdigit()
        older = await session.messages(
            limit=4, before_sequence=page.next_before_sequence
        )
        assert not older.has_more
        assert older.next_before_sequence is None
        texts = [m["content"][0]["text"] for m in [*older.items, *page.items]]
        assert texts == ["one", "one", "two", "two", "three", "three"]
        raw = await client.http.get(
            f"{keyed_server.url}/v1/sessions/{session.id}/messages",
            params={"limit": 4},
            headers={"Authorization": f"Bearer {keyed_server.api_key}"},
        )
        assert page.items == raw.json()["data"]


async def test_pin_archive_and_feedback(keyed_server: KeyedServer) -> None:
    async with make_client(keyed_server) as client:
        session = await client.create_session(title="marks")
        await session.send("rate this")
        await wait_idle(session)
        await session.pin()
        await session.archive()
        info = await session.get()
        assert info["is_pinned"] is True
        assert "archived_at" in info
        listed = await client.list_sessions(archived_only=True)
        assert [s["id"] for s in listed["data"]] == [session.id]
        found = await client.search("RATE this", limit=1)
        assert [h["session_id"] for h in found["data"]] == [session.id]
        assert "<mark>rate</mark> <mark>this</mark>" in found["data"][0]["snippet_html"]
        assert "next_url" in found
        await session.pin(False)
        await session.archive(False)
        info = await session.get()
        assert info["is_pinned"] is False
        assert "archived_at" not in info
        agent = (await session.messages()).items[1]["id"]
        rated = await session.rate(agent, "good", "clear")
        assert (rated["rating"], rated["comment"]) == ("good", "clear")
        assert [f["message_id"] for f in await session.feedback()] == [agent]
        await session.rate(agent, None)
        assert await session.feedback() == []


async def test_errors_carry_the_problem_fields(keyed_server: KeyedServer) -> None:
    async with make_client(keyed_server) as client:
        with pytest.raises(EvermirrorError) as caught:
            await client.session(MISSING).messages()
        error = caught.value
        assert error.status == 404
        assert error.code == "session_not_found"
        assert error.title == "Not Found"
        assert error.detail == f"Session {MISSING} not found" == str(error)
        assert error.type == "https://docs.everruns.com/errors/session_not_found"
        assert error.request_id is not None
        assert len(error.request_id) == 32
        assert not error.retryable

        with pytest.raises(EvermirrorError) as caught:
            await client.session("sess_1").get()
        assert (caught.value.status, caught.value.code) == (400, "invalid_id")

        session = await client.create_session()
        with pytest.raises(EvermirrorError) as caught:
            await session.send([])
        assert caught.value.status == 422
        assert caught.value.errors

        first = await session.send("hello", client_message_id="c-1")
        again = await session.send("hello", client_message_id="c-1")
        assert again["delivery"] == "duplicate"
        assert again["id"] == first["id"]
        with pytest.raises(EvermirrorError) as caught:
            await session.send("other", client_message_id="c-1")
        assert caught.value.code == "client_message_id_conflict"
        await wait_idle(session)

    async with Evermirror(base_url=keyed_server.url) as keyless:
        with pytest.raises(EvermirrorError) as caught:
            await keyless.list_sessions()
        assert (caught.value.status, caught.value.code) == (401, "unauthorized")


async def test_cancel_stops_the_turn(keyed_server: KeyedServer) -> None:
    async with make_client(keyed_server) as client:
        session = await client.create_session()
        await session.send("/scenario long 500")

        # Cancelled while the reply streams (a turn cancelled before its reply began
        # has no agent message at all).
        async def streaming() -> bool:
            return bool((await session.messages()).items[-1]["state"] == "streaming")

        await wait_until(streaming, "the reply to stream")
        assert (await session.cancel())["status"] == "cancelled"
        await wait_idle(session)
        agent = (await session.messages()).items[-1]
        assert agent["role"] == "agent"
        assert agent["state"] == "done"
        assert any(p["type"] == "error" for p in agent["content"])
        assert (await session.cancel())["status"] == "no_op"


async def test_send_and_wait_answers_with_the_finished_turn(
    keyed_server: KeyedServer,
) -> None:
    async with make_client(keyed_server) as client:
        session = await client.create_session()
        result = await session.send_and_wait("hello and wait")
        assert result.status == "completed"
        assert result.error is None
        assert result.message["delivery"] == "started"
        assert result.messages == [(await session.messages()).items[-1]]
        failed = await session.send_and_wait("/scenario fail")
        assert failed.status == "failed"
        assert failed.error is not None
        assert failed.error["code"] == "model_error"
        late = await session.send_and_wait("/scenario long 100000", timeout_ms=100)
        assert (late.status, late.messages) == ("timeout", [])
        assert late.message["delivery"] == "started"
        await session.cancel()
        await wait_idle(session)
        with pytest.raises(EvermirrorError) as refused:
            await session.send_and_wait("never stored", timeout_ms=0)
        assert refused.value.code == "invalid_parameter"


async def test_tool_results_and_approvals(keyed_server: KeyedServer) -> None:
    weather = {
        "type": "client_side",
        "name": "get_weather",
        "description": "The weather",
        "parameters": {"type": "object"},
    }
    guarded = {
        "type": "builtin",
        "name": "lookup",
        "description": "Look something up",
        "parameters": {"type": "object"},
        "policy": "requires_approval",
    }
    async with make_client(keyed_server) as client:
        session = await client.create_session(tools=[weather, guarded])
        await session.send('/scenario call get_weather {"city": "Kyiv"}')

        async def waiting() -> bool:
            return bool((await session.get())["status"] == "waitingfortoolresults")

        await wait_until(waiting, "the session to wait for the tool result")
        agent = (await session.messages()).items[-1]
        call = next(p for p in agent["content"] if p["type"] == "tool_call")
        answer = await session.submit_tool_results(
            [{"tool_call_id": call["id"], "result": "sunny"}]
        )
        assert answer == {"accepted": 1, "status": "active"}
        await wait_idle(session)

        await session.send('/scenario call lookup {"query": "tea"}')

        async def asked() -> bool:
            return bool(await session.interactions("pending"))

        await wait_until(asked, "a pending approval")
        (pending,) = await session.interactions("pending")
        decided = await session.respond(pending["interaction_id"], "deny", "no")
        assert decided["status"] == "denied"
        await wait_idle(session)
        with pytest.raises(EvermirrorError) as caught:
            await session.respond(pending["interaction_id"], "approve")
        assert caught.value.code == "interaction_resolved"


async def test_send_and_wait_answers_waiting_for_the_client(
    keyed_server: KeyedServer,
) -> None:
    weather = {
        "type": "client_side",
        "name": "get_weather",
        "description": "The weather",
        "parameters": {"type": "object"},
    }
    guarded = {
        "type": "builtin",
        "name": "lookup",
        "description": "Look something up",
        "parameters": {"type": "object"},
        "policy": "requires_approval",
    }
    async with make_client(keyed_server) as client:
        session = await client.create_session(tools=[weather, guarded])
        tools = await session.send_and_wait(
            '/scenario call get_weather {"city": "Oslo"}'
        )
        assert (tools.status, tools.waiting_for) == ("waiting", "tool_results")
        (call,) = [p for p in tools.messages[-1]["content"] if p["type"] == "tool_call"]
        assert call["name"] == "get_weather"
        await session.submit_tool_results(
            [{"tool_call_id": call["id"], "result": "ok"}]
        )
        await wait_idle(session)
        ask = await session.send_and_wait('/scenario call lookup {"query": "tea"}')
        assert (ask.status, ask.waiting_for) == ("waiting", "approval")
        (pending,) = await session.interactions("pending")
        await session.respond(pending["interaction_id"], "approve")
        await wait_idle(session)
        done = await session.send_and_wait("and now")
        assert (done.status, done.waiting_for) == ("completed", None)


# ---- subscribe() --------------------------------------------------------------------


async def test_subscribe_delivers_a_turn_continuously(
    keyed_server: KeyedServer,
) -> None:
    transport = RecordingTransport()
    async with make_client(keyed_server, transport) as client:
        session = await client.create_session()
        statuses: list[str] = []
        async with session.subscribe(on_status=statuses.append) as stream:
            # Subscribed before posting: nothing of the turn can be missed.
            first = asyncio.ensure_future(anext(stream))
            await wait_until(
                lambda: transport.subscribed == 1, "the stream's first frame"
            )
            await session.send("/scenario long 20")
            seen = [await asyncio.wait_for(first, 10)]
            seen += await next_until(stream, lambda s: agent_done(seen + s))
        assert stream.status == "closed"
        assert statuses == ["open", "closed"]
        # Every Mutation carries the frame's common fields, as the JS client's do.
        for mutation in seen:
            assert not isinstance(mutation, OtherMutation), mutation
            assert mutation.session_id == session.id, mutation
            assert mutation.created_at, mutation
            assert mutation.mutation_id, mutation
        deltas = [m for m in seen if isinstance(m, DeltaMutation)]
        assert {m.kind for m in deltas} == {"text"}
        text = ""
        for mutation in seen:
            if isinstance(mutation, PartMutation) and mutation.part["type"] == "text":
                text = mutation.part["text"]
            elif isinstance(mutation, DeltaMutation):
                assert mutation.offset == utf16_length(text)
                text += mutation.text
        final = [m for m in seen if isinstance(m, MessageMutation)][-1].message
        assert any(isinstance(m, DeltaMutation) for m in seen)
        assert text == final["content"][0]["text"]
        # The turn's and the session's changes arrive typed.
        turns = [m for m in seen if isinstance(m, TurnMutation)]
        assert [(t.turn_id, t.status) for t in turns] == [(final["turn_id"], "running")]
        changes = [m.changes for m in seen if isinstance(m, SessionMutation)]
        assert changes == [{"status": "active"}]


async def next_snapshot(stream: Any) -> MessageMutation:
    """The next `message` Mutation (the turn and session ones of the first turn may
    come first)."""
    while True:
        mutation = await anext(stream)
        if isinstance(mutation, MessageMutation):
            return mutation


async def test_subscribe_resumes_with_last_event_id_only(
    keyed_server: KeyedServer,
) -> None:
    transport = RecordingTransport()
    async with make_client(keyed_server, transport) as client:
        session = await client.create_session()
        await session.send("before")
        await wait_idle(session)
        async with session.subscribe(after="0") as stream:
            seen = await next_until(stream, agent_done)
            # Waiting for the next Mutation keeps the stream going: SSE_CYCLE_SECONDS=1
            # (±20 %) closes it, and it is reopened, twice within a few seconds.
            pending = asyncio.ensure_future(next_snapshot(stream))
            await wait_until(lambda: len(transport.streams()) >= 3, "two reconnects")
            await session.send("after")
            seen.append(await asyncio.wait_for(pending, 10))
            seen += await next_until(stream, lambda s: agent_done(seen + s, 2))
        first, *reconnects = transport.streams()
        assert first.url.params.get("after") == "0"
        assert "last-event-id" not in first.headers
        assert first.headers["authorization"] == f"Bearer {keyed_server.api_key}"
        for request in reconnects:
            assert "after" not in request.url.params, request.url
            assert request.headers["last-event-id"].isdigit()
        revisions = [
            (m.message["id"], m.message["revision"])
            for m in seen
            if isinstance(m, MessageMutation)
        ]
        assert len(revisions) == len(set(revisions)), revisions


async def test_subscribe_refused_raises_without_retrying(
    keyed_server: KeyedServer,
) -> None:
    transport = RecordingTransport()
    async with make_client(keyed_server, transport) as client:
        stream = client.session(MISSING).subscribe()
        with pytest.raises(EvermirrorError) as caught:
            await asyncio.wait_for(anext(stream), 10)
        assert caught.value.code == "session_not_found"
        assert stream.status == "closed"
        assert len(transport.streams()) == 1


# ---- sync() -------------------------------------------------------------------------


async def listed(session: Any) -> list[Message]:
    page: SessionMessagePage = await session.messages(limit=200)
    return page.items


async def converged(view: SyncView, session: Any) -> list[Message]:
    await wait_idle(session)
    expected = await listed(session)
    try:
        await view.wait_for(lambda messages: messages == expected, timeout=10)
    except TimeoutError:
        assert view.messages == expected, view.status
    return expected


def record_live_text(view: SyncView) -> list[tuple[str, str, str]]:
    shown: list[tuple[str, str, str]] = []

    def record(_: SyncView) -> None:
        for message in view.messages:
            for part in message["content"]:
                if isinstance(part.get("text"), str):
                    shown.append((message["id"], part["part_id"], part["text"]))

    view.on_change(record)
    return shown


def assert_prefixes(shown: list[tuple[str, str, str]], messages: list[Message]) -> None:
    """Every text the view showed is a prefix of its part's committed text: nothing
    was applied twice, out of place, or invented."""
    final: dict[tuple[str, str], Any] = {}
    for message in messages:
        for part in message["content"]:
            text = part.get("text")
            final[message["id"], part["part_id"]] = (
                text.get("text") if isinstance(text, dict) else text
            )
    for message_id, part_id, text in shown:
        committed = final.get((message_id, part_id))
        assert isinstance(committed, str), (message_id, part_id)
        assert committed.startswith(text), (text, committed)


async def test_sync_loads_the_window_then_follows_live(
    keyed_server: KeyedServer,
) -> None:
    async with make_client(keyed_server) as client:
        session = await client.create_session()
        await session.send("an earlier turn")
        await wait_idle(session)
        async with session.sync() as view:
            opened = view.status
            assert opened == "live"
            assert view.messages == await listed(session)
            shown = record_live_text(view)
            await session.send("/scenario long 30")
            expected = await converged(view, session)
            assert_prefixes(shown, expected)
            reply = expected[-1]
            partial = [
                t
                for i, _, t in shown
                if i == reply["id"] and t != reply["content"][0]["text"]
            ]
            assert len(partial) > 3, partial
        assert view.status == "closed"


async def test_sync_refused_raises_and_a_deleted_session_closes_it(
    keyed_server: KeyedServer,
) -> None:
    async with make_client(keyed_server) as client:
        with pytest.raises(EvermirrorError) as caught:
            await client.session(MISSING).sync()
        assert caught.value.code == "session_not_found"
        session = await client.create_session()
        view = await session.sync()
        await session.delete()
        await wait_until(lambda: view.status == "closed", "the view to close")
        assert isinstance(view.error, EvermirrorError)
        assert view.error.code == "session_not_found"
        with pytest.raises(EvermirrorError):
            await view.wait_for(lambda messages: True)
        await view.aclose()


async def test_sync_loads_older_pages(keyed_server: KeyedServer) -> None:
    async with make_client(keyed_server) as client:
        session = await client.create_session()
        for turn in range(4):
            await session.send(f"turn {turn}")
            await wait_idle(session)
        view = await session.sync(limit=3)
        try:
            assert len(view.messages) == 3
            assert view.has_more
            assert await view.load_older() == 3
            assert await view.load_older() == 2
            assert not view.has_more
            assert await view.load_older() == 0
            await session.send("one more")
            assert len(await converged(view, session)) == 10
        finally:
            await view.aclose()


async def test_sync_converges_despite_random_disconnects(
    keyed_server: KeyedServer,
) -> None:
    seed = random.randrange(100_000)
    chooser = random.Random(seed)
    transport = RecordingTransport(cut=lambda: 0.01 + chooser.random() * 0.3)
    async with make_client(keyed_server, transport) as client:
        session = await client.create_session()
        scenarios = (
            "/scenario long 40",
            "/scenario tool",
            "/scenario reasoning",
            "/scenario long 25",
        )
        async with session.sync() as view:
            shown = record_live_text(view)
            # Every scenario once, then more turns (at most eight) until the stream
            # has been cut at least four times: how many cuts a turn sees depends on
            # how fast the server runs it.
            for turn in range(len(scenarios) + 8):
                if turn >= len(scenarios) and len(transport.streams()) >= 5:
                    break
                await session.send(scenarios[turn % len(scenarios)])
                expected = await converged(view, session)
                assert_prefixes(shown, expected)
        streams = transport.streams()
        assert len(streams) >= 5, f"seed {seed}: {len(streams)} connections"
        for request in streams[1:]:
            assert "after" not in request.url.params, f"seed {seed}"


class _OpenBody(httpx.AsyncByteStream):
    """A stream body that sends `body` and then stays open, as a live stream does."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.body
        await asyncio.Event().wait()


async def test_a_disconnecting_frame_means_reconnect_now() -> None:
    """The server announces a cycle with `disconnecting` and its `retry_ms`: the client
    reconnects after that pause, from its cursor, though the old body is still open."""
    snapshot = b'{"message": {"id": "message_1", "sequence": 1, "revision": 1}}'
    bodies = [
        b"retry: 5000\nevent: message\nid: 12\ndata: " + snapshot + b"\n\n"
        b'event: disconnecting\ndata: {"reason":"connection_cycle","retry_ms":60}\n\n',
        b": ping\n\n",
    ]
    loop = asyncio.get_running_loop()
    requests: list[tuple[httpx.Request, float]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append((request, loop.time()))
        body = bodies[min(len(requests), len(bodies)) - 1]
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=_OpenBody(body)
        )

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    async with Evermirror(
        base_url="http://evermirror.test", http_client=http
    ) as client:
        stream = client.session("session_x").subscribe(after="0")
        first = await asyncio.wait_for(anext(stream), 5)
        assert isinstance(first, MessageMutation)
        assert first.cursor == "12"
        pending = asyncio.ensure_future(anext(stream))
        await wait_until(lambda: len(requests) >= 2, "the reconnect", within=5)
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pending
        await stream.aclose()
    await http.aclose()
    (first_request, first_at), (second_request, second_at) = requests[:2]
    assert first_request.url.params["after"] == "0"
    assert "after" not in second_request.url.params
    assert second_request.headers["last-event-id"] == "12"
    # retry_ms of the frame, not the 5 s of `retry:`, and not at once either.
    assert 0.055 <= second_at - first_at < 2


def test_utf16_offsets_convert_to_python_indices() -> None:
    # Delta offsets count UTF-16 units: an emoji is one str character but two units.
    assert utf16_length("hi") == 2
    assert utf16_length("hi 😀") == 5
    assert utf16_length("🇺🇦") == 4
    assert utf16_index("a😀b", 1) == 1
    assert utf16_index("a😀b", 3) == 2
    assert utf16_index("a😀b", 10) == 3
    assert utf16_index("abc", 2) == 2
