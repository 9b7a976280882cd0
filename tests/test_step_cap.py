"""The step cap: a turn ends after `max_iterations` model steps (`turn.completed` with
`iterations`), and input that arrived during its last step starts a new turn rather
than going unanswered."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.support.api import (
    TOOL_TURN_EVENTS,
    TURN_EVENTS,
    list_events,
    list_messages,
    post_message,
    text_of,
)
from tests.support.in_process import Running, running_app
from tests.support.lanes import make_settings
from tests.support.waits import wait_idle


@pytest.fixture
async def paced(settings: Settings) -> AsyncIterator[Running]:
    """The app with the scripted model at 5 ms a chunk, so steps last long enough to
    be steered."""
    async with running_app(
        make_settings(settings.database_url, scripted_delay_ms=5)
    ) as running:
        yield running


async def capped_session(client: httpx.AsyncClient, max_iterations: int) -> str:
    response = await client.post(
        "/v1/sessions", json={"title": "capped", "max_iterations": max_iterations}
    )
    assert response.status_code == 201, response.text
    assert response.json()["max_iterations"] == max_iterations
    session_id: str = response.json()["id"]
    return session_id


def by_turn(log: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Event types per turn id, in log order."""
    out: dict[str, list[str]] = {}
    for event in log:
        turn = event["context"].get("turn_id")
        if turn is not None:
            out.setdefault(turn, []).append(event["type"])
    return out


async def test_a_tool_call_at_the_cap_ends_the_turn(client: httpx.AsyncClient) -> None:
    """Cap 1 and a step that calls a tool: the tool runs and its result is stored on the
    same part, but no step uses it; the message closes and the turn completes with
    `iterations: 1`. The next message starts a new turn."""
    sid = await capped_session(client, 1)
    first = await post_message(client, sid, "/scenario tool capped")
    assert first["delivery"] == "started"
    await wait_idle(client, sid)
    log = await list_events(client, sid)
    assert [e["type"] for e in log] == [
        *TOOL_TURN_EVENTS[:7],
        "output.message.completed",
        "turn.completed",
        "session.idled",
    ]
    completed = next(e for e in log if e["type"] == "turn.completed")
    assert completed["data"]["iterations"] == 1
    assert completed["data"]["tool_call_count"] == 1
    agent = (await list_messages(client, sid))["data"][-1]
    assert agent["role"] == "agent"
    assert agent["state"] == "done"
    assert [p["type"] for p in agent["content"]] == ["text", "tool_call", "tool_result"]
    assert agent["content"][1]["status"] == "completed"
    assert text_of(agent) == "Let me look that up."
    assert completed["data"]["final_message_id"] == agent["id"]

    again = await post_message(client, sid, "hello again")
    assert again["delivery"] == "started"
    assert again["turn_id"] != first["turn_id"]
    await wait_idle(client, sid)
    tail = (await list_events(client, sid))[len(log) :]
    assert [e["type"] for e in tail] == TURN_EVENTS


async def test_two_steps_of_a_tool_scenario_fit_a_cap_of_two(
    client: httpx.AsyncClient,
) -> None:
    sid = await capped_session(client, 2)
    await post_message(client, sid, "/scenario tool two")
    await wait_idle(client, sid)
    log = await list_events(client, sid)
    assert [e["type"] for e in log] == TOOL_TURN_EVENTS
    completed = next(e for e in log if e["type"] == "turn.completed")
    assert completed["data"]["iterations"] == 2
    agent = (await list_messages(client, sid))["data"][-1]
    assert text_of(agent).startswith("Let me look that up.")
    assert "The lookup returned" in text_of(agent)


async def test_steering_past_the_cap_starts_a_new_turn(paced: Running) -> None:
    """Cap 2 and steering messages all along: no turn runs more than two steps, the
    first one is cut at two, every steering message is answered (by the turn it
    joined, or by the turn the runner starts for it as the capped turn completes),
    and the session ends idle."""
    client = paced.client
    sid = await capped_session(client, 2)
    first = await post_message(client, sid, "/scenario long 30")
    assert first["delivery"] == "started"
    steered = []
    for index in range(12):
        await asyncio.sleep(0.03)
        steered.append(await post_message(client, sid, f"/scenario long 20 {index}"))
    await wait_idle(client, sid, within=30)
    log = await list_events(client, sid)
    sequences = [e["sequence"] for e in log]
    assert sequences == list(range(1, len(log) + 1))

    per_turn = by_turn(log)
    completed = [e for e in log if e["type"] == "turn.completed"]
    assert len(completed) == len(per_turn) >= 2
    assert all(1 <= e["data"]["iterations"] <= 2 for e in completed)
    assert completed[0]["data"]["turn_id"] == first["turn_id"]
    assert completed[0]["data"]["iterations"] == 2
    for types in per_turn.values():
        assert types[-2:] == ["turn.completed", "session.idled"]
        assert types.count("turn.started") == 1

    # A turn the runner started for unanswered input: right after the capped turn's
    # `session.idled`, in the same checkpoint, for a message that steered that turn.
    by_sequence = {e["sequence"]: e for e in log}
    messages = {m["id"]: m for m in (await list_messages(client, sid))["data"]}
    started = [e for e in log if e["type"] == "turn.started"]
    assert len(started) == len(per_turn)
    runner_started = 0
    for event in started[1:]:
        opener = by_sequence[event["sequence"] - 2]
        if opener["type"] == "input.message":
            continue  # started by a POST on an idle session
        runner_started += 1
        assert opener["type"] == "session.idled"
        ended = by_sequence[event["sequence"] - 3]
        assert ended["type"] == "turn.completed"
        assert ended["data"]["iterations"] == 2
        assert by_sequence[event["sequence"] - 1]["type"] == "session.activated"
        answered = messages[event["data"]["input_message_id"]]
        assert answered["role"] == "user"
        assert answered["turn_id"] == ended["data"]["turn_id"]
        assert answered["sequence"] < ended["sequence"]
    # The steering went on through the first turn's last (150 ms) step.
    assert runner_started >= 1

    # Every user message has an agent reply after it.
    ordered = sorted(messages.values(), key=lambda m: m["sequence"])
    last_user = max(m["sequence"] for m in ordered if m["role"] == "user")
    assert ordered[-1]["role"] == "agent"
    assert ordered[-1]["sequence"] > last_user
    assert ordered[-1]["state"] == "done"
    assert all(m["state"] == "done" for m in ordered)
    assert text_of(ordered[-1]).startswith("chunk0 ")

    # Once idle, the next message starts a new turn.
    after = await post_message(client, sid, "and now")
    assert after["delivery"] == "started"
    assert after["turn_id"] not in per_turn
    await wait_idle(client, sid)
    tail = (await list_events(client, sid))[len(log) :]
    assert [e["type"] for e in tail] == TURN_EVENTS
    assert tail[-2]["data"]["iterations"] == 1
