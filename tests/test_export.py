"""`GET /v1/sessions/{id}/export`: the session, every message (internal ones included)
and every event, one JSON object per line, as the other routes answer them; bounded at
the sequence the session had when the export began; read in batches."""

import json
from typing import Any

import httpx
import orjson
import pytest
from everruns_sdk import Everruns

from app.db.reads import Reads
from app.sessions import export
from tests.support.api import create_session, list_events, post_message
from tests.support.in_process import Running
from tests.support.problems import assert_problem
from tests.support.waits import wait_idle, wait_sdk_idle


def lines(body: bytes) -> list[dict[str, Any]]:
    assert body.endswith(b"\n")
    return [orjson.loads(line) for line in body.split(b"\n")[:-1]]


async def test_the_export_is_the_session_its_messages_and_its_events(
    client: httpx.AsyncClient,
) -> None:
    sid = await create_session(client, title="exported")
    for text in ("first", "second"):
        await post_message(client, sid, text)
        await wait_idle(client, sid)
    response = await client.get(f"/v1/sessions/{sid}/export")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/jsonl"
    assert response.headers["content-disposition"] == (
        f'attachment; filename="{sid}.jsonl"'
    )
    got = lines(response.content)
    assert [line["type"] for line in got[:1]] == ["session"]
    assert got[0]["session"] == (await client.get(f"/v1/sessions/{sid}")).json()
    messages = [line["message"] for line in got if line["type"] == "message"]
    listed = (
        await client.get(
            f"/v1/sessions/{sid}/messages", params={"include_internal": "true"}
        )
    ).json()["data"]
    assert messages == listed
    assert [m["role"] for m in messages] == ["user", "agent", "user", "agent"]
    events = [line["event"] for line in got if line["type"] == "event"]
    assert events == await list_events(client, sid)
    # Session, then messages, then events: nothing else, nothing out of order.
    kinds = [line["type"] for line in got]
    assert kinds == ["session"] + ["message"] * 4 + ["event"] * len(events)
    assert [e["sequence"] for e in events] == sorted(e["sequence"] for e in events)


async def test_batches_join_without_a_gap_or_a_repeat(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "EXPORT_BATCH", 2)
    sid = await create_session(client)
    for text in ("one", "two", "three"):
        await post_message(client, sid, text)
        await wait_idle(client, sid)
    got = lines((await client.get(f"/v1/sessions/{sid}/export")).content)
    messages = [line["message"]["id"] for line in got if line["type"] == "message"]
    events = [line["event"]["id"] for line in got if line["type"] == "event"]
    assert len(messages) == len(set(messages)) == 6
    assert events == [e["id"] for e in await list_events(client, sid)]


async def test_an_export_ends_at_the_sequence_it_began_at(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What commits after the export began is not in it (the first batch is read after
    a turn has committed more)."""
    client = running.client
    sid = await create_session(client)
    await post_message(client, sid, "before")
    await wait_idle(client, sid)
    whole = lines((await client.get(f"/v1/sessions/{sid}/export")).content)
    reads: Reads = running.app.state.app.reads
    real = reads.rows_after
    posted = False

    async def late(*args: Any, **kwargs: Any) -> list[tuple[int, bytes]]:
        nonlocal posted
        if not posted:
            posted = True
            await post_message(client, sid, "after")
            await wait_idle(client, sid)
        rows: list[tuple[int, bytes]] = await real(*args, **kwargs)
        return rows

    monkeypatch.setattr(reads, "rows_after", late)
    bounded = lines((await client.get(f"/v1/sessions/{sid}/export")).content)
    assert posted
    assert [line["type"] for line in bounded] == [line["type"] for line in whole]
    assert [line["message"]["id"] for line in bounded if line["type"] == "message"] == [
        line["message"]["id"] for line in whole if line["type"] == "message"
    ]


async def test_bad_format_and_unknown_session(client: httpx.AsyncClient) -> None:
    sid = await create_session(client)
    bad = await client.get(f"/v1/sessions/{sid}/export", params={"format": "xml"})
    assert_problem(bad, 400, code="invalid_parameter")
    assert bad.json()["detail"] == "format: Input should be 'jsonl' or 'atif'"
    ghost = "session_" + "0" * 32
    missing = await client.get(f"/v1/sessions/{ghost}/export")
    assert_problem(missing, 404, code="session_not_found")


async def test_the_official_sdk_exports(sdk: Everruns) -> None:
    session = await sdk.sessions.create(title="sdk export")
    await sdk.messages.create(session.id, "export me")
    await wait_sdk_idle(sdk, session.id)
    text = await sdk.sessions.export(session.id)
    got = lines(text.encode())
    assert got[0]["session"]["id"] == session.id
    texts = [
        part.get("text")
        for line in got
        if line["type"] == "message"
        for part in line["message"]["content"]
    ]
    assert texts[0] == "export me"


# ---- import ------------------------------------------------------------------------------

JSONL_HEADERS = {"Content-Type": "application/jsonl"}


def comparable(message: dict[str, Any]) -> dict[str, Any]:
    """A message without what an import gives anew (ids, sequence, times, turn,
    revision) or adds (origin)."""
    drop = {
        "id",
        "session_id",
        "sequence",
        "created_at",
        "updated_at",
        "turn_id",
        "revision",
        "origin",
    }
    return {k: v for k, v in message.items() if k not in drop}


async def test_an_export_imports_back_to_the_same_messages(
    client: httpx.AsyncClient,
) -> None:
    sid = await create_session(client, title="round trip")
    for text in ("first", "/scenario tool tea", "/scenario reasoning"):
        await post_message(client, sid, text)
        await wait_idle(client, sid)
    exported = await client.get(f"/v1/sessions/{sid}/export")
    response = await client.post(
        "/v1/sessions/import", content=exported.content, headers=JSONL_HEADERS
    )
    assert response.status_code == 201, response.text
    imported = response.json()
    assert response.headers["location"] == imported["self_url"]
    assert imported["id"] != sid
    assert imported["title"] == "round trip"
    source = [
        line["message"] for line in lines(exported.content) if line["type"] == "message"
    ]
    again = (
        await client.get(f"/v1/sessions/{imported['id']}/messages?limit=200")
    ).json()["data"]
    assert [comparable(m) for m in again] == [comparable(m) for m in source]
    for copy, original in zip(again, source, strict=True):
        assert copy["origin"]["message_id"] == original["id"]
        assert copy["origin"]["session_id"] == sid
    # The imported session exports like any other.
    round_two = await client.get(f"/v1/sessions/{imported['id']}/export")
    assert round_two.status_code == 200


async def test_a_malformed_import_names_its_line_and_writes_nothing(
    client: httpx.AsyncClient,
) -> None:
    sid = await create_session(client, title="source")
    await post_message(client, sid, "hello")
    await wait_idle(client, sid)
    good = lines((await client.get(f"/v1/sessions/{sid}/export")).content)
    dump = [orjson.dumps(line) for line in good]
    broken_message = orjson.dumps({"type": "message", "message": {"role": "user"}})
    cases = [
        (b"", 422, "line 1"),
        (b"not json\n", 422, "line 1: not JSON"),
        (dump[1] + b"\n", 422, "line 1: expected the session"),
        (b"\n".join([dump[0], dump[1], broken_message]) + b"\n", 422, "line 3"),
        (b"\n".join([dump[0], b'{"type": "other"}']), 422, "line 2"),
    ]
    before = (await client.get("/v1/sessions")).json()["data"]
    for body, status, said in cases:
        response = await client.post(
            "/v1/sessions/import", content=body, headers=JSONL_HEADERS
        )
        problem = assert_problem(response, status)
        assert said in problem["detail"], problem
    wrong_type = await client.post(
        "/v1/sessions/import",
        content=b"\n".join(dump),
        headers={"Content-Type": "application/json"},
    )
    assert_problem(wrong_type, 415)
    assert (await client.get("/v1/sessions")).json()["data"] == before


async def test_the_import_path_is_not_a_session_id(client: httpx.AsyncClient) -> None:
    """`/sessions/import` beside `/sessions/{session_id}`: another method there is a
    405 allowing POST, not the 400 of a malformed session id."""
    for method in ("GET", "PATCH", "DELETE", "PUT"):
        response = await client.request(method, "/v1/sessions/import")
        assert_problem(response, 405)
        assert response.headers["allow"] == "POST"


async def test_an_atif_export_is_the_sessions_trajectory(
    client: httpx.AsyncClient,
) -> None:
    sid = (
        await client.post(
            "/v1/sessions", json={"title": "t", "system_prompt": "Be brief."}
        )
    ).json()["id"]
    for text in ("hello", "/scenario tool tea"):
        await post_message(client, sid, text)
        await wait_idle(client, sid)
    response = await client.get(f"/v1/sessions/{sid}/export", params={"format": "atif"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["content-disposition"] == (
        f'attachment; filename="{sid}.atif.json"'
    )
    trajectory = response.json()
    assert trajectory["schema_version"] == "ATIF-v1.4"
    assert trajectory["session_id"] == sid
    assert trajectory["agent"]["name"] == "evermirror"
    steps = trajectory["steps"]
    assert [s["step_id"] for s in steps] == list(range(1, len(steps) + 1))
    assert steps[0] == {"step_id": 1, "source": "system", "message": "Be brief."}
    assert [s["source"] for s in steps[1:3]] == ["user", "agent"]
    assert steps[1]["message"] == "hello"
    assert steps[2]["message"] == "hello"
    called = [s for s in steps if s.get("tool_calls")]
    assert len(called) == 1
    [call] = called[0]["tool_calls"]
    assert call["function_name"] == "lookup"
    assert call["arguments"] == {"query": "tea"}
    [result] = called[0]["observation"]["results"]
    assert result["source_call_id"] == call["tool_call_id"]
    assert json.loads(result["content"]) == {"query": "tea", "answer": 42}
    messages = (await client.get(f"/v1/sessions/{sid}/messages")).json()["data"]
    assert {s["extra"]["message_id"] for s in steps[1:]} == {m["id"] for m in messages}
    assert trajectory["final_metrics"]["total_steps"] == len(steps)
