"""AG-UI 1.0: `POST /v1/ag-ui` and `POST /v1/sessions/{id}/ag-ui` run the agent on a
thread (a session) and stream AG-UI events that ag-ui-validate's conformance rules
accept, for text, reasoning, tools, a frontend tool round trip, an approval interrupt
resumed, failures and a reconnect to a running turn; `.../ag-ui/capabilities`. The
`@ag-ui/client` HttpAgent drives the same routes in tests/test_ag_ui_node.py."""

import asyncio
import json
from typing import Any

import httpx
import pytest
from ag_ui_validate.pytest_plugin import assert_valid_agui, assert_valid_agui_endpoint

from tests.support.api import all_messages, text_of
from tests.support.problems import assert_problem
from tests.support.servers import Server, live_server_fixture
from tests.support.waits import wait_idle

live_server = live_server_fixture("ag-ui", SCRIPTED_DELAY_MS="40")


def events_of(body: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:])
        for block in body.split("\n\n")
        for line in block.split("\n")
        if line.startswith("data: ")
    ]


def run_input(
    thread: str, run: str, *messages: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    return {"threadId": thread, "runId": run, "messages": list(messages), **extra}


def user(message_id: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "content": text}


async def run(
    client: httpx.AsyncClient, body: dict[str, Any], path: str = "/v1/ag-ui"
) -> list[dict[str, Any]]:
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = events_of(response.text)
    assert_valid_agui(events, max_warnings=0)
    assert events[0] == {
        "type": "RUN_STARTED",
        "threadId": body["threadId"],
        "runId": body["runId"],
    }
    return events


def texts(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


async def sessions_of(client: httpx.AsyncClient) -> list[str]:
    return [s["id"] for s in (await client.get("/v1/sessions")).json()["data"]]


async def test_a_run_streams_the_turn_as_valid_agui_events(
    client: httpx.AsyncClient,
) -> None:
    events = await run(
        client, run_input("thread-1", "run-1", user("m1", "hello agui world"))
    )
    assert texts(events) == "hello agui world"
    assert events[-1] == {
        "type": "RUN_FINISHED",
        "threadId": "thread-1",
        "runId": "run-1",
        "outcome": {"type": "success"},
    }
    [sid] = await sessions_of(client)
    await wait_idle(client, sid)
    messages = await all_messages(client, sid)
    assert [text_of(m) for m in messages] == ["hello agui world"] * 2
    # The same message again (the client sends its history each run): stored once.
    again = await run(
        client, run_input("thread-1", "run-2", user("m1", "hello agui world"))
    )
    assert again[-1]["type"] == "RUN_FINISHED"
    assert len(await all_messages(client, sid)) == 2
    # A session id is a thread id too; so is the session's own route.
    for path, thread in (
        ("/v1/ag-ui", sid),
        (f"/v1/sessions/{sid}/ag-ui", "any-thread"),
    ):
        more = await run(
            client, run_input(thread, "run-x", user(f"m-{thread}", "more")), path
        )
        assert texts(more) == "more"
    assert await sessions_of(client) == [sid]


async def test_reasoning_tools_and_failures(client: httpx.AsyncClient) -> None:
    reasoned = await run(
        client, run_input("t-r", "r", user("m", "/scenario reasoning"))
    )
    kinds = [e["type"] for e in reasoned]
    for kind in (
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_END",
        "REASONING_END",
    ):
        assert kind in kinds
    thought = "".join(
        e["delta"] for e in reasoned if e["type"] == "REASONING_MESSAGE_CONTENT"
    )
    assert thought == "Thinking about the question."
    tooled = await run(
        client, run_input("t-t", "r", user("m", "/scenario tool weather"))
    )
    start = next(e for e in tooled if e["type"] == "TOOL_CALL_START")
    assert start["toolCallName"] == "lookup"
    args = "".join(e["delta"] for e in tooled if e["type"] == "TOOL_CALL_ARGS")
    assert json.loads(args) == {"query": "weather"}
    result = next(e for e in tooled if e["type"] == "TOOL_CALL_RESULT")
    assert json.loads(result["content"]) == {"query": "weather", "answer": 42}
    failed = await run(client, run_input("t-f", "r", user("m", "/scenario fail")))
    assert failed[-1]["type"] == "RUN_ERROR"
    assert "failed mid-stream" in failed[-1]["message"]


async def test_a_frontend_tool_round_trip(client: httpx.AsyncClient) -> None:
    tool = {
        "name": "get_weather",
        "description": "The weather where the user is",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    asked = await run(
        client,
        run_input(
            "t-tool",
            "r1",
            user("m1", '/scenario call get_weather {"city": "Riga"}'),
            tools=[tool],
        ),
    )
    call = next(e for e in asked if e["type"] == "TOOL_CALL_START")
    assert call["toolCallName"] == "get_weather"
    assert asked[-1]["outcome"] == {
        "type": "success",
        "pendingToolCallIds": [call["toolCallId"]],
    }
    [sid] = await sessions_of(client)
    session = (await client.get(f"/v1/sessions/{sid}")).json()
    assert [t["name"] for t in session["tools"]] == ["get_weather"]
    assert session["tools"][0]["type"] == "client_side"
    answered = await run(
        client,
        run_input(
            "t-tool",
            "r2",
            user("m1", '/scenario call get_weather {"city": "Riga"}'),
            {"id": "a1", "role": "assistant", "toolCalls": []},
            {
                "id": "tm1",
                "role": "tool",
                "toolCallId": call["toolCallId"],
                "content": '{"temp": 3}',
            },
            tools=[tool],
        ),
    )
    assert 'returned {"temp": 3}' in texts(answered)
    assert answered[-1]["outcome"] == {"type": "success"}
    # The same tools offered again change nothing: one Action for the first offer only.
    await wait_idle(client, sid)
    actions = [
        p
        for m in await all_messages(client, sid)
        for p in m["content"]
        if p["type"] == "action"
    ]
    assert len(actions) == 1


APPROVED_TOOL = {
    "name": "lookup",
    "type": "builtin",
    "policy": "requires_approval",
    "parameters": {"type": "object"},
}


async def test_a_frontend_tool_named_like_a_server_tool_is_refused(
    client: httpx.AsyncClient,
) -> None:
    sid = (await client.post("/v1/sessions", json={"tools": [APPROVED_TOOL]})).json()[
        "id"
    ]
    shadow = {"name": "lookup", "description": "", "parameters": {"type": "object"}}
    response = await client.post(
        f"/v1/sessions/{sid}/ag-ui",
        json=run_input(sid, "r1", user("m1", "hello"), tools=[shadow]),
    )
    assert_problem(response, 422)
    assert "lookup" in response.json()["detail"]
    session = (await client.get(f"/v1/sessions/{sid}")).json()
    assert session["tools"] == [
        {**APPROVED_TOOL, "description": session["tools"][0]["description"]}
    ]
    assert await all_messages(client, sid) == []


async def test_an_approval_is_an_interrupt_resumed_by_the_next_run(
    client: httpx.AsyncClient,
) -> None:
    sid = (await client.post("/v1/sessions", json={"tools": [APPROVED_TOOL]})).json()[
        "id"
    ]
    asking = user("m1", '/scenario call lookup {"query": "x"}')
    asked = await run(client, run_input(sid, "r1", asking))
    outcome = asked[-1]["outcome"]
    assert outcome["type"] == "interrupt"
    [interrupt] = outcome["interrupts"]
    assert interrupt["reason"] == "tool_approval"
    assert interrupt["id"].startswith("interaction_")
    call = next(e for e in asked if e["type"] == "TOOL_CALL_START")
    assert interrupt["toolCallId"] == call["toolCallId"]
    resumed = await run(
        client,
        run_input(
            sid,
            "r2",
            asking,
            resume=[
                {
                    "interruptId": interrupt["id"],
                    "status": "resolved",
                    "payload": {"approved": True},
                }
            ],
        ),
    )
    assert not [e for e in resumed if e["type"] == "TOOL_CALL_START"]
    result = next(e for e in resumed if e["type"] == "TOOL_CALL_RESULT")
    assert json.loads(result["content"]) == {"query": "x", "answer": 42}
    assert resumed[-1]["outcome"] == {"type": "success"}
    # Answered again: nothing waits.
    response = await client.post(
        "/v1/ag-ui",
        json=run_input(
            sid, "r3", resume=[{"interruptId": interrupt["id"], "status": "resolved"}]
        ),
    )
    assert_problem(response, 409, code="nothing_waits")


async def test_a_cancelled_interrupt_denies_the_tool(client: httpx.AsyncClient) -> None:
    sid = (await client.post("/v1/sessions", json={"tools": [APPROVED_TOOL]})).json()[
        "id"
    ]
    asking = user("m1", '/scenario call lookup {"query": "x"}')
    [interrupt] = (await run(client, run_input(sid, "r1", asking)))[-1]["outcome"][
        "interrupts"
    ]
    denied = await run(
        client,
        run_input(
            sid,
            "r2",
            asking,
            resume=[{"interruptId": interrupt["id"], "status": "cancelled"}],
        ),
    )
    result = next(e for e in denied if e["type"] == "TOOL_CALL_RESULT")
    assert result["content"] == "denied"
    assert denied[-1]["outcome"] == {"type": "success"}


async def test_capabilities(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/ag-ui/capabilities")
    assert response.status_code == 200
    body = response.json()
    assert body["humanInTheLoop"]["interrupts"] is True
    assert body["tools"]["clientProvided"] is True
    sid = (await client.post("/v1/sessions", json={"tools": [APPROVED_TOOL]})).json()[
        "id"
    ]
    own = (await client.get(f"/v1/sessions/{sid}/ag-ui/capabilities")).json()
    assert own["tools"]["items"] == [{"name": "lookup", "description": ""}]
    missing = "session_" + "0" * 32
    assert_problem(await client.get(f"/v1/sessions/{missing}/ag-ui/capabilities"), 404)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"runId": "r", "messages": []}, 422),
        ({"threadId": "has space", "runId": "r", "messages": []}, 422),
        (
            {
                "threadId": "t",
                "runId": "r",
                "messages": [
                    {
                        "id": "m",
                        "role": "user",
                        "content": [{"type": "binary", "mimeType": "image/png"}],
                    }
                ],
            },
            400,
        ),
        ({"threadId": "session_" + "0" * 32, "runId": "r", "messages": []}, 404),
        # A bad tool list is refused before the thread's session is created.
        (
            {
                "threadId": "t",
                "runId": "r",
                "messages": [],
                "tools": [
                    {"name": "twice", "description": "", "parameters": {}},
                    {"name": "twice", "description": "", "parameters": {}},
                ],
            },
            422,
        ),
        (
            {
                "threadId": "t",
                "runId": "r",
                "messages": [],
                "tools": [
                    {"name": "bad", "description": "", "parameters": {"type": 5}}
                ],
            },
            422,
        ),
        (
            {
                "threadId": "t",
                "runId": "r",
                "messages": [],
                "resume": [{"interruptId": "x", "status": "maybe"}],
            },
            422,
        ),
    ],
)
async def test_bad_runs_change_nothing(
    client: httpx.AsyncClient, body: dict[str, Any], status: int
) -> None:
    response = await client.post("/v1/ag-ui", json=body)
    assert_problem(response, status)
    assert await sessions_of(client) == []


async def test_a_run_without_input_reconnects_to_the_running_turn(
    live_server: Server,
) -> None:
    async with httpx.AsyncClient(base_url=live_server.url, timeout=30) as client:
        first = await client.post(
            "/v1/ag-ui", json=run_input("t-re", "r0", user("m0", "earlier words"))
        )
        assert first.status_code == 200
        body = run_input("t-re", "r1", user("m1", "/scenario long 40"))
        async with client.stream("POST", "/v1/ag-ui", json=body) as response:
            async for line in response.aiter_lines():
                if "TEXT_MESSAGE_CONTENT" in line:
                    break  # the connection is cut mid-turn
        again = await client.post("/v1/ag-ui", json=run_input("t-re", "r2"))
        events = events_of(again.text)
        assert_valid_agui(events, max_warnings=0)
        snapshot = next(e for e in events if e["type"] == "MESSAGES_SNAPSHOT")
        # The history before the running turn; the turn itself streams from its start.
        assert [m["role"] for m in snapshot["messages"]] == ["user", "assistant"]
        assert snapshot["messages"][0] == {
            "id": "m0",
            "role": "user",
            "content": "earlier words",
        }
        assert texts(events) == "".join(f"chunk{i} " for i in range(40))
        assert events[-1]["outcome"] == {"type": "success"}
        # Nothing running: the history alone.
        idle = events_of(
            (await client.post("/v1/ag-ui", json=run_input("t-re", "r3"))).text
        )
        assert [e["type"] for e in idle] == [
            "RUN_STARTED",
            "MESSAGES_SNAPSHOT",
            "RUN_FINISHED",
        ]
        assert len(idle[1]["messages"]) == 4


async def test_both_routes_pass_the_endpoint_validator(live_server: Server) -> None:
    await assert_valid_agui_endpoint(
        f"{live_server.url}/v1/ag-ui", max_warnings=0, timeout_ms=30000
    )
    async with httpx.AsyncClient(base_url=live_server.url) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
    await assert_valid_agui_endpoint(
        f"{live_server.url}/v1/sessions/{sid}/ag-ui", max_warnings=0, timeout_ms=30000
    )


async def test_concurrent_first_runs_of_a_thread_make_one_session(
    client: httpx.AsyncClient,
) -> None:
    await asyncio.gather(
        *(
            run(client, run_input("t-race", f"r{i}", user(f"m{i}", f"race {i}")))
            for i in range(4)
        )
    )
    assert len(await sessions_of(client)) == 1
