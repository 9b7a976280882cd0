"""Concurrent writers over real HTTP against a real server process, on both lanes:
sequences stay dense and unique, deliveries are consistent with the turns the runner
ran, and `client_message_id` makes a create idempotent even under concurrency."""

import asyncio
import uuid
from collections import Counter
from typing import Any

import httpx

from tests.support.api import create_session, list_events, list_messages, text_body
from tests.support.servers import Server
from tests.support.waits import wait_idle

POSTS = 50
TIMEOUT = httpx.Timeout(60.0)


async def messages(http: httpx.AsyncClient, session_id: str) -> list[dict[str, Any]]:
    """Every message, internal ones too, all on one page."""
    body = await list_messages(http, session_id, include_internal="true")
    assert body["has_more"] is False
    data: list[dict[str, Any]] = body["data"]
    assert body["total"] == len(data)
    return data


async def test_fifty_concurrent_posts_to_one_session(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as http:
        # Every step after a turn's first answers input it had not seen, so 50 posts
        # take at most 50 steps: with a cap above that, no turn ends at its cap and
        # hands a steered message to a follow-up turn (tests/test_step_cap.py).
        created_session = await http.post(
            "/v1/sessions", json={"title": "concurrency", "max_iterations": POSTS + 1}
        )
        assert created_session.status_code == 201, created_session.text
        session_id = created_session.json()["id"]
        url = f"/v1/sessions/{session_id}/messages"
        responses = await asyncio.gather(
            *(http.post(url, json=text_body(f"message {i}")) for i in range(POSTS))
        )
        assert [r.status_code for r in responses] == [201] * POSTS, [
            r.text for r in responses if r.status_code != 201
        ]
        created = [r.json() for r in responses]
        await wait_idle(http, session_id, within=60)
        log = await list_events(http, session_id)
        stored = await messages(http, session_id)

    # Every POST stored exactly one user message, with a unique sequence.
    ids = [m["id"] for m in created]
    assert len(set(ids)) == POSTS
    assert len({m["sequence"] for m in created}) == POSTS
    users = [m for m in stored if m["role"] == "user"]
    assert len(users) == POSTS
    assert {m["id"] for m in users} == set(ids)
    by_id = {m["id"]: m for m in users}
    for response in created:
        assert response["sequence"] == by_id[response["id"]]["sequence"]
        assert response["turn_id"] == by_id[response["id"]]["turn_id"]
    assert all(m["state"] == "done" for m in stored)

    # The durable log is dense from 1 with unique sequences and ids, and every message's
    # sequence is the sequence of the event that created it.
    sequences = [e["sequence"] for e in log]
    assert sequences == list(range(1, len(log) + 1))
    assert len({e["id"] for e in log}) == len(log)
    assert all(e["session_id"] == session_id for e in log)
    message_sequences = [m["sequence"] for m in stored]
    assert message_sequences == sorted(message_sequences)
    assert len(set(message_sequences)) == len(stored)
    by_sequence = {e["sequence"]: e for e in log}
    for message in stored:
        event = by_sequence[message["sequence"]]
        expected = "input.message" if message["role"] == "user" else None
        if expected is not None:
            assert event["type"] == expected
        else:
            assert event["type"] in (
                "output.message.started",
                "output.message.completed",
            )

    # `input.message` events are in message-sequence order, one per stored message.
    inputs = [e for e in log if e["type"] == "input.message"]
    assert [e["data"]["message"]["id"] for e in inputs] == [m["id"] for m in users]
    assert [e["sequence"] for e in inputs] == [m["sequence"] for m in users]

    # Deliveries agree with the turns: one `started` per turn (its first message), the
    # rest `steered` into a turn that was already running.
    deliveries = Counter(m["delivery"] for m in created)
    assert set(deliveries) <= {"started", "steered"}
    assert deliveries["started"] + deliveries["steered"] == POSTS
    counts = Counter(e["type"] for e in log)
    turns_started = [e for e in log if e["type"] == "turn.started"]
    assert deliveries["started"] == len(turns_started) >= 1
    assert counts["session.activated"] == len(turns_started)
    assert counts["turn.completed"] == len(turns_started)
    assert counts["session.idled"] == len(turns_started)
    assert counts["turn.failed"] == counts["turn.cancelled"] == 0
    turn_of = {e["data"]["turn_id"]: e for e in turns_started}
    assert len(turn_of) == len(turns_started)
    per_turn = Counter(m["turn_id"] for m in created if m["delivery"] == "started")
    assert all(n == 1 for n in per_turn.values())
    assert set(per_turn) == set(turn_of)
    for message in created:
        started = turn_of[message["turn_id"]]
        if message["delivery"] == "started":
            assert started["data"]["input_message_id"] == message["id"]
            assert started["sequence"] == message["sequence"] + 2
        else:
            assert started["sequence"] < message["sequence"]
    # Turns do not overlap: each turn's events lie between its start and its idle.
    open_turn: str | None = None
    for event in log:
        if event["type"] == "turn.started":
            assert open_turn is None
            open_turn = event["data"]["turn_id"]
        elif event["type"] == "session.idled":
            assert event["data"]["turn_id"] == open_turn
            open_turn = None
        elif open_turn is None:
            # Only a turn's opening checkpoint comes between turns:
            # input.message -> session.activated -> turn.started, one turn id.
            after = by_sequence[event["sequence"] + 1]
            opening = (
                [event, after, by_sequence[event["sequence"] + 2]]
                if event["type"] == "input.message"
                else [by_sequence[event["sequence"] - 1], event, after]
            )
            assert [e["type"] for e in opening] == [
                "input.message",
                "session.activated",
                "turn.started",
            ], event
            assert len({e["context"]["turn_id"] for e in opening}) == 1
        else:
            assert event["context"]["turn_id"] == open_turn, event
    assert open_turn is None


async def test_repeated_client_message_id_is_a_duplicate(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as http:
        session_id = await create_session(http, "idempotency")
        url = f"/v1/sessions/{session_id}/messages"
        body = text_body("once only", client_message_id="client-msg-1")

        first = await http.post(url, json=body)
        assert first.status_code == 201, first.text
        assert first.json()["delivery"] == "started"
        # A repeat while the turn still runs is a duplicate too, not a steer.
        early = await http.post(url, json=body)
        assert early.status_code == 201
        assert early.json()["delivery"] == "duplicate"
        assert early.json()["id"] == first.json()["id"]
        await wait_idle(http, session_id, within=60)

        log_before = await list_events(http, session_id)
        session_before = (await http.get(f"/v1/sessions/{session_id}")).json()
        messages_before = await messages(http, session_id)

        second = await http.post(url, json=body)
        assert second.status_code == 201, second.text
        repeated = second.json()
        assert repeated["delivery"] == "duplicate"
        assert repeated["id"] == first.json()["id"]
        original = {k: v for k, v in first.json().items() if k != "delivery"}
        assert {k: v for k, v in repeated.items() if k != "delivery"} == original
        assert repeated["metadata"]["everruns_client_message_id"] == "client-msg-1"

        # Nothing was written: no event, no message, no turn, no session change.
        assert await list_events(http, session_id) == log_before
        assert await messages(http, session_id) == messages_before
        assert (await http.get(f"/v1/sessions/{session_id}")).json() == session_before

        # The id is scoped to its session; another client id is a new message.
        other_session = await create_session(http, "other")
        elsewhere = await http.post(f"/v1/sessions/{other_session}/messages", json=body)
        assert elsewhere.status_code == 201
        assert elsewhere.json()["delivery"] == "started"
        assert elsewhere.json()["id"] != first.json()["id"]
        fresh = await http.post(
            url, json=text_body("again", client_message_id="client-msg-2")
        )
        assert fresh.json()["delivery"] == "started"
        await wait_idle(http, other_session, within=60)
        await wait_idle(http, session_id, within=60)
        users = [m for m in await messages(http, session_id) if m["role"] == "user"]
        assert [m["id"] for m in users] == [first.json()["id"], fresh.json()["id"]]


async def test_concurrent_duplicates_store_one_message(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as http:
        session_id = await create_session(http, "concurrent idempotency")
        url = f"/v1/sessions/{session_id}/messages"
        client_id = str(uuid.uuid4())
        body = text_body("exactly once", client_message_id=client_id)
        responses = await asyncio.gather(
            *(http.post(url, json=body) for _ in range(10))
        )
        assert [r.status_code for r in responses] == [201] * 10, [
            r.text for r in responses
        ]
        created = [r.json() for r in responses]
        await wait_idle(http, session_id, within=60)
        stored = await messages(http, session_id)
        log = await list_events(http, session_id)

    assert len({m["id"] for m in created}) == 1
    deliveries = Counter(m["delivery"] for m in created)
    assert deliveries == {"started": 1, "duplicate": 9}
    users = [m for m in stored if m["role"] == "user"]
    assert [m["id"] for m in users] == [created[0]["id"]]
    assert users[0]["metadata"]["everruns_client_message_id"] == client_id
    counts = Counter(e["type"] for e in log)
    assert counts["input.message"] == 1
    assert counts["turn.started"] == 1
    assert [e["sequence"] for e in log] == list(range(1, len(log) + 1))
