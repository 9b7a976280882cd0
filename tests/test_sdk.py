"""The official Python client (`everruns_sdk`) against a real server process, with the
SDK's own base URL shape (`.../api`) and a bare API key (open mode accepts any)."""

import httpx
import pytest
from everruns_sdk import AgentClient, Everruns
from everruns_sdk.errors import ApiError, NotFoundError

from tests.support.api import text_of
from tests.support.servers import Server
from tests.support.waits import wait_idle, wait_sdk_idle, wait_until


async def test_sessions_create_get_list_delete(sdk: Everruns) -> None:
    created = await sdk.sessions.create(
        title="sdk session", tags=["sdk", "e2e"], locale="uk-UA"
    )
    assert created.id.startswith("session_")
    assert len(created.id) == 8 + 32
    assert created.status == "started"
    assert created.title == "sdk session"
    assert created.tags == ["sdk", "e2e"]
    assert created.locale == "uk-UA"
    assert created.organization_id == "org_00000000000000000000000000000001"
    assert created.harness_id.startswith("harness_")

    fetched = await sdk.sessions.get(created.id)
    assert fetched.model_dump() == created.model_dump()

    other = await sdk.sessions.create(title="another one")
    listed = await sdk.sessions.list()
    assert [s.id for s in listed] == [other.id, created.id]  # newest first
    searched = await sdk.sessions.list(search="sdk")
    assert [s.id for s in searched] == [created.id]

    await sdk.sessions.cancel(created.id)  # nothing runs: a no-op, not an error
    await sdk.sessions.delete(created.id)
    with pytest.raises(NotFoundError) as missing:
        await sdk.sessions.get(created.id)
    assert missing.value.status_code == 404
    with pytest.raises(NotFoundError):
        await sdk.sessions.delete(created.id)
    assert [s.id for s in await sdk.sessions.list()] == [other.id]


async def test_messages_and_events(sdk: Everruns) -> None:
    session = await sdk.sessions.create(title="sdk messages")
    sent = await sdk.messages.create(session.id, "hello from the sdk")
    assert sent.id.startswith("message_")
    assert sent.role == "user"
    assert [(p.type, p.text) for p in sent.content] == [("text", "hello from the sdk")]
    await wait_sdk_idle(sdk, session.id)

    listed = await sdk.messages.list(session.id)
    assert [m.role for m in listed] == ["user", "agent"]
    assert listed[0].id == sent.id
    reply = listed[1]
    assert reply.phase == "final_answer"
    assert "".join(p.text or "" for p in reply.content) == "hello from the sdk"

    events = await sdk.events.list(session.id)
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert all(e.session_id == session.id for e in events)
    types = [e.type for e in events]
    assert types[:4] == [
        "input.message",
        "session.activated",
        "turn.started",
        "output.message.started",
    ]
    assert types[-2:] == ["turn.completed", "session.idled"]
    assert events[0].context.input_message_id == sent.id
    turn_id = events[0].context.turn_id
    assert turn_id is not None
    assert turn_id.startswith("turn_")
    assert all(e.context.turn_id == turn_id for e in events)

    inputs = await sdk.events.list(session.id, types=["input.message"])
    assert [e.data["message"]["id"] for e in inputs] == [sent.id]
    last_two = await sdk.events.list(session.id, limit=2)
    assert [e.id for e in last_two] == [e.id for e in events[-2:]]
    after = await sdk.events.list(session.id, after_sequence=len(events) - 3)
    assert [e.id for e in after] == [e.id for e in events[-3:]]
    since = await sdk.events.list(session.id, since_id=events[-2].id)
    assert [e.id for e in since] == [events[-1].id]
    older = await sdk.events.list(session.id, before_sequence=3)
    assert [e.type for e in older] == ["input.message", "session.activated"]
    no_inputs = await sdk.events.list(session.id, exclude=["input.message"])
    assert len(no_inputs) == len(events) - 1


async def test_tool_parts_parse_in_the_sdk(sdk: Everruns) -> None:
    session = await sdk.sessions.create()
    await sdk.messages.create(session.id, "/scenario tool weather in Kyiv")
    await wait_sdk_idle(sdk, session.id)
    listed = await sdk.messages.list(session.id)
    assert [m.role for m in listed] == ["user", "agent"]
    parts = listed[1].content
    calls = [p.as_tool_call() for p in parts if p.is_tool_call()]
    assert len(calls) == 1
    assert calls[0] is not None
    assert calls[0].name == "lookup"
    assert calls[0].arguments == {"query": "weather in Kyiv"}
    results = [p for p in parts if p.type == "tool_result"]
    assert [r.tool_call_id for r in results] == [calls[0].id]
    assert results[0].result == {"query": "weather in Kyiv", "answer": 42}
    events = await sdk.events.list(session.id, types=["tool.started", "tool.completed"])
    assert [e.type for e in events] == ["tool.started", "tool.completed"]
    assert events[0].data["tool_call"]["name"] == "lookup"
    assert events[1].data["tool_call_id"] == calls[0].id
    assert events[1].data["success"] is True
    # The SDK's helper finds the call in the step's `output.message.completed`.
    completed = await sdk.events.list(session.id, types=["output.message.completed"])
    found = [c for e in completed for c in e.tool_calls()]
    assert {(c.id, c.name) for c in found} == {(calls[0].id, "lookup")}


async def test_sdk_errors_carry_the_real_code_and_message(sdk: Everruns) -> None:
    """The SDK reads `{"error": {"code", "message"}}`; before that member every SDK
    error said code="unknown"."""
    unknown = "session_" + "0" * 31 + "1"
    with pytest.raises(NotFoundError) as missing:
        await sdk.sessions.get(unknown)
    assert missing.value.code == "session_not_found"
    assert missing.value.message == f"Session {unknown} not found"
    with pytest.raises(ApiError) as malformed:
        await sdk.sessions.get("sess_123")
    assert (malformed.value.status_code, malformed.value.code) == (400, "invalid_id")
    assert malformed.value.message.startswith("Invalid session ID: invalid prefix")
    with pytest.raises(ApiError) as invalid:
        await sdk.sessions.create(title="x" * 1001)
    assert (invalid.value.status_code, invalid.value.code) == (422, "validation_error")
    assert invalid.value.message.startswith("title: ")


async def test_models_list_and_get_parse_in_the_sdk(sdk: Everruns) -> None:
    """`models.list()` raised 12 validation errors: the catalog lacked upstream's
    ModelWithProvider fields."""
    (model,) = await sdk.models.list()
    assert model.id.startswith("model_")
    assert (model.display_name, model.provider_type) == ("scripted", "scripted")
    assert model.enabled
    assert model.healthy
    fetched = await sdk.models.get(model.id)
    assert fetched.model_dump() == model.model_dump()
    with pytest.raises(NotFoundError):
        await sdk.models.get("model_" + "0" * 32)


async def test_agent_client_card_messages_and_tool_approvals(server: Server) -> None:
    """The SDK's `AgentClient` with `{server}/v1` as its agent URL: the card, a
    session and a message, and a held-back tool call approved through
    `submit_tool_approvals`."""
    guarded = {
        "type": "builtin",
        "name": "lookup",
        "description": "Look something up",
        "parameters": {"type": "object"},
        "policy": "requires_approval",
    }
    async with AgentClient(
        agent_url=f"{server.url}/v1", credential="evm_any_key_in_open_mode"
    ) as agent:
        card = await agent.card()
        assert card["name"] == "evermirror"
        assert "text" in card["accepted_input"]
        assert card["credentials"] == []  # open mode: no key exists
        created = await agent.create_session("agent client")
        assert created["id"].startswith("session_")
        async with httpx.AsyncClient(base_url=server.url) as http:
            session = await http.post("/v1/sessions", json={"tools": [guarded]})
            session_id = session.json()["id"]
            await agent.send_message(session_id, '/scenario call lookup {"q": 1}')

            async def asked() -> bool:
                listed = await http.get(
                    f"/v1/sessions/{session_id}/interactions",
                    params={"status": "pending"},
                )
                return bool(listed.json()["data"])

            await wait_until(asked, "a pending approval")
            messages = (await http.get(f"/v1/sessions/{session_id}/messages")).json()
        (call,) = [
            p for p in messages["data"][-1]["content"] if p["type"] == "tool_call"
        ]
        decided = await agent.submit_tool_approvals(
            session_id,
            {"decisions": [{"tool_call_id": call["id"], "decision": "approve"}]},
        )
        assert [d["status"] for d in decided["data"]] == ["approved"]
        with pytest.raises(ApiError) as twice:
            await agent.submit_tool_approvals(
                session_id,
                {"decisions": [{"tool_call_id": call["id"], "decision": "deny"}]},
            )
        assert twice.value.status_code == 409
        async with httpx.AsyncClient(base_url=server.url) as http:
            await wait_idle(http, session_id)
            final = (await http.get(f"/v1/sessions/{session_id}/messages")).json()
        assert text_of(final["data"][-1]).endswith(
            'The lookup tool returned {"query": null, "answer": 42}.'
        )
        assert (await agent.get_session(session_id))["status"] == "idle"
        listed = await agent.list_sessions(limit=1)
        assert [s["id"] for s in listed["data"]] == [session_id]
        events = await agent.list_events(session_id, after_sequence=0)
        assert [e.sequence for e in events] == list(range(1, len(events) + 1))
        # `limit` is upstream's "the last N matching events".
        newest = await agent.list_events(session_id, after_sequence=0, limit=2)
        assert [e.sequence for e in newest] == [len(events) - 1, len(events)]
        await agent.cancel(session_id)  # nothing runs: a no-op, not an error
