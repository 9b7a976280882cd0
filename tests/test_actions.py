"""Actions (DESIGN.md 2.6, the seed's Action ownership rule): a `PATCH` of a session's
model, approval mode, system prompt or tools is an `action` part. While the turn has
a streaming agent message the part joins it (same message, revision + 1); otherwise
it is a standalone agent message. The change applies from the turn's next step."""

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.catalog.registry import derived_id
from app.live.items import Wakeup
from app.settings import Settings
from tests.support.api import list_events, list_messages, post_message, text_of, uuid_of
from tests.support.database import table_rows
from tests.support.in_process import Running
from tests.support.problems import assert_problem
from tests.support.servers import server_process, start_server
from tests.support.sse import Frame, is_delta, open_stream
from tests.support.waits import wait_idle, wait_until
from tests.test_approvals import ASK, GUARDED, decide, first_pending, guarded_session
from tests.test_catalog import LARGE, openai_entry_server

SCRIPTED = derived_id("scripted", "scripted")


def actions(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in message["content"] if p["type"] == "action"]


async def patch(
    client: httpx.AsyncClient, session_id: str, **body: Any
) -> dict[str, Any]:
    response = await client.patch(f"/v1/sessions/{session_id}", json=body)
    assert response.status_code == 200, response.text
    session: dict[str, Any] = response.json()
    return session


async def started_reply(
    client: httpx.AsyncClient, session_id: str, text: str, interval: float = 0.05
) -> dict[str, Any]:
    """Post `text` (a long reply) and return the agent message once it streams."""
    await post_message(client, session_id, text)
    seen: list[dict[str, Any]] = []

    async def streaming() -> bool:
        seen[:] = (await list_messages(client, session_id))["data"]
        return len(seen) == 2 and seen[1]["state"] == "streaming"

    await wait_until(streaming, "the agent message to stream", interval=interval)
    return seen[1]


async def streams_text(client: httpx.AsyncClient, session_id: str) -> None:
    """Until the running step has streamed text: a live delta on `/sse`."""
    async with open_stream(client, f"/v1/sessions/{session_id}/sse") as stream:
        await stream.until(is_delta, 10)


async def test_a_change_while_idle_is_a_standalone_action_message(
    client: httpx.AsyncClient,
) -> None:
    session_id = (await client.post("/v1/sessions", json={})).json()["id"]
    session = await patch(
        client,
        session_id,
        approval_mode="always-allow",
        system_prompt="Answer in French.",
        model_id=SCRIPTED,
    )
    assert session["approval_mode"] == "always-allow"
    assert session["system_prompt"] == "Answer in French."
    assert session["model_id"] == SCRIPTED
    [message] = (await list_messages(client, session_id))["data"]
    assert (message["role"], message["state"], message["revision"]) == (
        "agent",
        "done",
        1,
    )
    assert "turn_id" not in message
    parts = actions(message)
    assert parts == message["content"]
    assert [p["action_type"] for p in parts] == [
        "model_changed",
        "approval_mode_changed",
        "system_prompt_changed",
    ]
    for part in parts:
        assert part["action_id"].startswith("action_")
        assert part["state"] == "completed"
        assert part["title"]
    assert parts[0]["title"] == "Model changed to scripted"
    assert parts[1]["data"] == {
        "field": "approval_mode",
        "old": None,
        "new": "always-allow",
    }
    assert parts[2]["data"]["new"] == "Answer in French."
    events = await list_events(client, session_id)
    assert [e["type"] for e in events] == [
        "session.model.changed",
        "output.message.completed",
    ]
    assert events[0]["data"] == {"model_id": SCRIPTED, "previous_model_id": None}

    # The same values again change nothing: no action, no event.
    await patch(client, session_id, approval_mode="always-allow", model_id=SCRIPTED)
    assert len(await list_events(client, session_id)) == 2
    # Tools replaced, then removed: an action each, naming them.
    await patch(client, session_id, tools=[GUARDED])
    await patch(client, session_id, tools=[])
    listed = (await list_messages(client, session_id))["data"]
    assert [actions(m)[0]["title"] for m in listed[1:]] == [
        "Tools changed: lookup",
        "Tools changed: none",
    ]
    # A tool list by its names, never two whole copies of the definitions.
    assert listed[1]["content"][0]["data"] == {
        "field": "tools",
        "names": ["lookup"],
        "added": ["lookup"],
        "removed": [],
        "changed": [],
    }
    assert listed[2]["content"][0]["data"] == {
        "field": "tools",
        "names": [],
        "added": [],
        "removed": ["lookup"],
        "changed": [],
    }
    redefined = {**GUARDED, "description": "Redefined."}
    await patch(client, session_id, tools=[GUARDED])
    await patch(client, session_id, tools=[redefined])
    last = (await list_messages(client, session_id))["data"][-1]
    assert last["content"][0]["data"]["changed"] == ["lookup"]


async def test_a_title_change_is_upstreams_event_and_no_action(
    client: httpx.AsyncClient,
) -> None:
    session_id = (await client.post("/v1/sessions", json={"title": "one"})).json()["id"]
    await patch(client, session_id, title="two", tags=["x"], goal="g", locale="uk-UA")
    assert (await list_messages(client, session_id))["data"] == []
    events = await list_events(client, session_id)
    assert [(e["type"], e["data"]) for e in events] == [
        ("session.title.updated", {"previous_title": "one", "title": "two"})
    ]


async def test_bad_changes_are_refused_and_change_nothing(
    client: httpx.AsyncClient, running: Running
) -> None:
    database = running.app.state.app.database
    session_id = (await client.post("/v1/sessions", json={})).json()["id"]
    before = await table_rows(database)
    unknown = "model_" + "e" * 32
    refused = await client.patch(
        f"/v1/sessions/{session_id}", json={"model_id": unknown}
    )
    assert_problem(refused, 422)
    assert "model_id" in refused.json()["detail"]
    for body in (
        {"model_id": "gpt-4"},
        {"approval_mode": "sometimes"},
        {"system_prompt": 5},
        {"tools": [{"type": "builtin", "name": "bad name"}]},
    ):
        response = await client.patch(f"/v1/sessions/{session_id}", json=body)
        assert_problem(response, 422)
    assert await table_rows(database) == before


async def test_a_change_during_a_turn_joins_its_streaming_message(
    client: httpx.AsyncClient,
) -> None:
    """The turn waits for an approval, its agent message open: the action joins it at
    revision + 1 and the turn goes on to complete with it."""
    session_id = await guarded_session(client)
    await post_message(client, session_id, ASK)
    interaction = await first_pending(client, session_id)
    agent = (await list_messages(client, session_id))["data"][-1]
    assert agent["state"] == "streaming"
    await patch(client, session_id, approval_mode="always-allow")
    joined = (await list_messages(client, session_id))["data"]
    assert len(joined) == 2
    assert joined[-1]["id"] == agent["id"]
    assert joined[-1]["revision"] == agent["revision"] + 1
    assert joined[-1]["state"] == "streaming"
    assert [p["type"] for p in joined[-1]["content"]] == [
        *[p["type"] for p in agent["content"]],
        "action",
    ]
    decided = await decide(
        client, session_id, interaction["interaction_id"], decision="approve"
    )
    assert decided.status_code == 200, decided.text
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][-1]
    assert final["id"] == agent["id"]
    assert final["state"] == "done"
    types = [p["type"] for p in final["content"]]
    assert types.index("action") < types.index("tool_result")
    assert [p["sequence"] for p in final["content"]] == list(range(1, len(types) + 1))
    assert text_of(final).endswith('returned {"query": "tea", "answer": 42}.')


async def test_a_change_after_the_turn_closed_its_message_stands_alone(
    client: httpx.AsyncClient,
) -> None:
    session_id = (await client.post("/v1/sessions", json={})).json()["id"]
    await post_message(client, session_id, "hello there")
    await wait_idle(client, session_id)
    await patch(client, session_id, system_prompt="Be brief.")
    listed = (await list_messages(client, session_id))["data"]
    assert [m["role"] for m in listed] == ["user", "agent", "agent"]
    assert [p["type"] for p in listed[1]["content"]] == ["text"]
    assert [p["action_type"] for p in listed[2]["content"]] == ["system_prompt_changed"]


async def test_a_change_mid_step_keeps_the_step_whole(
    settings: Settings, tmp_path: Path
) -> None:
    """PATCH while a step streams: the action is committed at once (revision + 1)
    ahead of the step's parts, and the step commits after it with all its text."""
    server = start_server(settings.database_url, tmp_path, SCRIPTED_DELAY_MS="10")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as api:
            session_id = (await api.post("/v1/sessions", json={})).json()["id"]
            reply = await started_reply(api, session_id, "/scenario long 120")
            await streams_text(api, session_id)
            await patch(api, session_id, approval_mode="always-allow")
            joined = (await list_messages(api, session_id))["data"][1]
            assert joined["state"] == "streaming"
            assert [p["type"] for p in joined["content"]] == ["action"]
            assert joined["revision"] == reply["revision"] + 1
            await wait_idle(api, session_id)
            final = (await list_messages(api, session_id))["data"][1]
            assert [(p["type"], p["sequence"]) for p in final["content"]] == [
                ("action", 1),
                ("text", 2),
            ]
            assert text_of(final) == "".join(f"chunk{i} " for i in range(120))
            assert final["revision"] == joined["revision"] + 1

            # Title and model changes are `session` Mutations, replayed from the log.
            await patch(api, session_id, title="renamed", model_id=SCRIPTED)
            url = f"/v1/sessions/{session_id}/messages/stream"
            async with open_stream(api, url, params={"after": "0"}) as stream:
                assert stream.status_code == 200
                changes: list[dict[str, Any]] = []

                def both(frame: Frame) -> bool:
                    if frame.event == "session":
                        changes.append(frame.json())
                    return sum("status" not in c for c in changes) == 2

                await stream.until(both, within=5)
            assert [
                {k: v for k, v in c.items() if k in ("title", "model_id")}
                for c in changes
                if "status" not in c
            ] == [{"title": "renamed"}, {"model_id": SCRIPTED}]
            sse = await api.get(
                f"/v1/sessions/{session_id}/events",
                params={"types": ["session.title.updated", "session.model.changed"]},
            )
            assert [e["type"] for e in sse.json()["data"]] == [
                "session.title.updated",
                "session.model.changed",
            ]
    finally:
        server.stop()


async def test_a_model_and_prompt_change_apply_from_the_next_step(
    database_url: str, tmp_path: Path
) -> None:
    """The first step runs on the scripted model and stops for an approval; the
    session then switches to the catalog's OpenAI entry and a system prompt. After
    the approval, the next step is the provider's request, with both."""
    with openai_entry_server(database_url, tmp_path) as (server, fake):
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as api:
            session_id = await guarded_session(api)
            await post_message(api, session_id, ASK)
            interaction = await first_pending(api, session_id)
            assert fake.requests == []
            await patch(api, session_id, model_id=LARGE, system_prompt="Be brief.")
            decided = await decide(
                api, session_id, interaction["interaction_id"], decision="approve"
            )
            assert decided.status_code == 200, decided.text
            await wait_idle(api, session_id)
            [request] = fake.for_text(ASK)
            assert request.body["model"] == "fake-large-2026"
            assert request.body["messages"][0] == {
                "role": "system",
                "content": "Be brief.",
            }
            final = (await list_messages(api, session_id))["data"][-1]
            titles = [p["title"] for p in actions(final)]
            assert titles == ["Model changed to large", "System prompt changed"]
            assert text_of(final).endswith("Hello from the fake model.")
            types = [e["type"] for e in await list_events(api, session_id)]
            assert "session.model.changed" in types
            assert types[-1] == "session.idled"


@pytest.mark.postgres_only
async def test_a_change_on_another_process_joins_the_step_it_streams(
    settings: Settings, tmp_path: Path
) -> None:
    """The step streams on process A; the PATCH is B's. A hears of the Action over
    the bus (or finds the revision moved when it commits) and the step commits
    after it, whole."""
    url = settings.database_url
    async with (
        server_process(url, tmp_path, kill=True, SCRIPTED_DELAY_MS="10") as a,
        server_process(url, tmp_path, kill=True) as b,
        httpx.AsyncClient(base_url=a.url, timeout=10) as client_a,
        httpx.AsyncClient(base_url=b.url, timeout=10) as client_b,
    ):
        session_id = (await client_a.post("/v1/sessions", json={})).json()["id"]
        await started_reply(client_a, session_id, "/scenario long 120")
        await streams_text(client_a, session_id)
        await patch(client_b, session_id, tools=[GUARDED])
        await wait_idle(client_a, session_id)
        for api in (client_a, client_b):
            final = (await list_messages(api, session_id))["data"][1]
            assert [p["type"] for p in final["content"]] == ["action", "text"]
            assert final["content"][0]["action_type"] == "tools_changed"
            assert text_of(final) == "".join(f"chunk{i} " for i in range(120))


async def test_a_step_that_never_heard_of_the_action_commits_after_it(
    client: httpx.AsyncClient, running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner misses the wake-ups (as when another process's Action commits just
    before the step ends): its step checkpoint finds the message's revision moved,
    reads the message again, and commits after the Action, whole."""
    runner = running.app.state.app.runner
    deliver = runner.deliver

    def deaf(item: Any) -> None:
        if not isinstance(item, Wakeup):
            deliver(item)

    monkeypatch.setattr(runner, "deliver", deaf)
    session_id = (await client.post("/v1/sessions", json={})).json()["id"]
    reply = await started_reply(
        client, session_id, "/scenario long 1000", interval=0.01
    )
    await patch(client, session_id, approval_mode="always-allow")
    assert runner.live[uuid_of(reply["id"])].revision == reply["revision"]
    await wait_idle(client, session_id)
    final = (await list_messages(client, session_id))["data"][1]
    assert [(p["type"], p["sequence"]) for p in final["content"]] == [
        ("action", 1),
        ("text", 2),
    ]
    assert text_of(final) == "".join(f"chunk{i} " for i in range(1000))
    assert final["revision"] == reply["revision"] + 2


async def test_many_changes_of_a_large_tool_list_while_a_turn_waits_stay_small(
    client: httpx.AsyncClient,
) -> None:
    """Each PATCH while the turn waits for an approval adds an action part to its
    message; a part names the tools, it does not copy the definitions (12 PATCHes of a
    ~100 KB list made one message megabytes long when it held both whole lists)."""
    session_id = await guarded_session(client)
    await post_message(client, session_id, ASK)
    await first_pending(client, session_id)
    padding = "x" * 2_000
    for round_ in range(12):
        tools = [GUARDED] + [
            {
                "name": f"tool_{i}",
                "description": f"{round_} {padding}",
                "parameters": {"type": "object"},
            }
            for i in range(48)
        ]
        await patch(client, session_id, tools=tools)
    _, waiting = (await list_messages(client, session_id))["data"]
    assert waiting["state"] == "streaming"
    changes = actions(waiting)
    assert len(changes) == 12
    assert changes[-1]["data"]["changed"] == [f"tool_{i}" for i in range(48)]
    assert len(json.dumps(waiting)) < 40_000
