"""A full turn over real HTTP against a server process: upstream's `/sse` (order, ids,
delta payloads, filters, replay) and the Mutation stream (snapshots, parts, deltas).

Plus one generator-level check of the `/sse` contract that `connected` means
"subscribed": an event committed after the client saw `connected` is delivered."""

import asyncio
import json
import uuid
from typing import Any

import httpx

from tests.support.api import (
    TOOL_TURN_EVENTS,
    TURN_EVENTS,
    create_session,
    list_events,
    list_messages,
    post_message,
    uuid_of,
)
from tests.support.in_process import Running
from tests.support.servers import api_fixture, live_server_fixture
from tests.support.sse import (
    DELTA,
    Frame,
    agent_done,
    durable,
    events,
    expect_connected,
    frame_names,
    is_idled,
    open_stream,
    session_streams,
)
from tests.support.waits import wait_idle

TEXT = "the quick brown fox jumps over the lazy dog"

# One real server process per lane for this module; every test uses its own sessions.
live_server = live_server_fixture("live-turn")
api = api_fixture()


async def run_turn_on_sse(
    api: httpx.AsyncClient, text: str
) -> tuple[str, dict[str, Any], list[Frame]]:
    """Subscribe to `/sse`, post `text`, read until `session.idled`."""
    sid = await create_session(api)
    async with open_stream(api, f"/v1/sessions/{sid}/sse") as stream:
        assert stream.status_code == 200
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        first = await expect_connected(stream)
        assert first.id is None
        assert first.json() == {"status": "connected"}
        posted = await post_message(api, sid, text)
        frames = await stream.until(is_idled, 20)
    return sid, posted, [first, *frames]


async def test_turn_events_arrive_in_upstream_order(api: httpx.AsyncClient) -> None:
    sid, posted, frames = await run_turn_on_sse(api, TEXT)
    evs = events(frames)
    assert evs[0].event == "connected"
    body = evs[1:]
    names = [f.event for f in body]
    # Durable events in upstream's order, deltas only between started and completed.
    assert [n for n in names if n != DELTA] == TURN_EVENTS
    started = names.index("output.message.started")
    completed = names.index("output.message.completed")
    assert set(names[started + 1 : completed]) == {DELTA}
    assert DELTA not in names[:started] + names[completed:]
    assert completed - started - 1 == len(TEXT.split(" "))

    # `id:` only on durable events, equal to the envelope's id; sequences dense from 1.
    for frame in body:
        envelope = frame.json()
        assert envelope["type"] == frame.event
        assert envelope["session_id"] == sid
        assert frame.retry == 100
        if frame.event == DELTA:
            assert frame.id is None
            assert "sequence" not in envelope
        else:
            assert frame.id is not None
            assert frame.id.startswith("event_")
            assert frame.id == envelope["id"]
    sequences = [f.json()["sequence"] for f in body if f.event != DELTA]
    assert sequences == list(range(1, len(TURN_EVENTS) + 1))

    # Deltas carry the chunk and the text so far; `completed` carries the message.
    turn_id = posted["turn_id"]
    message_id = body[started].json()["data"]["message_id"]
    accumulated = ""
    for frame in body[started + 1 : completed]:
        data = frame.json()["data"]
        assert data["message_id"] == message_id
        assert data["turn_id"] == turn_id
        accumulated += data["delta"]
        assert data["accumulated"] == accumulated
    assert accumulated == TEXT
    message = body[completed].json()["data"]["message"]
    assert message["id"] == message_id
    assert message["state"] == "done"
    assert [p["type"] for p in message["content"]] == ["text"]
    assert message["content"][0]["text"] == TEXT
    by_name = {f.event: f.json()["data"] for f in body if f.event != DELTA}
    assert by_name["input.message"]["message"]["id"] == posted["id"]
    assert by_name["turn.started"]["input_message_id"] == posted["id"]
    assert by_name["turn.completed"]["final_message_id"] == message_id
    assert by_name["turn.completed"]["turn_id"] == turn_id
    assert by_name["session.idled"]["turn_id"] == turn_id

    # The stream's durable events are exactly the log, and `completed` the stored message.
    log = await list_events(api, sid)
    assert [f.json() for f in durable(body)] == log
    listed = await list_messages(api, sid)
    assert listed["data"][-1] == message


async def test_mutation_stream_shows_a_turn_and_ends_at_the_listed_snapshot(
    api: httpx.AsyncClient,
) -> None:
    sid = await create_session(api)
    async with open_stream(api, f"/v1/sessions/{sid}/messages/stream") as stream:
        assert stream.status_code == 200
        posted = await post_message(api, sid, TEXT)
        frames = await stream.until(agent_done, 20)
    # The message changes (the turn and session frames have a test of their own).
    frames = [f for f in events(frames) if f.event in ("message", "part", "delta")]
    kinds = [f.event for f in frames]
    # user snapshot, agent opened, its text part, the deltas, the closing snapshot.
    assert kinds[:3] == ["message", "message", "part"]
    assert set(kinds[3:-1]) == {"delta"}
    assert kinds[-1] == "message"

    user = frames[0].json()["message"]
    assert user["id"] == posted["id"]
    assert (user["role"], user["revision"], user["state"]) == ("user", 1, "done")
    opened = frames[1].json()["message"]
    assert opened["role"] == "agent"
    assert (opened["revision"], opened["state"], opened["content"]) == (
        1,
        "streaming",
        [],
    )
    part = frames[2].json()
    assert part["message_id"] == opened["id"]
    assert part["revision"] == 1
    assert part["part"]["type"] == "text"
    assert part["part"]["text"] == ""
    part_id = part["part"]["part_id"]

    text = ""
    for frame in frames[3:-1]:
        delta = frame.json()
        assert frame.id is None
        assert delta["message_id"] == opened["id"]
        assert delta["revision"] == 1
        assert delta["part_id"] == part_id
        assert delta["offset"] == len(text), "offsets must be contiguous"
        assert delta["kind"] == "text"
        assert delta["mutation_id"] == f"{opened['id']}/1/{part_id}/{len(text)}"
        text += delta["text"]
    assert text == TEXT

    final = frames[-1].json()["message"]
    assert final["id"] == opened["id"]
    assert (final["revision"], final["state"]) == (2, "done")
    assert [(p["part_id"], p["text"]) for p in final["content"]] == [(part_id, TEXT)]
    # `id:` on message frames is the cursor: increasing event sequences.
    cursors = [int(f.id) for f in frames if f.event == "message" and f.id is not None]
    assert len(cursors) == 3
    assert cursors == sorted(cursors)
    assert len(set(cursors)) == 3
    # Every Mutation says which session, when, and its own identity.
    for frame in frames:
        body = frame.json()
        assert body["session_id"] == sid
        assert body["created_at"].endswith("Z")
    assert [f.json()["mutation_id"] for f in frames[:3]] == [
        f"{posted['id']}/1",
        f"{opened['id']}/1",
        f"{opened['id']}/1/{part_id}",
    ]
    assert frames[-1].json()["mutation_id"] == f"{opened['id']}/2"

    await wait_idle(api, sid)
    listed = await list_messages(api, sid)
    assert listed["data"] == [user, final]
    assert int(listed["cursor"]) >= cursors[-1]


def is_idle_session(frame: Frame) -> bool:
    return frame.event == "session" and frame.json().get("status") == "idle"


async def test_mutation_stream_says_how_the_turn_and_the_session_change(
    api: httpx.AsyncClient,
) -> None:
    sid = await create_session(api)
    async with open_stream(api, f"/v1/sessions/{sid}/messages/stream") as stream:
        posted = await post_message(api, sid, TEXT)
        live = events(await stream.until(is_idle_session, 20))
    turn_id = posted["turn_id"]
    changes = [
        (f.event, f.json().get("status"))
        for f in live
        if f.event in ("turn", "session")
    ]
    assert changes == [
        ("session", "active"),
        ("turn", "running"),
        ("turn", "completed"),
        ("session", "idle"),
    ]
    turns = [f.json() for f in live if f.event == "turn"]
    assert {t["turn_id"] for t in turns} == {turn_id}
    assert [t["mutation_id"] for t in turns] == [
        f"{turn_id}/running",
        f"{turn_id}/completed",
    ]
    for frame in live:
        if frame.event in ("turn", "session"):
            assert frame.id is None, "the cursor stays with message checkpoints"
            assert frame.json()["session_id"] == sid
    # A client that sees the turn end already has the message that ended it.
    names = [f.event for f in live]
    completed = names.index("turn", names.index("turn") + 1)
    final = [f for f in live[:completed] if f.event == "message"][-1].json()["message"]
    assert (final["role"], final["state"]) == ("agent", "done")

    # A reconnect from the start replays the same changes, under the same ids.
    async with open_stream(
        api, f"/v1/sessions/{sid}/messages/stream?after=0"
    ) as stream:
        replayed = events(await stream.until(is_idle_session, 20))
    live_ids = [f.json()["mutation_id"] for f in live if f.event != "delta"]
    replayed_ids = [f.json()["mutation_id"] for f in replayed if f.event != "part"]
    assert set(replayed_ids) <= set(live_ids)
    assert [i for i in live_ids if "/running" in i or "/completed" in i] == [
        i for i in replayed_ids if "/running" in i or "/completed" in i
    ]
    assert replayed_ids[-1] == live_ids[-1]


async def test_tool_turn_order_and_tool_part_transitions(
    api: httpx.AsyncClient,
) -> None:
    sid = await create_session(api)
    async with session_streams(api, sid) as (sse, mutations):
        await post_message(api, sid, "/scenario tool weather in Paris")
        sse_frames = await sse.until(is_idled, 20)
        await wait_idle(api, sid)
        mutation_frames = events(await mutations.until(agent_done, 10))

    names = [f.event for f in events(sse_frames)]
    assert [n for n in names if n != DELTA] == TOOL_TURN_EVENTS
    first_completed = names.index("output.message.completed")
    tool_started = names.index("tool.started")
    tool_completed = names.index("tool.completed")
    assert first_completed < tool_started < tool_completed
    # Text before the tool call, and the answer after its result.
    assert DELTA in names[:first_completed]
    assert DELTA in names[tool_completed:]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for frame in events(sse_frames):
        by_name.setdefault(frame.event or "", []).append(frame.json()["data"])
    started = by_name["tool.started"][0]["tool_call"]
    done = by_name["tool.completed"][0]
    assert started["id"] == done["tool_call_id"] == "call_lookup_1"
    assert started["name"] == done["tool_name"] == "lookup"
    # Upstream's ToolCompleted: status success|error, the result as content parts.
    assert done["status"] == "success"
    assert done["success"] is True
    assert [part["type"] for part in done["result"]] == ["text"]
    assert json.loads(done["result"][0]["text"]) == {
        "query": "weather in Paris",
        "answer": 42,
    }

    # The Mutation stream: the tool_call part keeps its part_id through every status.
    tool_parts: list[tuple[int, str, str]] = []
    for frame in mutation_frames:
        body = frame.json()
        if frame.event == "part" and body["part"]["type"] == "tool_call":
            tool_parts.append((body["revision"], body["part"]["part_id"], "live"))
            assert body["part"]["status"] == "ready"
        if frame.event == "message" and body["message"]["role"] == "agent":
            message = body["message"]
            calls = [p for p in message["content"] if p["type"] == "tool_call"]
            assert len(calls) <= 1, "a tool transition must not duplicate its part"
            for call in calls:
                tool_parts.append(
                    (message["revision"], call["part_id"], call["status"])
                )
    assert len({part_id for _, part_id, _ in tool_parts}) == 1
    statuses = [status for _, _, status in tool_parts]
    assert statuses[0] == "live"
    # ready (step committed) -> running -> completed, never backwards. Snapshots
    # that commit close together may reach a live subscriber as the latest one only.
    rank = {"ready": 0, "running": 1, "completed": 2}
    observed = [rank[status] for status in statuses[1:]]
    assert observed == sorted(observed)
    assert statuses[-1] == "completed"
    revisions = [revision for revision, _, status in tool_parts if status != "live"]
    assert revisions == sorted(revisions)
    assert len(set(revisions)) == len(revisions)

    listed = await list_messages(api, sid)
    agent = listed["data"][-1]
    assert mutation_frames[-1].json()["message"] == agent
    assert [p["type"] for p in agent["content"]] == [
        "text",
        "tool_call",
        "tool_result",
        "text",
    ]
    assert agent["content"][2]["tool_call_id"] == "call_lookup_1"
    assert agent["state"] == "done"


async def test_types_and_exclude_filter_live_and_replay(
    api: httpx.AsyncClient,
) -> None:
    sid = await create_session(api)
    base = f"/v1/sessions/{sid}/sse"
    async with (
        open_stream(api, base, params={"exclude": DELTA}) as no_deltas,
        open_stream(
            api, base, params=[("types", DELTA), ("types", "session.idled")]
        ) as only_deltas,
    ):
        for stream in (no_deltas, only_deltas):
            await expect_connected(stream)
        await post_message(api, sid, TEXT)
        without = events(await no_deltas.until(is_idled, 20))
        only = events(await only_deltas.until(is_idled, 20))
    assert [f.event for f in without] == TURN_EVENTS
    assert [f.event for f in only] == [DELTA] * len(TEXT.split(" ")) + ["session.idled"]

    # Filters apply to replay too.
    replay_params = [
        ("after_sequence", "0"),
        ("types", "turn.started"),
        ("types", "turn.completed"),
        ("types", "session.idled"),
    ]
    async with open_stream(api, base, params=replay_params) as stream:
        replayed = events(await stream.until(is_idled, 10))
    assert [f.event for f in replayed] == [
        "connected",
        "turn.started",
        "turn.completed",
        "session.idled",
    ]
    async with open_stream(
        api, base, params={"after_sequence": "0", "exclude": "input.message"}
    ) as stream:
        replayed = events(await stream.until(is_idled, 10))
    assert [f.event for f in replayed] == ["connected", *TURN_EVENTS[1:]]

    # Unknown names are refused before streaming.
    for params in ({"types": "message.created"}, {"exclude": "nope"}):
        async with open_stream(api, base, params=params) as refused:
            assert refused.status_code == 400
            assert refused.response.headers["content-type"].startswith(
                "application/problem+json"
            )
            assert refused.response.json()["status"] == 400


async def test_cursors_replay_exactly_the_missing_durable_events(
    api: httpx.AsyncClient,
) -> None:
    sid, _, frames = await run_turn_on_sse(api, TEXT)
    log = await list_events(api, sid)
    assert [f.json() for f in durable(frames)] == log
    base = f"/v1/sessions/{sid}/sse"

    async def replay(
        params: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        async with open_stream(api, base, params=params, headers=headers) as stream:
            await expect_connected(stream)
            # Replay is followed by the live tail: nothing more arrives but heartbeats.
            got = await stream.collect(0.4)
        assert all(f.is_comment or f.id is not None for f in got)
        return [f.json() for f in events(got)]

    assert await replay({"after_sequence": "0"}) == log
    for cut in (0, 2, len(log) - 2, len(log) - 1):
        missing = log[cut + 1 :]
        assert await replay({"since_id": log[cut]["id"]}) == missing
        assert await replay(headers={"Last-Event-ID": log[cut]["id"]}) == missing
        assert await replay({"after_sequence": str(log[cut]["sequence"])}) == missing
    # The header wins over a query cursor: an EventSource reconnects to the URL it was
    # opened with and sends the last id it saw, the newer position.
    for params in ({"since_id": log[0]["id"]}, {"after_sequence": "0"}):
        assert await replay(params, headers={"Last-Event-ID": log[3]["id"]}) == log[4:]

    # Bad cursors are refused before streaming.
    bad = [
        {"since_id": log[0]["id"], "after_sequence": "0"},
        {"after_sequence": "-1"},
        {"since_id": "event_" + uuid.uuid4().hex},
        {"since_id": "evt_123"},
    ]
    for params in bad:
        async with open_stream(api, base, params=params) as refused:
            assert refused.status_code == 400, params
            assert refused.response.json()["status"] == 400


async def test_reconnect_mid_turn_with_cursor_loses_and_repeats_nothing(
    api: httpx.AsyncClient,
) -> None:
    """A client that drops mid-turn and resumes with the last `id:` it saw gets every
    durable event exactly once across its two connections."""
    sid = await create_session(api)
    base = f"/v1/sessions/{sid}/sse"
    async with open_stream(api, base) as first:
        await expect_connected(first)
        await post_message(api, sid, "/scenario long 60")
        before = await first.until(lambda f: f.event == DELTA, 10)
        before += await first.until(lambda f: f.event == DELTA, 10)
    last_id = next(f.id for f in reversed(before) if f.id is not None)
    async with open_stream(api, base, headers={"Last-Event-ID": last_id}) as second:
        after = await second.until(is_idled, 20)
    log = await list_events(api, sid)
    seen = [f.json() for f in durable(before)] + [f.json() for f in durable(after)]
    assert seen == log


async def test_connected_means_subscribed(running: Running) -> None:
    """Generator level: a client that saw `connected` and then posted a message must
    receive that message's `input.message` (upstream: only events written *before*
    the subscription may be missed)."""
    from app.live.streams import StreamConfig, upstream_events

    state = running.app.state.app
    client = running.client
    sid = await create_session(client)
    session_uuid = uuid_of(sid)
    stream = upstream_events(
        database=state.database,
        fanout=state.fanout,
        session_id=session_uuid,
        cursor=None,
        accept=lambda _: True,
        config=StreamConfig(retry_ms=100, cycle_seconds=30),
        release=lambda: None,
    )
    try:
        first = await asyncio.wait_for(anext(stream), 5)
        assert first.startswith(b"event: connected\n")
        posted = await post_message(client, sid, "hello")
        names: list[str] = []
        while "session.idled" not in names:
            names.extend(frame_names(await asyncio.wait_for(anext(stream), 5)))
        assert [n for n in names if n != DELTA][:3] == TURN_EVENTS[:3], (
            f"events committed after `connected` were dropped: got {names} "
            f"(posted {posted['id']})"
        )
    finally:
        await stream.aclose()


async def test_a_delta_larger_than_a_notify_payload_is_streamed(
    api: httpx.AsyncClient,
) -> None:
    """Design 3.2: deltas travel with their payload, and NOTIFY payloads are under
    8000 bytes, so a larger chunk is split. The scripted echo streams a single word as
    one chunk: both streams must still carry every character, in order."""
    word = "".join(chr(ord("a") + i % 26) for i in range(9000))
    sid = await create_session(api)
    async with session_streams(api, sid) as (sse, mutations):
        await post_message(api, sid, word)
        sse_frames = events(await sse.until(is_idled, 20))
        mutation_frames = events(await mutations.until(agent_done, 10))
    deltas = [f.json()["data"] for f in sse_frames if f.event == DELTA]
    streamed = "".join(d["delta"] for d in deltas)
    assert streamed == word, f"/sse streamed {len(streamed)} of {len(word)} characters"
    assert deltas[-1]["accumulated"] == word
    text = ""
    for frame in mutation_frames:
        if frame.event == "delta":
            delta = frame.json()
            assert delta["offset"] == len(text)
            text += delta["text"]
    assert text == word, f"Mutation stream: {len(text)} of {len(word)} characters"
    final = mutation_frames[-1].json()["message"]
    assert final["content"][0]["text"] == word


async def test_mutation_stream_hides_internal_messages_unless_asked(
    api: httpx.AsyncClient,
) -> None:
    sid = await create_session(api)
    url = f"/v1/sessions/{sid}/messages/stream"
    async with (
        open_stream(api, url) as plain,
        open_stream(api, url, params={"include_internal": "true"}) as audit,
    ):
        internal = await post_message(api, sid, "internal note", visibility="internal")
        internal_id = internal["id"]
        plain_frames = events(await plain.until(agent_done, 20))
        audit_frames = events(await audit.until(agent_done, 20))

    def message_ids(frames: list[Frame]) -> set[str]:
        return {f.json()["message"]["id"] for f in frames if f.event == "message"}

    assert internal_id not in message_ids(plain_frames)
    assert internal_id in message_ids(audit_frames)
    await wait_idle(api, sid)
    visible = await list_messages(api, sid)
    assert internal_id not in {m["id"] for m in visible["data"]}
    assert message_ids(plain_frames) == {m["id"] for m in visible["data"]}


async def test_mutation_stream_says_when_the_session_waits_for_a_tool_result(
    api: httpx.AsyncClient,
) -> None:
    weather = {
        "type": "client_side",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object"},
    }
    created = await api.post("/v1/sessions", json={"tools": [weather]})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]

    def is_waiting(frame: Frame) -> bool:
        return frame.event == "session" and (
            frame.json().get("status") == "waitingfortoolresults"
        )

    async with open_stream(api, f"/v1/sessions/{sid}/messages/stream") as stream:
        await post_message(api, sid, '/scenario call get_weather {"city": "Kyiv"}')
        await stream.until(is_waiting, 20)
        agent = (await list_messages(api, sid))["data"][-1]
        call = next(p for p in agent["content"] if p["type"] == "tool_call")
        assert call["status"] == "awaiting_client"
        answered = await api.post(
            f"/v1/sessions/{sid}/tool-results",
            json={"tool_results": [{"tool_call_id": call["id"], "result": "sunny"}]},
        )
        assert answered.status_code == 200, answered.text
        await stream.until(is_idle_session, 20)
        seen = events(stream.frames)
    statuses = [f.json()["status"] for f in seen if f.event == "session"]
    assert statuses == ["active", "waitingfortoolresults", "active", "idle"]
    assert [f.json()["status"] for f in seen if f.event == "turn"] == [
        "running",
        "completed",
    ]
