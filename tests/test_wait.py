"""`POST .../messages?wait=true&timeout_ms=N` over real HTTP against a server process:
the answer comes when the turn ends (completed, failed, cancelled, steered into), when
it waits for the client (tool results, an approval), or as a timeout; bad values are
400 and open waits count against the stream limits."""

import asyncio
from typing import Any

import httpx

from tests.support.api import (
    create_session,
    list_messages,
    post_message,
    text_body,
    text_of,
)
from tests.support.problems import assert_problem, assert_too_many
from tests.support.servers import api_fixture, live_server_fixture
from tests.support.waits import wait_idle, wait_until
from tests.test_approvals import ASK, guarded_session
from tests.test_client_tools import ASK_WEATHER, WEATHER, post_results, tool_session

# Two open waits per session at most, so the limit is reachable from one test.
live_server = live_server_fixture(
    "wait", SCRIPTED_DELAY_MS="5", SSE_MAX_PER_SESSION="2"
)
api = api_fixture()


async def post_wait(
    api: httpx.AsyncClient,
    session_id: str,
    text: str,
    http_timeout: httpx.Timeout | float = 30,
    **params: Any,
) -> httpx.Response:
    return await api.post(
        f"/v1/sessions/{session_id}/messages",
        params={"wait": "true", **params},
        json=text_body(text),
        timeout=http_timeout,
    )


def agent_messages(page: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in page["data"] if m["role"] == "agent"]


async def test_a_wait_answers_with_the_finished_turn(api: httpx.AsyncClient) -> None:
    sid = await create_session(api)
    response = await post_wait(api, sid, "hello there friend")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed"
    assert "error" not in body
    assert body["message"]["role"] == "user"
    assert body["message"]["delivery"] == "started"
    assert text_of(body["message"]) == "hello there friend"
    # The turn's agent messages, exactly as the list serves them: nothing is still
    # streaming when the answer comes.
    assert body["messages"] == agent_messages(await list_messages(api, sid))
    assert [text_of(m) for m in body["messages"]] == ["hello there friend"]
    assert body["messages"][0]["state"] == "done"
    assert body["messages"][0]["turn_id"] == body["message"]["turn_id"]
    assert (await wait_idle(api, sid))["status"] == "idle"


async def test_hot_and_routed_waits_answer_alike(api: httpx.AsyncClient) -> None:
    """`?wait=true` is answered in front of FastAPI; with a parameter the hot path does
    not know (FastAPI ignores it) by the route. Same statuses, headers and shapes, for
    an ended turn and for a timeout."""
    sid = await create_session(api)
    hot = await post_wait(api, sid, "first")
    routed = await post_wait(api, sid, "second", other="1")
    assert hot.status_code == routed.status_code == 200, (hot.text, routed.text)
    assert hot.headers["content-type"] == routed.headers["content-type"]
    assert hot.headers["x-request-id"] != routed.headers["x-request-id"]
    first, second = hot.json(), routed.json()
    assert sorted(first) == sorted(second)
    assert first["status"] == second["status"] == "completed"
    assert sorted(first["message"]) == sorted(second["message"])
    assert [m["role"] for m in first["messages"]] == ["agent"]
    assert [m["role"] for m in second["messages"]] == ["agent"]
    assert text_of(first["messages"][0])
    assert text_of(second["messages"][0])
    extras: list[dict[str, Any]] = [{}, {"other": "1"}]
    timeouts = [
        await post_wait(api, sid, "/scenario long 100000", timeout_ms=100, **extra)
        for extra in extras
    ]
    assert [t.status_code for t in timeouts] == [202, 202]
    assert [t.json()["status"] for t in timeouts] == ["timeout", "timeout"]
    # The second joined the first one's running turn.
    assert [t.json()["message"]["delivery"] for t in timeouts] == [
        "started",
        "steered",
    ]
    await api.post(f"/v1/sessions/{sid}/cancel")
    await wait_idle(api, sid)


async def test_a_failed_turn_answers_failed_with_its_error(
    api: httpx.AsyncClient,
) -> None:
    sid = await create_session(api)
    response = await post_wait(api, sid, "/scenario fail")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "failed"
    assert body["error"]["code"] == "model_error"
    assert "failed mid-stream" in body["error"]["message"]
    [reply] = body["messages"]
    assert any(p["type"] == "error" for p in reply["content"])


async def test_a_cancelled_turn_answers_failed_as_cancelled(
    api: httpx.AsyncClient,
) -> None:
    sid = await create_session(api)
    waiting = asyncio.create_task(post_wait(api, sid, "/scenario long 100000"))
    await wait_until(
        lambda: _status(api, sid, "active"), "the turn to start", within=10
    )
    cancel = await api.post(f"/v1/sessions/{sid}/cancel")
    assert cancel.status_code == 200, cancel.text
    response = await asyncio.wait_for(waiting, 20)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "failed"
    assert body["error"]["code"] == "cancelled_by_user"


async def _status(api: httpx.AsyncClient, sid: str, status: str) -> bool:
    response = await api.get(f"/v1/sessions/{sid}")
    return bool(response.json()["status"] == status)


async def test_a_wait_that_outlasts_its_timeout_answers_202(
    api: httpx.AsyncClient,
) -> None:
    sid = await create_session(api)
    response = await post_wait(api, sid, "/scenario long 100000", timeout_ms=200)
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["status"] == "timeout"
    assert body["message"]["delivery"] == "started"
    # The message is stored and its turn goes on.
    page = await list_messages(api, sid)
    assert page["data"][0]["id"] == body["message"]["id"]
    assert (await api.get(f"/v1/sessions/{sid}")).json()["status"] == "active"
    await api.post(f"/v1/sessions/{sid}/cancel")
    await wait_idle(api, sid)


async def test_a_steering_message_waits_for_the_running_turn(
    api: httpx.AsyncClient,
) -> None:
    sid = await create_session(api)
    await post_message(api, sid, "/scenario long 200")
    response = await post_wait(api, sid, "and one more thing")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["message"]["delivery"] == "steered"
    assert body["status"] == "completed"
    # It joined the running turn: the turn's reply answers both messages.
    assert body["messages"] == agent_messages(await list_messages(api, sid))
    assert text_of(body["messages"][-1]).endswith("and one more thing")


async def test_a_repeated_wait_answers_the_same_turn(api: httpx.AsyncClient) -> None:
    sid = await create_session(api)
    request = {**text_body("once only"), "client_message_id": "wait-retry-1"}
    url = f"/v1/sessions/{sid}/messages"
    first = await api.post(url, params={"wait": "true"}, json=request, timeout=30)
    again = await api.post(url, params={"wait": "true"}, json=request, timeout=30)
    assert first.status_code == again.status_code == 200
    assert again.json()["message"]["delivery"] == "duplicate"
    assert again.json()["messages"] == first.json()["messages"]
    assert (await list_messages(api, sid))["total"] == 2


async def test_bad_timeouts_are_400_and_store_nothing(api: httpx.AsyncClient) -> None:
    sid = await create_session(api)
    for value in ("0", "600001", "-5", "soon", "1.5"):
        response = await post_wait(api, sid, "never stored", timeout_ms=value)
        assert_problem(response, 400, code="invalid_parameter")
        assert response.json()["detail"].startswith("timeout_ms: ")
    response = await api.post(
        f"/v1/sessions/{sid}/messages",
        params={"wait": "maybe"},
        json=text_body("never stored"),
    )
    assert_problem(response, 400, code="invalid_parameter")
    assert response.json()["detail"].startswith("wait: ")
    assert (await list_messages(api, sid))["total"] == 0
    assert (await api.get(f"/v1/sessions/{sid}")).json()["status"] == "started"


async def test_waits_share_the_stream_limits(api: httpx.AsyncClient) -> None:
    sid = await create_session(api)
    first = asyncio.create_task(post_wait(api, sid, "/scenario long 100000"))
    await wait_until(lambda: _status(api, sid, "active"), "the first turn", within=10)
    second = asyncio.create_task(post_wait(api, sid, "steer one"))
    await wait_until(lambda: _has_text(api, sid, "steer one"), "the steer", within=10)
    # Two waits are open on this session: a third is refused and stores nothing.
    before = await list_messages(api, sid)
    refused = await post_wait(api, sid, "never stored")
    assert_too_many(
        refused, detail="per-session wait limit reached (open streams and waits)"
    )
    after = await list_messages(api, sid)
    assert after["total"] == before["total"]
    assert not any(text_of(m) == "never stored" for m in after["data"])
    await api.post(f"/v1/sessions/{sid}/cancel")
    for task in (first, second):
        response = await asyncio.wait_for(task, 20)
        assert response.status_code == 200, response.text
        assert response.json()["error"]["code"] == "cancelled_by_user"
    # The slots are back: a wait is admitted again.
    response = await post_wait(api, sid, "after the limit")
    assert response.status_code == 200, response.text


async def _has_text(api: httpx.AsyncClient, sid: str, text: str) -> bool:
    page = await list_messages(api, sid)
    return any(m["role"] == "user" and text_of(m) == text for m in page["data"])


async def test_a_wait_whose_client_has_gone_frees_its_slot_at_once(
    api: httpx.AsyncClient,
) -> None:
    """Two waits fill the session's slots, and their clients give up (a read timeout
    closes the connection): the slots come back long before the turn ends or the
    waits' own timeout, and a new wait is admitted."""
    sid = await create_session(api)
    abandoned = asyncio.create_task(
        post_wait(api, sid, "/scenario long 100000", httpx.Timeout(10, read=1))
    )
    await wait_until(lambda: _status(api, sid, "active"), "the turn", within=10)
    steer = asyncio.create_task(
        post_wait(api, sid, "steer and go", httpx.Timeout(10, read=0.5))
    )
    for task in (abandoned, steer):
        try:
            answer = await asyncio.wait_for(task, 15)
        except httpx.ReadTimeout:
            continue
        raise AssertionError(
            "a wait answered while its turn still ran: "
            f"{answer.status_code} {answer.text[:500]}"
        )

    async def admitted() -> bool:
        probe = await post_wait(api, sid, "probe", timeout_ms="1")
        return probe.status_code == 202

    # Before, the slots stayed taken until the turn ended (about 8 minutes here).
    await wait_until(admitted, "a slot to come back", within=5)
    assert await _status(api, sid, "active")
    await api.post(f"/v1/sessions/{sid}/cancel")


async def test_a_turn_waiting_for_client_tool_results_answers_waiting_at_once(
    api: httpx.AsyncClient,
) -> None:
    """It used to run to `timeout_ms`: the turn cannot end before the client answers."""
    sid = await tool_session(api, WEATHER)
    response = await post_wait(
        api, sid, ASK_WEATHER, http_timeout=20, timeout_ms=15_000
    )
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["status"], body["waiting_for"]) == ("waiting", "tool_results")
    assert body["message"]["delivery"] == "started"
    (agent,) = body["messages"]
    (call,) = [p for p in agent["content"] if p["type"] == "tool_call"]
    assert call["name"] == "get_weather"
    assert call["status"] == "awaiting_client"
    # Answered, the turn goes on; a wait on the next message sees it end.
    answered = await post_results(
        api, sid, {"tool_call_id": call["id"], "result": "sunny"}
    )
    assert answered.status_code == 200, answered.text
    await wait_idle(api, sid)
    done = await post_wait(api, sid, "and tomorrow")
    assert done.json()["status"] == "completed"


async def test_a_turn_waiting_for_an_approval_answers_waiting_at_once(
    api: httpx.AsyncClient,
) -> None:
    sid = await guarded_session(api)
    response = await post_wait(api, sid, ASK, http_timeout=20, timeout_ms=15_000)
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["status"], body["waiting_for"]) == ("waiting", "approval")
    (agent,) = body["messages"]
    assert agent["state"] == "streaming"
    assert any(
        p["type"] == "interaction" and p["status"] == "pending"
        for p in agent["content"]
    )
