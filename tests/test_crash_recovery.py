"""Crash recovery: a server process killed with SIGKILL in the middle of a streaming turn.

A real server runs `/scenario long 5000` (5,000 deltas, 20 ms apart: the model's pace does
not wait for a reader that falls behind, so a shorter reply could end before the kill on a
loaded machine); once deltas flow the process is killed without any chance to clean up,
and a new server is started on the same database. The database must be authoritative
afterwards (DESIGN.md 3.1, seed "Streaming and persistence boundary"): the interrupted
agent message is closed with an `error` part, the turn failed, the session idles, nothing
that committed before the kill changed, and a client that reconnects with the cursor it
had converges to `GET .../messages`.
"""

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

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
from tests.support.servers import Server, start_server
from tests.support.sse import Frame, SSEReader, merge_snapshots
from tests.support.waits import wait_idle, wait_until

TEST_DEADLINE = 90.0
WAIT = 15.0


def last_cursor(frames: list[Frame]) -> int:
    ids = [int(f.id) for f in frames if f.event == "message" and f.id is not None]
    assert ids, "the Mutation stream sent no message snapshot"
    return max(ids)


def deltas_for(frames: list[Frame], message_id: str) -> list[dict[str, Any]]:
    return [
        f.json()
        for f in frames
        if f.event == "delta" and f.json()["message_id"] == message_id
    ]


# ---- the test ----------------------------------------------------------------------------


async def test_sigkill_mid_stream_is_recovered_on_restart(
    settings: Settings, tmp_path: Path
) -> None:
    servers: list[Server] = []
    readers: list[SSEReader] = []
    try:
        async with asyncio.timeout(TEST_DEADLINE):
            first = await asyncio.to_thread(
                start_server, settings.database_url, tmp_path, SCRIPTED_DELAY_MS="20"
            )
            servers.append(first)
            async with httpx.AsyncClient(base_url=first.url, timeout=10) as client:
                sid = await create_session(client, "crash")

                # A client of the seed: the Mutation stream from the very beginning, and
                # upstream's event stream replaying everything.
                mutations = await SSEReader(
                    client, f"/v1/sessions/{sid}/messages/stream?after=0"
                ).start()
                upstream = await SSEReader(
                    client, f"/v1/sessions/{sid}/sse?after_sequence=0"
                ).start()
                readers += [mutations, upstream]

                posted = await post_message(
                    client, sid, "/scenario long 5000", role="user"
                )
                assert posted["delivery"] == "started"
                turn_id = posted["turn_id"]

                def agent_opened(frames: list[Frame]) -> bool:
                    return any(f.event == "output.message.started" for f in frames)

                await upstream.wait_for(agent_opened, "output.message.started")
                started = next(
                    f.json()
                    for f in upstream.frames
                    if f.event == "output.message.started"
                )
                agent_id = started["data"]["message_id"]
                await mutations.wait_for(
                    lambda frames: len(deltas_for(frames, agent_id)) >= 15,
                    "15 deltas on the Mutation stream",
                )
                await upstream.wait_for(
                    lambda frames: (
                        sum(f.event == "output.message.delta" for f in frames) >= 15
                    ),
                    "15 deltas on /sse",
                )

                # What was committed before the kill, read just before it.
                events_before = await list_events(client, sid)
                page_before = await list_messages(client, sid)
                first.kill()
                kill_time = time.monotonic()

            assert first.process.returncode is not None
            assert first.process.returncode < 0  # died of a signal, no clean-up ran
            assert [e["type"] for e in events_before] == TURN_EVENTS[:4]
            agent_before = next(m for m in page_before["data"] if m["id"] == agent_id)
            assert agent_before["state"] == "streaming", "the kill was not mid-stream"
            assert agent_before["content"] == []  # deltas are never written
            live_text = "".join(
                d["text"] for d in deltas_for(mutations.frames, agent_id)
            )
            assert live_text.startswith("chunk0 chunk1 chunk2 ")

            # Both streams of the dead server end; nothing is delivered after the kill.
            await mutations.wait_for(lambda _: mutations.ended, "the stream to end")
            await upstream.wait_for(lambda _: upstream.ended, "the stream to end")
            for reader in readers:
                await reader.close()
            cursor = last_cursor(mutations.frames)
            client_state: dict[str, dict[str, Any]] = {}
            merge_snapshots(client_state, mutations.frames)
            assert client_state[agent_id]["state"] == "streaming"
            seen_events = [f for f in upstream.frames if f.id is not None]
            assert [f.json()["sequence"] for f in seen_events] == [1, 2, 3, 4]

            second = await asyncio.to_thread(
                start_server, settings.database_url, tmp_path, SCRIPTED_DELAY_MS="5"
            )
            servers.append(second)
            async with httpx.AsyncClient(base_url=second.url, timeout=10) as client:
                # SQLite recovers at start-up; PostgreSQL at start-up or, if the turn
                # looked recent, within a sweep or two.
                await wait_idle(client, sid, within=WAIT)
                recovered_after = time.monotonic() - kill_time
                assert recovered_after < WAIT

                # The interrupted message: closed, unfinished step discarded, error part.
                page = await list_messages(client, sid)
                agent = next(m for m in page["data"] if m["id"] == agent_id)
                assert agent["state"] == "done"
                assert agent["sequence"] == agent_before["sequence"]
                assert agent["revision"] > agent_before["revision"]
                assert agent["turn_id"] == turn_id
                assert [p["type"] for p in agent["content"]] == ["error"]
                error = agent["content"][0]
                assert error["code"] == "interrupted"
                assert error["message"]
                assert error["part_id"]
                one = await client.get(f"/v1/sessions/{sid}/messages/{agent_id}")
                assert one.status_code == 200
                assert one.json() == agent

                # Nothing committed before the kill is lost or changed.
                user_before = next(
                    m for m in page_before["data"] if m["role"] == "user"
                )
                assert next(m for m in page["data"] if m["role"] == "user") == (
                    user_before
                )
                assert page["total"] == page_before["total"] == 2
                events = await list_events(client, sid)
                assert events[: len(events_before)] == events_before
                assert [e["sequence"] for e in events] == list(
                    range(1, len(events) + 1)
                )
                tail = events[len(events_before) :]
                assert [e["type"] for e in tail] == [
                    "output.message.completed",
                    "turn.failed",
                    "session.idled",
                ]
                completed, failed, idled = tail
                assert completed["data"]["message"]["id"] == agent_id
                assert completed["data"]["message"]["state"] == "done"
                assert completed["data"]["error_code"] == "interrupted"
                assert failed["data"]["turn_id"] == turn_id
                assert failed["data"]["error_code"] == "interrupted"
                assert failed["data"]["error"]
                assert failed["context"]["turn_id"] == turn_id
                assert idled["data"]["turn_id"] == turn_id
                assert agent["sequence"] == started["sequence"]
                assert all(e["type"] != "turn.completed" for e in events)
                assert int(page["cursor"]) == events[-1]["sequence"]

                session = await get_session(client, sid)
                assert session["status"] == "idle"

                # Upstream's stream resumes from the last event id it had and fills the
                # gap: the events it saw plus the replay are exactly the durable log.
                resumed_sse = await SSEReader(
                    client, f"/v1/sessions/{sid}/sse?since_id={seen_events[-1].id}"
                ).start()
                readers.append(resumed_sse)
                await resumed_sse.wait_for(
                    lambda frames: any(f.event == "session.idled" for f in frames),
                    "the replayed session.idled",
                )
                replayed = [f.json() for f in resumed_sse.frames if f.id is not None]
                assert [f.json() for f in seen_events] + replayed == events

                # The seed's reconnecting client: resume the Mutation stream from the
                # cursor it had; merging snapshots by revision converges to the list.
                resumed = await SSEReader(
                    client, f"/v1/sessions/{sid}/messages/stream?after={cursor}"
                ).start()
                readers.append(resumed)

                def converged(frames: list[Frame]) -> bool:
                    state = dict(client_state)
                    merge_snapshots(state, frames)
                    ordered = sorted(state.values(), key=lambda m: m["sequence"])
                    return bool(ordered == page["data"])

                await resumed.wait_for(converged, "the reconnecting client to converge")
                assert all(f.event != "reset" for f in resumed.frames)
                assert all(f.event not in ("part", "delta") for f in resumed.frames)
                replayed_ids = [
                    f.json()["message"]["id"]
                    for f in resumed.frames
                    if f.event == "message"
                ]
                assert replayed_ids == [agent_id]  # only what changed after the cursor
                await resumed.close()
                await resumed_sse.close()

                # The session works again: a new message starts a turn that completes.
                again = await post_message(
                    client, sid, "hello after the crash", role="user"
                )
                assert again["delivery"] == "started"
                assert again["turn_id"] != turn_id
                new_turn = again["turn_id"]

                async def new_turn_done() -> bool:
                    return any(
                        e["type"] == "session.idled"
                        and e["data"]["turn_id"] == new_turn
                        for e in await list_events(client, sid)
                    )

                await wait_until(new_turn_done, "the new turn to finish")
                events_now = await list_events(client, sid)
                assert events_now[: len(events)] == events
                assert [e["sequence"] for e in events_now] == list(
                    range(1, len(events_now) + 1)
                )
                new_types = [e["type"] for e in events_now[len(events) :]]
                assert new_types == TURN_EVENTS
                final = await list_messages(client, sid)
                assert final["total"] == 4
                reply = final["data"][-1]
                assert reply["role"] == "agent"
                assert reply["turn_id"] == new_turn
                assert reply["state"] == "done"
                assert text_of(reply) == "hello after the crash"
                assert all(p["type"] != "error" for p in reply["content"])
                assert final["data"][:2] == page["data"]
                assert (await get_session(client, sid))["status"] == "idle"
    finally:
        for reader in readers:
            await reader.close()
        for server in servers:
            server.kill()
