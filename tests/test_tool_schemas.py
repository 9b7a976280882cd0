"""Tool `parameters` checked against the JSON Schema meta-schema within a budget
(app/tools/schema_check.py): a tool list past the budget is refused before any checking,
an invalid schema is a 422 naming the tool, and while a large list is checked the
process goes on serving other requests."""

import asyncio
import time
import uuid
from typing import Any

import httpx

from app.tools.schema_check import MAX_SCHEMA_NODES, schema_nodes
from tests.support.api import create_session, get_session
from tests.support.problems import assert_problem
from tests.support.servers import Server


def tools_of(count: int, subschemas: int) -> list[dict[str, Any]]:
    """`count` tools, each `{"allOf": [...]}` of `subschemas` distinct subschemas (a
    fresh name each call: never a schema the process has seen)."""
    salt = uuid.uuid4().hex
    return [
        {
            "name": f"tool_{t}",
            "parameters": {
                "allOf": [
                    {"properties": {f"p{salt}{i}": {"type": "string"}}}
                    for i in range(subschemas)
                ]
            },
        }
        for t in range(count)
    ]


def test_the_budget_counts_containers_and_items() -> None:
    assert schema_nodes({"type": "object"}, 100) == 1
    assert schema_nodes({"allOf": [{}, {}]}, 100) == 1 + 3 + 2
    # It stops walking past the budget (the list's items were counted at once).
    assert schema_nodes({"allOf": [{} for _ in range(10_000)]}, 50) == 1 + 10_001


async def test_tools_past_the_budget_are_refused_and_change_nothing(
    client: httpx.AsyncClient,
) -> None:
    sid = await create_session(client, "budget")
    # 40 tools of 6,000 empty subschemas each: a minute of checking before the budget.
    tools = [
        {"name": f"t{i}", "parameters": {"allOf": [{} for _ in range(6_000)]}}
        for i in range(40)
    ]
    answer = await client.patch(f"/v1/sessions/{sid}", json={"tools": tools})
    problem = assert_problem(answer, 422)
    assert str(MAX_SCHEMA_NODES) in problem["detail"]
    assert (await get_session(client, sid)).get("tools") in (None, [])
    created = await client.post("/v1/sessions", json={"tools": tools})
    assert_problem(created, 422)


async def test_an_invalid_schema_is_named_and_changes_nothing(
    client: httpx.AsyncClient,
) -> None:
    sid = await create_session(client, "invalid")
    tools = [
        {"name": "fine", "parameters": {"type": "object"}},
        {"name": "bad", "parameters": {"type": "object", "properties": {"a": 3}}},
    ]
    answer = await client.patch(f"/v1/sessions/{sid}", json={"tools": tools})
    problem = assert_problem(answer, 422)
    assert "tools.1.parameters: not a valid JSON Schema" in problem["detail"]
    assert (await get_session(client, sid)).get("tools") in (None, [])
    # The same list without the bad tool is taken, and taken again.
    for _ in range(2):
        answer = await client.patch(f"/v1/sessions/{sid}", json={"tools": tools[:1]})
        assert answer.status_code == 200, answer.text
        assert [t["name"] for t in answer.json()["tools"]] == ["fine"]


async def test_other_requests_are_served_while_a_large_tool_list_is_checked(
    server: Server,
) -> None:
    """On a server process: its event loop answers /health while it checks the
    tools (before, the check ran in request validation, on the loop)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        sid = await create_session(client, "large")
        # Within the budget (a tool: its object, the list, and per subschema an item
        # and three objects), and near the most checking it allows.
        tools = tools_of(100, (MAX_SCHEMA_NODES // 100 - 2) // 4)
        nodes = sum(schema_nodes(t["parameters"], 10**6) for t in tools)
        assert nodes <= MAX_SCHEMA_NODES
        patch = asyncio.create_task(
            client.patch(f"/v1/sessions/{sid}", json={"tools": tools})
        )
        await asyncio.sleep(0.1)
        asked = time.monotonic()
        health = await client.get("/health")
        waited = time.monotonic() - asked
        assert health.status_code == 200
        # The check takes over a second here; /health waits for a share of the
        # interpreter lock at most (before, it waited for the whole check). The bound
        # leaves room for a loaded machine (a CI run once read 0.26 s).
        assert not patch.done(), "/health was answered only after the tools' check"
        assert waited < 0.5, f"/health took {waited:.2f} s during the check"
        answer = await patch
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["tools"]) == 100
