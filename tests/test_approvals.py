"""Approvals (DESIGN.md 2.6): a tool whose policy is `requires_approval` stops in
`awaiting_approval` with a pending `interaction` part until
`POST .../interactions/{id}` approves or denies it; the interaction and the tool's
move commit together. Cancel closes a pending interaction as `turn_stopped`, recovery
as `runtime_interrupted`."""

from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.support.api import (
    get_session,
    list_events,
    list_messages,
    post_message,
    text_of,
)
from tests.support.database import table_rows
from tests.support.in_process import Running
from tests.support.problems import assert_problem
from tests.support.servers import server_process
from tests.support.waits import wait_idle, wait_until

GUARDED = {
    "type": "builtin",
    "name": "lookup",
    "description": "Look something up",
    "parameters": {"type": "object"},
    "policy": "requires_approval",
}
ASK = '/scenario call lookup {"query": "tea"}'


async def guarded_session(client: httpx.AsyncClient, **fields: Any) -> str:
    response = await client.post("/v1/sessions", json={"tools": [GUARDED], **fields})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


async def pending(client: httpx.AsyncClient, session_id: str) -> list[dict[str, Any]]:
    response = await client.get(
        f"/v1/sessions/{session_id}/interactions", params={"status": "pending"}
    )
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


async def first_pending(client: httpx.AsyncClient, session_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    async def some() -> bool:
        found[:] = await pending(client, session_id)
        return bool(found)

    await wait_until(some, "a pending interaction")
    return found[0]


def parts(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [p for p in message["content"] if p["type"] == kind]


async def decide(
    client: httpx.AsyncClient, session_id: str, interaction_id: str, **body: Any
) -> httpx.Response:
    return await client.post(
        f"/v1/sessions/{session_id}/interactions/{interaction_id}", json=body
    )


async def test_an_approved_tool_runs_and_the_model_answers_with_its_result(
    client: httpx.AsyncClient, running: Running
) -> None:
    database = running.app.state.app.database
    session_id = await guarded_session(client)
    await post_message(client, session_id, ASK)
    interaction = await first_pending(client, session_id)
    assert interaction["interaction_type"] == "approval"
    assert interaction["request"]["tool_call"]["name"] == "lookup"
    assert interaction["request"]["tool_call"]["arguments"] == {"query": "tea"}
    assert (await get_session(client, session_id))["status"] == "active"
    agent = (await list_messages(client, session_id))["data"][-1]
    (call,) = parts(agent, "tool_call")
    assert (agent["state"], call["status"]) == ("streaming", "awaiting_approval")
    (part,) = parts(agent, "interaction")
    assert (part["status"], part["tool_call_id"]) == ("pending", call["id"])
    types = [e["type"] for e in await list_events(client, session_id)]
    assert "tool.started" not in types

    approved = await decide(
        client, session_id, interaction["interaction_id"], decision="approve"
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "approved"
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][-1]
    assert [p["status"] for p in parts(final, "tool_call")] == ["completed"]
    (part,) = parts(final, "interaction")
    assert part["status"] == "approved"
    assert part["response"] == {"decision": "approve"}
    assert part["resolved_at"]
    assert text_of(final).endswith(
        'The lookup tool returned {"query": "tea", "answer": 42}.'
    )
    assert await pending(client, session_id) == []
    listed = await client.get(f"/v1/sessions/{session_id}/interactions")
    assert [i["status"] for i in listed.json()["data"]] == ["approved"]

    # Deciding again, an unknown interaction, a malformed id: refused, nothing written.
    before = await table_rows(database)
    again = await decide(
        client, session_id, interaction["interaction_id"], decision="deny"
    )
    assert_problem(again, 409, code="interaction_resolved")
    unknown = "interaction_" + "0" * 32
    assert_problem(
        await decide(client, session_id, unknown, decision="approve"),
        404,
        code="interaction_not_found",
    )
    assert_problem(
        await decide(client, session_id, "interaction_x", decision="approve"), 400
    )
    assert_problem(await decide(client, session_id, unknown, decision="maybe"), 422)
    assert await table_rows(database) == before
    other = (await client.post("/v1/sessions", json={})).json()["id"]
    before = await table_rows(database)
    assert_problem(
        await decide(client, other, interaction["interaction_id"], decision="approve"),
        404,
    )
    assert await table_rows(database) == before


async def test_a_denied_tool_fails_with_the_reason_the_model_sees(
    client: httpx.AsyncClient,
) -> None:
    session_id = await guarded_session(client)
    await post_message(client, session_id, ASK)
    interaction = await first_pending(client, session_id)
    denied = await decide(
        client,
        session_id,
        interaction["interaction_id"],
        decision="deny",
        reason="not now",
    )
    assert denied.json()["status"] == "denied"
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][-1]
    assert [p["status"] for p in parts(final, "tool_call")] == ["failed"]
    (result,) = parts(final, "tool_result")
    assert result["error"] == "The user denied this tool call: not now"
    assert text_of(final).endswith(
        "The lookup tool failed: The user denied this tool call: not now"
    )
    types = [e["type"] for e in await list_events(client, session_id)]
    assert "tool.started" not in types
    assert types.count("tool.completed") == 1


async def test_always_allow_runs_without_asking(client: httpx.AsyncClient) -> None:
    session_id = await guarded_session(client, approval_mode="always-allow")
    assert (await get_session(client, session_id))["approval_mode"] == "always-allow"
    await post_message(client, session_id, ASK)
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][-1]
    assert parts(final, "interaction") == []
    assert [p["status"] for p in parts(final, "tool_call")] == ["completed"]
    # Back to asking: the next call waits.
    patched = await client.patch(
        f"/v1/sessions/{session_id}", json={"approval_mode": "ask"}
    )
    assert patched.json()["approval_mode"] == "ask"
    await post_message(client, session_id, ASK)
    interaction = await first_pending(client, session_id)
    await decide(client, session_id, interaction["interaction_id"], decision="approve")
    await wait_idle(client, session_id)


async def test_cancel_while_pending_cancels_the_interaction(
    client: httpx.AsyncClient,
) -> None:
    session_id = await guarded_session(client)
    await post_message(client, session_id, ASK)
    interaction = await first_pending(client, session_id)
    await client.post(f"/v1/sessions/{session_id}/cancel")
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][-1]
    (part,) = parts(final, "interaction")
    assert (part["status"], part["cancel_reason"]) == ("cancelled", "turn_stopped")
    assert [p["status"] for p in parts(final, "tool_call")] == ["failed"]
    late = await decide(
        client, session_id, interaction["interaction_id"], decision="approve"
    )
    assert_problem(late, 409, code="interaction_resolved")


async def test_recovery_cancels_a_pending_interaction_as_interrupted(
    settings: Settings, tmp_path: Path
) -> None:
    url = settings.database_url
    env = {"RUNNER_RENEW_SECONDS": "0.5"}
    async with (
        server_process(url, tmp_path, kill=True, **env) as first,
        httpx.AsyncClient(base_url=first.url, timeout=10) as api,
    ):
        session_id = await guarded_session(api)
        await post_message(api, session_id, ASK)
        await first_pending(api, session_id)
    async with (
        server_process(url, tmp_path, kill=False, **env) as second,
        httpx.AsyncClient(base_url=second.url, timeout=10) as api,
    ):
        await wait_idle(api, session_id)
        final = (await list_messages(api, session_id))["data"][-1]
        (part,) = parts(final, "interaction")
        assert (part["status"], part["cancel_reason"]) == (
            "cancelled",
            "runtime_interrupted",
        )
        assert final["state"] == "done"
        assert [p["status"] for p in parts(final, "tool_call")] == ["failed"]


@pytest.mark.postgres_only
async def test_a_decision_posted_to_another_process_reaches_the_runner(
    settings: Settings, tmp_path: Path
) -> None:
    url = settings.database_url
    async with (
        server_process(url, tmp_path, kill=True) as a,
        server_process(url, tmp_path, kill=True) as b,
        httpx.AsyncClient(base_url=a.url, timeout=10) as client_a,
        httpx.AsyncClient(base_url=b.url, timeout=10) as client_b,
    ):
        session_id = await guarded_session(client_a)
        await post_message(client_a, session_id, ASK)
        interaction = await first_pending(client_b, session_id)
        decided = await decide(
            client_b, session_id, interaction["interaction_id"], decision="approve"
        )
        assert decided.status_code == 200, decided.text
        await wait_idle(client_a, session_id)
        final = (await list_messages(client_b, session_id))["data"][-1]
        assert [p["status"] for p in parts(final, "tool_call")] == ["completed"]
        assert text_of(final).endswith(
            'The lookup tool returned {"query": "tea", "answer": 42}.'
        )


async def approvals(
    client: httpx.AsyncClient, session_id: str, *decisions: dict[str, Any]
) -> httpx.Response:
    return await client.post(
        f"/v1/sessions/{session_id}/tool-approvals",
        json={"decisions": list(decisions)},
    )


async def test_tool_approvals_decide_by_tool_call_or_interaction_all_or_nothing(
    client: httpx.AsyncClient, running: Running
) -> None:
    """`POST .../tool-approvals` (the SDK's `AgentClient.submit_tool_approvals`):
    decisions name the tool call or the interaction; one that fails writes none."""
    database = running.app.state.app.database
    session_id = await guarded_session(client)
    await post_message(client, session_id, ASK)
    interaction = await first_pending(client, session_id)
    call_id = interaction["tool_call_id"]
    unknown = "interaction_" + "0" * 32

    before = await table_rows(database)
    refused = [
        # A valid decision beside one for nothing pending: neither is written.
        (
            await approvals(
                client,
                session_id,
                {"tool_call_id": call_id, "decision": "approve"},
                {"tool_call_id": "call_nothing", "decision": "approve"},
            ),
            404,
        ),
        (
            await approvals(
                client,
                session_id,
                {"tool_call_id": call_id, "decision": "approve"},
                {"interaction_id": unknown, "decision": "deny"},
            ),
            404,
        ),
        (
            await approvals(
                client,
                session_id,
                {"tool_call_id": call_id, "decision": "approve"},
                {"interaction_id": interaction["interaction_id"], "decision": "deny"},
            ),
            422,
        ),
        (await approvals(client, session_id), 422),
        (await approvals(client, session_id, {"decision": "approve"}), 422),
        (
            await approvals(
                client,
                session_id,
                {
                    "tool_call_id": call_id,
                    "interaction_id": interaction["interaction_id"],
                    "decision": "approve",
                },
            ),
            422,
        ),
        (
            await approvals(
                client, session_id, {"tool_call_id": call_id, "decision": "maybe"}
            ),
            422,
        ),
    ]
    for response, status in refused:
        assert_problem(response, status)
    assert await table_rows(database) == before
    assert [i["interaction_id"] for i in await pending(client, session_id)] == [
        interaction["interaction_id"]
    ]

    decided = await approvals(
        client,
        session_id,
        {"tool_call_id": call_id, "decision": "deny", "reason": "not today"},
    )
    assert decided.status_code == 200, decided.text
    (view,) = decided.json()["data"]
    assert (view["interaction_id"], view["status"]) == (
        interaction["interaction_id"],
        "denied",
    )
    assert view["response"] == {"decision": "deny", "reason": "not today"}
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][-1]
    (result,) = parts(final, "tool_result")
    assert result["error"] == "The user denied this tool call: not today"
    again = await approvals(
        client,
        session_id,
        {"interaction_id": interaction["interaction_id"], "decision": "approve"},
    )
    assert_problem(again, 409, code="interaction_resolved")
