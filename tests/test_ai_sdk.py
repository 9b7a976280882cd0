"""The AI SDK's chat routes: `POST /v1/chat` (useChat's DefaultChatTransport body)
streams the turn as UI message chunks, v1; the chat id names a session (created on
first use, or a session id); approvals and client-side tools end the stream and are
answered by the next POST; `GET /v1/chat/{id}/stream` resumes the running turn from
its start, on a real server process. The `ai` package's own parser reads the same
streams in tests/test_ai_sdk_node.py."""

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.support.api import all_messages, text_of
from tests.support.problems import assert_problem
from tests.support.servers import Server, live_server_fixture
from tests.support.waits import wait_idle

live_server = live_server_fixture("ai-sdk", SCRIPTED_DELAY_MS="40")

UI_HEADER = "x-vercel-ai-ui-message-stream"


def user(message_id: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def chunks_of(body: str) -> list[Any]:
    """Every `data:` of a UI message stream; the last is the string `[DONE]`."""
    out: list[Any] = []
    for block in body.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def text_deltas(chunks: list[Any]) -> str:
    return "".join(
        c["delta"] for c in chunks if c != "[DONE]" and c["type"] == "text-delta"
    )


async def chat(
    client: httpx.AsyncClient, chat_id: str, *messages: dict[str, Any]
) -> list[Any]:
    response = await client.post(
        "/v1/chat",
        json={"id": chat_id, "messages": list(messages), "trigger": "submit-message"},
    )
    assert response.status_code == 200, response.text
    assert response.headers[UI_HEADER] == "v1"
    assert response.headers["content-type"].startswith("text/event-stream")
    return chunks_of(response.text)


async def sessions_of(client: httpx.AsyncClient) -> list[str]:
    response = await client.get("/v1/sessions")
    assert response.status_code == 200, response.text
    return [s["id"] for s in response.json()["data"]]


def balanced(chunks: list[Any]) -> None:
    """What the SDK's reader needs: one start, every text or reasoning part started
    before its deltas and ended once, steps opened and closed in turn, `[DONE]` last."""
    assert chunks[-1] == "[DONE]"
    assert chunks[0]["type"] == "start"
    open_parts: set[str] = set()
    step = False
    for c in chunks[:-1]:
        kind = c["type"]
        if kind.endswith("-start") and kind.split("-")[0] in ("text", "reasoning"):
            assert c["id"] not in open_parts
            open_parts.add(c["id"])
        elif kind.endswith(("-delta", "-end")) and kind.split("-")[0] in (
            "text",
            "reasoning",
        ):
            assert c["id"] in open_parts, c
            if kind.endswith("-end"):
                open_parts.discard(c["id"])
        elif kind == "start-step":
            assert not step
            step = True
        elif kind == "finish-step":
            assert step
            step = False
    assert not open_parts
    assert not step


async def test_a_chat_streams_its_turn_as_ui_message_chunks(
    client: httpx.AsyncClient,
) -> None:
    chunks = await chat(client, "chat-one", user("ui-1", "hello there friend"))
    balanced(chunks)
    types = [c["type"] for c in chunks[:-1]]
    assert types[:3] == ["start", "start-step", "text-start"]
    assert types[-3:] == ["text-end", "finish-step", "finish"]
    assert chunks[-2]["finishReason"] == "stop"
    assert text_deltas(chunks) == "hello there friend"
    # The chat's session holds the user message (its UI id as client_message_id) and
    # the reply the stream carried, under the id the stream started with.
    [sid] = await sessions_of(client)
    await wait_idle(client, sid)
    messages = await all_messages(client, sid)
    assert [m["role"] for m in messages] == ["user", "agent"]
    assert text_of(messages[0]) == "hello there friend"
    assert messages[1]["id"] == chunks[0]["messageId"]
    assert text_of(messages[1]) == "hello there friend"


async def test_one_chat_id_is_one_session_and_a_message_sent_again_is_stored_once(
    client: httpx.AsyncClient,
) -> None:
    first = user("ui-1", "first words")
    second = user("ui-2", "second words")
    await chat(client, "chat-two", first)
    again = await chat(
        client, "chat-two", first, {"id": "a", "role": "assistant", "parts": []}, second
    )
    assert text_deltas(again) == "second words"
    [sid] = await sessions_of(client)
    await wait_idle(client, sid)
    # The same UI message again: stored once; its turn's reply is streamed again.
    replayed = await chat(client, "chat-two", first, second)
    assert text_deltas(replayed) == "second words"
    assert [text_of(m) for m in await all_messages(client, sid)] == [
        "first words",
        "first words",
        "second words",
        "second words",
    ]
    # Another chat id is another session.
    await chat(client, "chat-three", user("ui-1", "elsewhere"))
    assert len(await sessions_of(client)) == 2


async def test_a_session_id_is_a_chat_id(client: httpx.AsyncClient) -> None:
    created = await client.post("/v1/sessions", json={"title": "mine"})
    sid = created.json()["id"]
    chunks = await chat(client, sid, user("u", "into my session"))
    assert text_deltas(chunks) == "into my session"
    assert await sessions_of(client) == [sid]
    missing = "session_" + "0" * 32
    response = await client.post(
        "/v1/chat", json={"id": missing, "messages": [user("u", "x")]}
    )
    assert_problem(response, 404)


async def test_a_failed_turn_ends_with_an_error_chunk(
    client: httpx.AsyncClient,
) -> None:
    chunks = await chat(client, "chat-fail", user("u", "/scenario fail"))
    balanced(chunks)
    assert chunks[-2]["type"] == "error"
    assert "failed mid-stream" in chunks[-2]["errorText"]


async def test_reasoning_and_server_tools_are_parts_of_their_own(
    client: httpx.AsyncClient,
) -> None:
    chunks = await chat(client, "chat-reason", user("u", "/scenario reasoning"))
    balanced(chunks)
    types = [c["type"] for c in chunks[:-1]]
    assert types.index("reasoning-end") < types.index("text-start")
    reasoning = "".join(
        c["delta"] for c in chunks[:-1] if c["type"] == "reasoning-delta"
    )
    assert reasoning == "Thinking about the question."
    tool = await chat(client, "chat-tool", user("u", "/scenario tool weather"))
    balanced(tool)
    calls = [c for c in tool[:-1] if c["type"].startswith("tool-")]
    assert [c["type"] for c in calls] == [
        "tool-input-start",
        "tool-input-available",
        "tool-output-available",
    ]
    assert calls[1]["input"] == {"query": "weather"}
    assert calls[2]["output"] == {"query": "weather", "answer": 42}


TOOLS = [
    {
        "name": "lookup",
        "type": "builtin",
        "policy": "requires_approval",
        "parameters": {"type": "object"},
    },
    {"name": "get_location", "type": "client_side", "parameters": {"type": "object"}},
]


async def test_an_approval_ends_the_stream_and_the_next_post_answers_it(
    client: httpx.AsyncClient,
) -> None:
    sid = (await client.post("/v1/sessions", json={"tools": TOOLS})).json()["id"]
    asked = await chat(client, sid, user("u1", '/scenario call lookup {"query": "x"}'))
    balanced(asked)
    request = next(c for c in asked[:-1] if c["type"] == "tool-approval-request")
    assert asked[-2] == {"type": "finish", "finishReason": "tool-calls"}
    reply = {
        "id": asked[0]["messageId"],
        "role": "assistant",
        "parts": [
            {
                "type": "tool-lookup",
                "toolCallId": request["toolCallId"],
                "state": "approval-responded",
                "approval": {"id": request["approvalId"], "approved": True},
            }
        ],
    }
    went_on = await chat(client, sid, reply)
    balanced(went_on)
    # The same message goes on; what the frontend holds is not sent again.
    assert went_on[0] == {"type": "start", "messageId": asked[0]["messageId"]}
    assert not [
        c
        for c in went_on[:-1]
        if c["type"] in ("tool-input-start", "tool-approval-request")
    ]
    output = next(c for c in went_on[:-1] if c["type"] == "tool-output-available")
    assert output["toolCallId"] == request["toolCallId"]
    assert "returned" in text_deltas(went_on)
    assert went_on[-2] == {"type": "finish", "finishReason": "stop"}
    # Answered again: nothing waits any more.
    response = await client.post("/v1/chat", json={"id": sid, "messages": [reply]})
    assert_problem(response, 409, code="nothing_waits")


async def test_a_denial_is_a_denied_tool(client: httpx.AsyncClient) -> None:
    sid = (await client.post("/v1/sessions", json={"tools": TOOLS})).json()["id"]
    asked = await chat(client, sid, user("u1", '/scenario call lookup {"query": "x"}'))
    request = next(c for c in asked[:-1] if c["type"] == "tool-approval-request")
    part = {
        "type": "tool-lookup",
        "toolCallId": request["toolCallId"],
        "state": "approval-responded",
        "approval": {
            "id": request["approvalId"],
            "approved": False,
            "reason": "not now",
        },
    }
    went_on = await chat(
        client, sid, {"id": asked[0]["messageId"], "role": "assistant", "parts": [part]}
    )
    balanced(went_on)
    assert {
        "type": "tool-output-denied",
        "toolCallId": request["toolCallId"],
    } in went_on


async def test_a_client_side_tool_runs_in_the_frontend(
    client: httpx.AsyncClient,
) -> None:
    sid = (await client.post("/v1/sessions", json={"tools": TOOLS})).json()["id"]
    asked = await chat(client, sid, user("u1", "/scenario call get_location {}"))
    call = next(c for c in asked[:-1] if c["type"] == "tool-input-available")
    assert call["toolName"] == "get_location"
    assert asked[-2] == {"type": "finish", "finishReason": "tool-calls"}
    part = {
        "type": "tool-get_location",
        "toolCallId": call["toolCallId"],
        "state": "output-available",
        "input": {},
        "output": {"city": "Riga"},
    }
    went_on = await chat(
        client, sid, {"id": asked[0]["messageId"], "role": "assistant", "parts": [part]}
    )
    balanced(went_on)
    assert 'returned {"city": "Riga"}' in text_deltas(went_on)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (
            {"id": "c", "messages": [user("u", "x")], "trigger": "regenerate-message"},
            400,
        ),
        (
            {
                "id": "c",
                "messages": [
                    {"id": "u", "role": "user", "parts": [{"type": "data-x"}]}
                ],
            },
            400,
        ),
        ({"id": "c", "messages": [{"id": "u", "role": "system", "parts": []}]}, 400),
        ({"id": "c", "messages": [{"id": "a", "role": "assistant", "parts": []}]}, 400),
        ({"id": "has space", "messages": [user("u", "x")]}, 422),
        ({"id": "c", "messages": []}, 422),
        ({"messages": [user("u", "x")]}, 422),
    ],
)
async def test_bad_requests_change_nothing(
    client: httpx.AsyncClient, body: dict[str, Any], status: int
) -> None:
    response = await client.post("/v1/chat", json=body)
    assert_problem(response, status)
    assert await sessions_of(client) == []


async def test_resume_answers_204_when_nothing_runs(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/chat/never-used/stream")).status_code == 204
    await chat(client, "chat-idle", user("u", "done soon"))
    [sid] = await sessions_of(client)
    await wait_idle(client, sid)
    for chat_id in ("chat-idle", sid):
        assert (await client.get(f"/v1/chat/{chat_id}/stream")).status_code == 204
    assert_problem(await client.get("/v1/chat/bad%20id/stream"), 400)


async def test_a_cut_stream_resumes_from_the_log_to_the_same_message(
    live_server: Server,
) -> None:
    async with httpx.AsyncClient(base_url=live_server.url, timeout=30) as client:
        body = {"id": "chat-cut", "messages": [user("u", "/scenario long 40")]}
        seen: list[Any] = []
        async with client.stream("POST", "/v1/chat", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
                if sum(c["type"] == "text-delta" for c in seen) >= 5:
                    break  # the connection is cut mid-turn
        resumed = await client.get("/v1/chat/chat-cut/stream")
        assert resumed.status_code == 200, resumed.text
        assert resumed.headers[UI_HEADER] == "v1"
        chunks = chunks_of(resumed.text)
        balanced(chunks)
        # A replay of the whole reply, from its start, under the same message id.
        assert chunks[0] == seen[0]
        sid = next(s["id"] for s in (await client.get("/v1/sessions")).json()["data"])
        await wait_idle(client, sid)
        agent = (await all_messages(client, sid))[-1]
        assert text_deltas(chunks) == text_of(agent)
        assert text_of(agent) == "".join(f"chunk{i} " for i in range(40))
        assert (await client.get("/v1/chat/chat-cut/stream")).status_code == 204


async def test_two_first_uses_of_a_chat_id_make_one_session(
    client: httpx.AsyncClient,
) -> None:
    results = await asyncio.gather(
        *(chat(client, "chat-race", user(f"u{i}", f"race {i}")) for i in range(4))
    )
    assert all(r[-1] == "[DONE]" for r in results)
    assert len(await sessions_of(client)) == 1


async def test_a_stopped_turn_ends_with_abort_and_is_counted(
    live_server: Server,
) -> None:
    async with httpx.AsyncClient(base_url=live_server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        body = {"id": sid, "messages": [user("u", "/scenario long 200")]}
        seen: list[Any] = []
        async with client.stream("POST", "/v1/chat", json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                seen.append(
                    line[6:] if line == "data: [DONE]" else json.loads(line[6:])
                )
                if len(seen) == 4:
                    stopped = await client.post(f"/v1/sessions/{sid}/cancel")
                    assert stopped.status_code in (200, 202), stopped.text
        balanced(seen)
        assert seen[-2]["type"] == "abort"
        metrics = (await client.get("/metrics")).text
        assert 'evermirror_streams_opened_total{stream="ai_sdk"}' in metrics
        assert 'evermirror_streams_open{stream="ai_sdk"} 0.0' in metrics


async def test_regenerate_asks_again_in_a_fork_where_the_chat_goes_on(
    client: httpx.AsyncClient,
) -> None:
    question = user("ui-q", "say it again")
    first = await chat(client, "chat-regen", question)
    [old] = await sessions_of(client)
    await wait_idle(client, old)
    answer = {"id": first[0]["messageId"], "role": "assistant", "parts": []}
    response = await client.post(
        "/v1/chat",
        json={
            "id": "chat-regen",
            "messages": [question, answer],
            "trigger": "regenerate-message",
            "messageId": answer["id"],
        },
    )
    assert response.status_code == 200, response.text
    again = chunks_of(response.text)
    balanced(again)
    assert text_deltas(again) == "say it again"
    assert again[0]["messageId"] != answer["id"]
    sessions = await sessions_of(client)
    assert len(sessions) == 2
    new = next(s for s in sessions if s != old)
    forked = (await client.get(f"/v1/sessions/{new}")).json()
    assert forked["forked_from_session_id"] == old
    # The old branch is untouched; the chat goes on in the fork.
    assert [text_of(m) for m in await all_messages(client, old)] == ["say it again"] * 2
    await wait_idle(client, new)
    more = await chat(client, "chat-regen", question, answer, user("ui-2", "and then"))
    assert text_deltas(more) == "and then", more
    assert [text_of(m) for m in await all_messages(client, new)][-1] == "and then"
    assert len(await all_messages(client, old)) == 2
