"""Fork (`POST /v1/sessions/{id}/fork`), edit (`.../messages/{id}/edit`) and
regenerate (`.../messages/{id}/regenerate`): a new session with the committed history
up to a boundary, each copy keeping its `origin`, the source untouched; a fork made
while a turn runs copies exactly what was committed; pending approvals are not
copied."""

import asyncio
from typing import Any

import httpx

from tests.support.api import (
    all_messages,
    create_session,
    list_events,
    post_message,
    text_of,
)
from tests.support.problems import assert_problem
from tests.support.servers import Server, live_server_fixture
from tests.support.waits import wait_idle

live_server = live_server_fixture("fork", SCRIPTED_DELAY_MS="30")


async def conversation(client: httpx.AsyncClient, *texts: str) -> str:
    sid = await create_session(client, title="source")
    for text in texts:
        await post_message(client, sid, text)
        await wait_idle(client, sid)
    return sid


async def fork(client: httpx.AsyncClient, sid: str, **body: Any) -> dict[str, Any]:
    response = await client.post(f"/v1/sessions/{sid}/fork", json=body)
    assert response.status_code == 201, response.text
    forked: dict[str, Any] = response.json()
    assert response.headers["location"] == forked["self_url"]
    return forked


def bare(message: dict[str, Any]) -> tuple[str, str, str]:
    return message["role"], message["visibility"], text_of(message)


async def test_a_fork_copies_the_history_with_its_lineage(
    client: httpx.AsyncClient,
) -> None:
    sid = await conversation(client, "one", "two")
    source = await all_messages(client, sid)
    forked = await fork(client, sid)
    assert forked["forked_from_session_id"] == sid
    assert forked["forked_from_sequence"] == source[-1]["sequence"]
    assert "forked_from_message_id" not in forked
    assert forked["title"] == "source"
    copies = await all_messages(client, forked["id"])
    assert [bare(m) for m in copies] == [bare(m) for m in source]
    for copy, original in zip(copies, source, strict=True):
        assert copy["id"] != original["id"]
        assert copy["session_id"] == forked["id"]
        assert copy["state"] == "done"
        assert "turn_id" not in copy
        assert copy["origin"] == {
            "session_id": sid,
            "message_id": original["id"],
            "turn_id": original["turn_id"],
        }
    # Its log holds each copy's event, in order; the source is as it was.
    events = await list_events(client, forked["id"])
    assert [e["type"] for e in events] == [
        "input.message",
        "output.message.completed",
        "input.message",
        "output.message.completed",
    ]
    assert await all_messages(client, sid) == source
    # And it is a session like any other: a message starts a turn there.
    await post_message(client, forked["id"], "three")
    await wait_idle(client, forked["id"])
    assert [text_of(m) for m in await all_messages(client, forked["id"])][-2:] == [
        "three"
    ] * 2


async def test_a_fork_ends_at_a_message_with_it_or_before_it(
    client: httpx.AsyncClient,
) -> None:
    sid = await conversation(client, "one", "two", "three")
    source = await all_messages(client, sid)
    boundary = source[2]  # the second question
    inclusive = await fork(
        client, sid, message_id=boundary["id"], title="branch", tags=["b"]
    )
    assert inclusive["forked_from_message_id"] == boundary["id"]
    assert inclusive["title"] == "branch"
    assert inclusive["tags"] == ["b"]
    assert [text_of(m) for m in await all_messages(client, inclusive["id"])] == [
        "one",
        "one",
        "two",
    ]
    exclusive = await fork(
        client, sid, message_id=boundary["id"], include_message=False
    )
    assert [text_of(m) for m in await all_messages(client, exclusive["id"])] == [
        "one",
        "one",
    ]
    first = await fork(client, sid, message_id=source[0]["id"], include_message=False)
    assert await all_messages(client, first["id"]) == []


async def test_regenerate_and_edit_branch_and_leave_the_source_untouched(
    client: httpx.AsyncClient,
) -> None:
    sid = await conversation(client, "first question", "second question")
    source = await all_messages(client, sid)
    answer = source[3]
    response = await client.post(
        f"/v1/sessions/{sid}/messages/{answer['id']}/regenerate"
    )
    assert response.status_code == 201, response.text
    branch = response.json()
    new_sid = branch["session"]["id"]
    assert branch["session"]["forked_from_message_id"] == source[2]["id"]
    assert branch["message"]["delivery"] == "started"
    assert branch["message"]["turn_id"]
    await wait_idle(client, new_sid)
    regenerated = await all_messages(client, new_sid)
    assert [text_of(m) for m in regenerated] == [
        "first question",
        "first question",
        "second question",
        "second question",
    ]
    assert "origin" not in regenerated[2]  # asked again, not copied
    assert regenerated[3]["turn_id"] == branch["message"]["turn_id"]

    edited = await client.post(
        f"/v1/sessions/{sid}/messages/{source[2]['id']}/edit",
        json={"message": {"content": [{"type": "text", "text": "an edited question"}]}},
    )
    assert edited.status_code == 201, edited.text
    edit_sid = edited.json()["session"]["id"]
    await wait_idle(client, edit_sid)
    assert [text_of(m) for m in await all_messages(client, edit_sid)] == [
        "first question",
        "first question",
        "an edited question",
        "an edited question",
    ]
    assert await all_messages(client, sid) == source


async def test_bad_branches_change_nothing(client: httpx.AsyncClient) -> None:
    sid = await conversation(client, "hello")
    question, answer = await all_messages(client, sid)
    missing = "message_" + "0" * 32
    cases: list[tuple[str, dict[str, Any] | None, int]] = [
        (f"/v1/sessions/{sid}/messages/{question['id']}/regenerate", None, 400),
        (f"/v1/sessions/{sid}/messages/{missing}/regenerate", None, 404),
        (
            f"/v1/sessions/{sid}/messages/{answer['id']}/edit",
            {"message": {"content": [{"type": "text", "text": "x"}]}},
            422,
        ),
        (f"/v1/sessions/{sid}/messages/{question['id']}/edit", {"message": {}}, 422),
        (f"/v1/sessions/{sid}/fork", {"message_id": missing}, 404),
        (f"/v1/sessions/{sid}/fork", {"message_id": "nope"}, 422),
        ("/v1/sessions/session_" + "0" * 32 + "/fork", {}, 404),
    ]
    for path, body, status in cases:
        response = await client.post(path, json=body)
        assert_problem(response, status)
    listed = (await client.get("/v1/sessions")).json()["data"]
    assert [s["id"] for s in listed] == [sid]


async def test_pending_approvals_are_not_copied(client: httpx.AsyncClient) -> None:
    tool = {
        "name": "lookup",
        "type": "builtin",
        "policy": "requires_approval",
        "parameters": {"type": "object"},
    }
    sid = (await client.post("/v1/sessions", json={"tools": [tool]})).json()["id"]
    await post_message(client, sid, '/scenario call lookup {"query": "x"}')
    for _ in range(200):
        pending = (
            await client.get(f"/v1/sessions/{sid}/interactions?status=pending")
        ).json()
        if pending["data"]:
            break
        await asyncio.sleep(0.02)
    assert pending["data"], "the turn never asked for the approval"
    forked = await fork(client, sid)
    copies = await all_messages(client, forked["id"])
    parts = [p["type"] for m in copies for p in m["content"]]
    assert "tool_call" in parts
    assert "interaction" not in parts
    assert forked["status"] != "active"
    # The source still waits for its decision.
    still = (await client.get(f"/v1/sessions/{sid}/interactions?status=pending")).json()
    assert len(still["data"]) == 1


async def test_a_fork_mid_turn_copies_what_was_committed(live_server: Server) -> None:
    async with httpx.AsyncClient(base_url=live_server.url, timeout=30) as client:
        sid = await create_session(client)
        await post_message(client, sid, "/scenario long 200")
        forked: dict[str, Any] | None = None
        for _ in range(300):
            messages = await all_messages(client, sid)
            if len(messages) == 2 and messages[1]["state"] == "streaming":
                forked = await fork(client, sid)
                break
            await asyncio.sleep(0.02)
        assert forked is not None, "the turn never had a streaming message"
        copies = await all_messages(client, forked["id"])
        assert [m["role"] for m in copies] == ["user", "agent"]
        # The copy is the agent message as committed when the fork was made: a prefix
        # of the reply, finished in the fork.
        assert copies[1]["state"] == "done"
        await wait_idle(client, sid)
        final = text_of((await all_messages(client, sid))[1])
        assert final.startswith(text_of(copies[1]))
        assert final == "".join(f"chunk{i} " for i in range(200))
        assert (await client.get(f"/v1/sessions/{forked['id']}")).json()[
            "status"
        ] != "active"


async def test_a_sessions_branches_are_listed(client: httpx.AsyncClient) -> None:
    sid = await conversation(client, "one")
    other = await conversation(client, "two")
    first = await fork(client, sid)
    second = await fork(client, sid, title="second")
    await fork(client, other)
    listed = (await client.get("/v1/sessions", params={"forked_from": sid})).json()
    assert sorted(s["id"] for s in listed["data"]) == sorted(
        [first["id"], second["id"]]
    )
    assert listed["total"] == 2
    bad = await client.get("/v1/sessions", params={"forked_from": "nope"})
    assert_problem(bad, 400)
