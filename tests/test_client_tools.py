"""Client-side tools (DESIGN.md 2.6): sessions carry tool definitions; a call of a
client-side tool is a durable `tool.call_requested` and the session waits
(`waitingfortoolresults`) with no runner until `POST .../tool-results` answers it, on
any process and across restarts; `/scenario call` makes the scripted model call a tool
and answer with what it returned."""

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from everruns_sdk import ContentPart, Everruns, ToolDefinition

from app.journal.admission import RESERVATION_SECONDS
from app.settings import Settings
from tests.support.api import (
    create_session,
    get_session,
    list_events,
    list_messages,
    post_message,
    text_of,
)
from tests.support.database import table_rows
from tests.support.in_process import Running, running_app
from tests.support.problems import assert_problem
from tests.support.servers import server_process
from tests.support.waits import wait_idle, wait_sdk_idle, wait_status, wait_until

WEATHER = {
    "type": "client_side",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ASK_WEATHER = '/scenario call get_weather {"city": "Kyiv"}'


async def tool_session(client: httpx.AsyncClient, *tools: dict[str, Any]) -> str:
    response = await client.post(
        "/v1/sessions", json={"title": "tools", "tools": list(tools or [WEATHER])}
    )
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


def agent_tool_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in message["content"] if p["type"] in ("tool_call", "tool_result")]


async def post_results(
    client: httpx.AsyncClient, session_id: str, *results: dict[str, Any]
) -> httpx.Response:
    return await client.post(
        f"/v1/sessions/{session_id}/tool-results",
        json={"tool_results": list(results)},
    )


# ---- tool definitions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "field"),
    [
        ([{**WEATHER, "name": "has space"}], "tools.0.name"),
        ([{**WEATHER, "name": "x" * 65}], "tools.0.name"),
        ([{**WEATHER, "name": ""}], "tools.0.name"),
        ([WEATHER, {**WEATHER, "description": "again"}], "tools.1.name"),
        ([{**WEATHER, "parameters": {"type": 5}}], "tools.0.parameters"),
        ([{**WEATHER, "parameters": {"required": "city"}}], "tools.0.parameters"),
        ([{**WEATHER, "parameters": ["not", "an", "object"]}], "tools.0.parameters"),
        (
            [{k: v for k, v in WEATHER.items() if k != "parameters"}],
            "tools.0.parameters",
        ),
        ([{**WEATHER, "type": "server"}], "tools.0.type"),
        ([{**WEATHER, "policy": "sometimes"}], "tools.0.policy"),
    ],
)
async def test_invalid_tool_definitions_are_422_naming_the_field(
    client: httpx.AsyncClient,
    running: Running,
    tools: list[dict[str, Any]],
    field: str,
) -> None:
    database = running.app.state.app.database
    session_id = await tool_session(client)
    before = await table_rows(database)
    created = await client.post("/v1/sessions", json={"tools": tools})
    body = assert_problem(created, 422, code="validation_error")
    assert field in body["detail"], body
    patched = await client.patch(f"/v1/sessions/{session_id}", json={"tools": tools})
    body = assert_problem(patched, 422, code="validation_error")
    assert field in body["detail"], body
    assert await table_rows(database) == before


async def test_tools_are_stored_echoed_and_replaced(client: httpx.AsyncClient) -> None:
    builtin = {
        "type": "builtin",
        "name": "lookup",
        "description": "Look something up",
        "parameters": {"type": "object"},
        "policy": "auto",
        # Upstream fields this service does not use are accepted and ignored.
        "display_name": "Lookup",
    }
    minimal = {"name": "sdk-default", "parameters": {}}
    session_id = await tool_session(client, WEATHER, builtin, minimal)
    session = await get_session(client, session_id)
    assert session["tools"] == [
        WEATHER,
        {k: v for k, v in builtin.items() if k != "display_name"},
        # The SDK's default type; an empty description.
        {
            "type": "client_side",
            "name": "sdk-default",
            "description": "",
            "parameters": {},
        },
    ]
    patched = await client.patch(
        f"/v1/sessions/{session_id}", json={"tools": [builtin]}
    )
    assert patched.status_code == 200, patched.text
    assert [t["name"] for t in patched.json()["tools"]] == ["lookup"]
    cleared = await client.patch(f"/v1/sessions/{session_id}", json={"tools": []})
    assert cleared.json()["tools"] == []
    untouched = await client.patch(f"/v1/sessions/{session_id}", json={"title": "t"})
    assert untouched.json()["tools"] == []


# ---- a client-side call, over plain HTTP ---------------------------------------------


async def test_client_side_call_waits_durably_and_resumes_with_the_result(
    client: httpx.AsyncClient, running: Running
) -> None:
    runner = running.app.state.app.runner
    database = running.app.state.app.database
    session_id = await tool_session(client)
    await post_message(client, session_id, ASK_WEATHER)
    await wait_status(client, session_id, "waitingfortoolresults")
    # The wait holds no runner.
    await wait_until(lambda: not runner.tasks, "the runner to let the session go")

    agent = (await list_messages(client, session_id))["data"][-1]
    assert agent["state"] == "streaming"
    call, *rest = agent_tool_parts(agent)
    assert rest == []
    assert (call["name"], call["arguments"], call["status"]) == (
        "get_weather",
        {"city": "Kyiv"},
        "awaiting_client",
    )
    events = await list_events(client, session_id)
    requested = [e for e in events if e["type"] == "tool.call_requested"]
    assert len(requested) == 1
    tool_call = {"id": call["id"], "name": "get_weather", "arguments": {"city": "Kyiv"}}
    assert requested[0]["data"]["tool_call"] == tool_call
    assert requested[0]["data"]["tool_calls"] == [tool_call]
    # The request, the part's move and the status commit together: the request is
    # the last event, and the snapshot at its sequence already waits.
    assert events[-1]["type"] == "tool.call_requested"
    assert agent["revision"] == 3  # opened, step committed, handed to the client

    # A result for a call that does not exist, while the session waits: 422.
    before = await table_rows(database)
    unknown = await post_results(
        client, session_id, {"tool_call_id": "call_nope", "result": 1}
    )
    body = assert_problem(unknown, 422)
    assert "tool_results.0.tool_call_id" in body["detail"]
    assert await table_rows(database) == before

    # Keys in order: PostgreSQL (jsonb) stores an object's keys sorted.
    result = {"sky": "clear", "temperature": 21}
    answered = await post_results(
        client, session_id, {"tool_call_id": call["id"], "result": result}
    )
    assert answered.status_code == 200, answered.text
    assert answered.json() == {"accepted": 1, "status": "active"}
    await wait_idle(client, session_id)

    messages = (await list_messages(client, session_id))["data"]
    assert [m["role"] for m in messages] == ["user", "agent"]
    final = messages[-1]
    assert final["state"] == "done"
    parts = agent_tool_parts(final)
    assert [(p["type"], p.get("status")) for p in parts] == [
        ("tool_call", "completed"),
        ("tool_result", None),
    ]
    assert parts[1]["tool_call_id"] == call["id"]
    assert parts[1]["result"] == result
    assert text_of(final).endswith(
        f"The get_weather tool returned {json.dumps(result)}."
    )
    log = await list_events(client, session_id)
    types = [e["type"] for e in log]
    assert types.count("tool.completed") == 1
    assert types[-2:] == ["turn.completed", "session.idled"]
    # The result ends the wait: upstream's `session.activated` follows it, naming the
    # turn and the input it answers (as when the turn began).
    completed = types.index("tool.completed")
    assert types[completed + 1] == "session.activated"
    assert log[completed + 1]["data"] == {
        "input_message_id": messages[0]["id"],
        "turn_id": final["turn_id"],
    }

    # The same result again: stored once, answered as the first time.
    before = await table_rows(database)
    again = await post_results(
        client, session_id, {"tool_call_id": call["id"], "result": result}
    )
    assert again.status_code == 200, again.text
    assert again.json() == answered.json()
    # Another result for the same call: refused.
    other = await post_results(
        client, session_id, {"tool_call_id": call["id"], "result": {"temperature": 5}}
    )
    assert_problem(other, 409, code="tool_result_conflict")
    # A call nobody asked for, when nothing waits: the SDK's retryable 409.
    stray = await post_results(
        client, session_id, {"tool_call_id": "call_x", "result": 1}
    )
    body = assert_problem(stray, 409, code="not_waiting_for_tool_results")
    assert "not waiting for tool results" in body["detail"]
    assert await table_rows(database) == before


async def test_refusals_change_nothing(
    client: httpx.AsyncClient, running: Running
) -> None:
    database = running.app.state.app.database
    session_id = await create_session(client)
    missing = "session_" + "0" * 32
    before = await table_rows(database)
    body = assert_problem(
        await post_results(client, session_id, {"tool_call_id": "c1", "result": 1}), 409
    )
    assert "not waiting for tool results" in body["detail"]
    assert_problem(
        await post_results(client, missing, {"tool_call_id": "c1", "result": 1}), 404
    )
    assert_problem(await post_results(client, "session_x", {"tool_call_id": "c1"}), 400)
    empty = await client.post(
        f"/v1/sessions/{session_id}/tool-results", json={"tool_results": []}
    )
    assert_problem(empty, 422)
    twice = await post_results(
        client, session_id, {"tool_call_id": "c1"}, {"tool_call_id": "c1"}
    )
    assert "tool_results.1.tool_call_id" in assert_problem(twice, 422)["detail"]
    huge = await post_results(
        client, session_id, {"tool_call_id": "c1", "result": "x" * 40_000}
    )
    assert "tool_results.0.result" in assert_problem(huge, 422)["detail"]
    malformed = await client.post(
        f"/v1/sessions/{session_id}/tool-results",
        content=b"{",
        headers={"Content-Type": "application/json"},
    )
    assert_problem(malformed, 400)
    assert await table_rows(database) == before


async def test_an_error_result_fails_the_tool_and_the_model_sees_it(
    client: httpx.AsyncClient,
) -> None:
    session_id = await tool_session(client)
    await post_message(client, session_id, ASK_WEATHER)
    await wait_status(client, session_id, "waitingfortoolresults")
    call = agent_tool_parts((await list_messages(client, session_id))["data"][-1])[0]
    answered = await post_results(
        client, session_id, {"tool_call_id": call["id"], "error": "no network"}
    )
    assert answered.json() == {"accepted": 1, "status": "active"}
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][-1]
    parts = agent_tool_parts(final)
    assert parts[0]["status"] == "failed"
    assert parts[1] == {**parts[1], "error": "no network"}
    assert "result" not in parts[1]
    assert text_of(final).endswith("The get_weather tool failed: no network")
    completed = [
        e
        for e in await list_events(client, session_id)
        if e["type"] == "tool.completed"
    ]
    assert completed[0]["data"]["success"] is False


async def test_each_turn_waits_for_its_own_call(client: httpx.AsyncClient) -> None:
    session_id = await tool_session(client)
    for city in ("Kyiv", "Lviv"):
        await post_message(
            client, session_id, f'/scenario call get_weather {{"city": "{city}"}}'
        )
        await wait_status(client, session_id, "waitingfortoolresults")
        call = agent_tool_parts((await list_messages(client, session_id))["data"][-1])[
            0
        ]
        assert call["arguments"] == {"city": city}
        answered = await post_results(
            client, session_id, {"tool_call_id": call["id"], "result": city}
        )
        assert answered.json() == {"accepted": 1, "status": "active"}
        await wait_idle(client, session_id)
    messages = (await list_messages(client, session_id))["data"]
    assert [m["role"] for m in messages] == ["user", "agent", "user", "agent"]
    assert text_of(messages[1]).endswith('returned "Kyiv".')
    assert text_of(messages[3]).endswith('returned "Lviv".')
    ids = [agent_tool_parts(m)[0]["id"] for m in (messages[1], messages[3])]
    assert len(set(ids)) == 2


async def test_cancel_while_waiting_fails_the_tool_and_ends_the_turn(
    client: httpx.AsyncClient, running: Running
) -> None:
    session_id = await tool_session(client)
    await post_message(client, session_id, ASK_WEATHER)
    await wait_status(client, session_id, "waitingfortoolresults")
    cancelled = await client.post(f"/v1/sessions/{session_id}/cancel")
    assert cancelled.json()["status"] == "cancelled"
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][-1]
    assert final["state"] == "done"
    parts = agent_tool_parts(final)
    assert parts[0]["status"] == "failed"
    assert parts[1]["error"] == "The turn was cancelled by the user"
    assert final["content"][-1]["type"] == "error"
    types = [e["type"] for e in await list_events(client, session_id)]
    assert "turn.cancelled" in types
    assert types[-1] == "session.idled"
    late = await post_results(
        client, session_id, {"tool_call_id": parts[0]["id"], "result": 1}
    )
    assert_problem(late, 409, code="not_waiting_for_tool_results")


async def test_a_message_posted_while_waiting_joins_the_turn(
    client: httpx.AsyncClient,
) -> None:
    session_id = await tool_session(client)
    await post_message(client, session_id, ASK_WEATHER)
    await wait_status(client, session_id, "waitingfortoolresults")
    steered = await post_message(client, session_id, "and tomorrow?")
    assert steered["delivery"] == "steered"
    assert (await get_session(client, session_id))["status"] == "waitingfortoolresults"
    call = agent_tool_parts((await list_messages(client, session_id))["data"][1])[0]
    answered = await post_results(
        client, session_id, {"tool_call_id": call["id"], "result": 3}
    )
    assert answered.status_code == 200
    await wait_idle(client, session_id)
    # The turn went on in its agent message, and its next step answered the message
    # that arrived while it waited.
    messages = (await list_messages(client, session_id))["data"]
    assert [m["role"] for m in messages] == ["user", "agent", "user"]
    assert all(m["state"] == "done" for m in messages)
    assert text_of(messages[1]).endswith("and tomorrow?")


# ---- `/scenario call` with a built-in tool ---------------------------------------------


async def test_scenario_call_runs_a_builtin_tool_and_answers_with_its_result(
    client: httpx.AsyncClient,
) -> None:
    session_id = await create_session(client)
    await post_message(client, session_id, '/scenario call lookup {"query": "tea"}')
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][-1]
    parts = agent_tool_parts(final)
    assert [p.get("status") for p in parts] == ["completed", None]
    assert text_of(final).endswith(
        'The lookup tool returned {"query": "tea", "answer": 42}.'
    )
    types = [e["type"] for e in await list_events(client, session_id)]
    assert "tool.call_requested" not in types
    assert types.count("tool.started") == types.count("tool.completed") == 1


async def test_scenario_call_of_an_unknown_tool_fails_it(
    client: httpx.AsyncClient,
) -> None:
    session_id = await create_session(client)
    await post_message(client, session_id, "/scenario call nothing_here {}")
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][-1]
    assert agent_tool_parts(final)[0]["status"] == "failed"
    assert text_of(final).endswith(
        "The nothing_here tool failed: unknown tool nothing_here"
    )


async def test_scenario_call_with_bad_arguments_says_how_to_call(
    client: httpx.AsyncClient,
) -> None:
    session_id = await create_session(client)
    await post_message(client, session_id, "/scenario call lookup [1, 2]")
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][-1]
    assert agent_tool_parts(final) == []
    assert text_of(final) == "The arguments of /scenario call must be a JSON object."


# ---- the official SDK, a restart, and a second process --------------------------------


async def test_the_sdk_sends_tools_and_tool_results_unmodified(sdk: Everruns) -> None:
    session = await sdk.sessions.create(
        title="sdk tools",
        tools=[
            ToolDefinition(
                name="get_weather",
                description="The weather in a city",
                parameters=WEATHER["parameters"],
            )
        ],
    )
    await sdk.messages.create(session.id, ASK_WEATHER)
    calls: list[Any] = []
    for _ in range(400):
        events = await sdk.events.list(session.id, types=["tool.call_requested"])
        if events:
            calls = events[0].data["tool_calls"]
            break
        await asyncio.sleep(0.05)
    assert [c["name"] for c in calls] == ["get_weather"]
    assert (await sdk.sessions.get(session.id)).status == "waitingfortoolresults"
    answered = await sdk.messages.create_tool_results(
        session.id, [ContentPart.make_tool_result(calls[0]["id"], {"temperature": 21})]
    )
    assert (answered.accepted, answered.status) == (1, "active")
    again = await sdk.messages.create_tool_results(
        session.id, [ContentPart.make_tool_result(calls[0]["id"], {"temperature": 21})]
    )
    assert (again.accepted, again.status) == (1, "active")
    await wait_sdk_idle(sdk, session.id, 20)
    listed = await sdk.messages.list(session.id)
    results = [p for p in listed[-1].content if p.type == "tool_result"]
    assert [(r.tool_call_id, r.result) for r in results] == [
        (calls[0]["id"], {"temperature": 21})
    ]


async def test_a_restart_keeps_the_session_waiting(
    settings: Settings, tmp_path: Path
) -> None:
    url = settings.database_url
    async with (
        server_process(url, tmp_path) as first,
        httpx.AsyncClient(base_url=first.url, timeout=10) as api,
    ):
        session_id = await tool_session(api)
        await post_message(api, session_id, ASK_WEATHER)
        await wait_status(api, session_id, "waitingfortoolresults")
    async with (
        server_process(url, tmp_path, RUNNER_RENEW_SECONDS="0.2") as second,
        httpx.AsyncClient(base_url=second.url, timeout=10) as api,
    ):
        # Start-up recovery and the sweeper leave a waiting turn alone.
        await asyncio.sleep(1.5)
        session = await get_session(api, session_id)
        assert session["status"] == "waitingfortoolresults"
        agent = (await list_messages(api, session_id))["data"][-1]
        assert agent["state"] == "streaming"
        call = agent_tool_parts(agent)[0]
        assert call["status"] == "awaiting_client"
        answered = await post_results(
            api, session_id, {"tool_call_id": call["id"], "result": "sunny"}
        )
        assert answered.json() == {"accepted": 1, "status": "active"}
        await wait_idle(api, session_id)
        final = (await list_messages(api, session_id))["data"][-1]
        assert final["state"] == "done"
        assert text_of(final).endswith('The get_weather tool returned "sunny".')


@pytest.mark.postgres_only
async def test_a_result_posted_to_another_process_resumes_the_turn(
    settings: Settings, tmp_path: Path
) -> None:
    url = settings.database_url
    async with (
        server_process(url, tmp_path, kill=True) as a,
        server_process(url, tmp_path, kill=True) as b,
        httpx.AsyncClient(base_url=a.url, timeout=10) as client_a,
        httpx.AsyncClient(base_url=b.url, timeout=10) as client_b,
    ):
        session_id = await tool_session(client_a)
        posted = await post_message(client_a, session_id, ASK_WEATHER)
        assert posted["delivery"] == "started"
        await wait_status(client_b, session_id, "waitingfortoolresults")
        call = agent_tool_parts(
            (await list_messages(client_b, session_id))["data"][-1]
        )[0]
        answered = await post_results(
            client_b, session_id, {"tool_call_id": call["id"], "result": {"t": 1}}
        )
        assert answered.json() == {"accepted": 1, "status": "active"}
        await wait_idle(client_a, session_id)
        for api in (client_a, client_b):
            final = (await list_messages(api, session_id))["data"][-1]
            assert final["state"] == "done"
            assert text_of(final).endswith('The get_weather tool returned {"t": 1}.')
        types = [e["type"] for e in await list_events(client_a, session_id)]
        assert types.count("turn.completed") == 1
        assert types.count("output.message.started") == 1


async def test_a_waiting_turn_holds_no_place_of_the_turn_caps(
    settings: Settings,
) -> None:
    capped = settings.model_copy(
        update={"max_running_turns_per_org": 1, "max_running_turns_per_process": 1}
    )
    async with running_app(capped) as app:
        client = app.client
        waiting = await tool_session(client)
        await post_message(client, waiting, ASK_WEATHER)
        await wait_status(client, waiting, "waitingfortoolresults")
        runner = app.app.state.app.runner
        await wait_until(lambda: not runner.tasks, "the runner to let the session go")
        # The process counts an admitted turn for a moment before its runner shows.
        await asyncio.sleep(RESERVATION_SECONDS)
        # Both caps are 1: another session's turn is admitted while the first waits.
        other = await create_session(client)
        posted = await post_message(client, other, "hello")
        assert posted["delivery"] == "started"
        await wait_idle(client, other)


async def test_results_for_the_last_step_allowed_end_the_turn(
    client: httpx.AsyncClient,
) -> None:
    """At the step cap the results are stored and the turn completes: no step after."""
    response = await client.post(
        "/v1/sessions", json={"tools": [WEATHER], "max_iterations": 1}
    )
    session_id = response.json()["id"]
    await post_message(client, session_id, ASK_WEATHER)
    await wait_status(client, session_id, "waitingfortoolresults")
    call = agent_tool_parts((await list_messages(client, session_id))["data"][-1])[0]
    answered = await post_results(
        client, session_id, {"tool_call_id": call["id"], "result": "rain"}
    )
    assert answered.json() == {"accepted": 1, "status": "active"}
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][-1]
    assert final["state"] == "done"
    assert text_of(final) == "Calling get_weather."
    completed = [
        e
        for e in await list_events(client, session_id)
        if e["type"] == "turn.completed"
    ]
    assert completed[0]["data"]["iterations"] == 1
    assert completed[0]["data"]["tool_call_count"] == 1


async def test_input_that_arrived_while_the_last_step_waited_gets_its_own_turn(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/sessions", json={"tools": [WEATHER], "max_iterations": 1}
    )
    session_id = response.json()["id"]
    await post_message(client, session_id, ASK_WEATHER)
    await wait_status(client, session_id, "waitingfortoolresults")
    call = agent_tool_parts((await list_messages(client, session_id))["data"][-1])[0]
    assert (await post_message(client, session_id, "later"))["delivery"] == "steered"
    await post_results(client, session_id, {"tool_call_id": call["id"], "result": 1})
    await wait_idle(client, session_id)
    messages = (await list_messages(client, session_id))["data"]
    assert [m["role"] for m in messages] == ["user", "agent", "user", "agent"]
    assert text_of(messages[-1]) == "later"
    types = [e["type"] for e in await list_events(client, session_id)]
    assert types.count("turn.completed") == 2
