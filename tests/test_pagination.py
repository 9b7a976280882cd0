"""The seed's message pagination (`GET /v1/sessions/{id}/messages`), on both lanes.

History is seeded through the checkpoint writer itself (`start_turn=False`, so no turn
runner kicks in): user, internal and agent messages, some agent messages committed over
two model Steps. Agent messages take two or three event sequences, so message sequences
have gaps, which is what `before_sequence` has to walk across."""

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from app.ids import format_id, parse_id, uuid7
from app.journal import checkpoint
from app.journal.sessions import lock_session
from tests.support.api import create_session, list_events, post_message
from tests.support.in_process import Running
from tests.support.waits import wait_idle

VISIBLE = 130
INTERNAL = 12


@dataclass(frozen=True)
class Seeded:
    id: str
    sequence: int
    role: str
    visibility: str
    revision: int
    parts: int


def history_plan() -> list[str]:
    """130 visible (65 user, 65 agent; every third agent message has two Steps) and
    12 internal user messages spread through the history."""
    plan: list[str] = []
    internal = 0
    for index in range(VISIBLE // 2):
        plan.append("user")
        if index % 5 == 2 and internal < INTERNAL:
            plan.append("internal")
            internal += 1
        plan.append("agent2" if index % 3 == 0 else "agent")
    while internal < INTERNAL:
        plan.insert(len(plan) - 1, "internal")
        internal += 1
    return plan


async def seed(running: Running, session_id: str, plan: Sequence[str]) -> list[Seeded]:
    """Write the plan in one unit of work through the checkpoint writer."""
    database = running.app.state.app.database
    sid = parse_id("session", session_id)
    seeded: list[Seeded] = []
    async with database.write() as db:
        session = await lock_session(db, sid)
        assert session is not None
        turn_id = uuid7()
        for index, kind in enumerate(plan):
            if kind in ("user", "internal"):
                written, turn = await checkpoint.append_user_message(
                    db,
                    session,
                    content=[{"type": "text", "text": f"user message {index}"}],
                    visibility="internal" if kind == "internal" else "visible",
                    extra={},
                    client_message_id=None,
                    start_turn=False,
                )
                assert turn is None
            else:
                opened = await checkpoint.open_agent_message(
                    db, session, turn_id=turn_id, model="seed", iteration=1
                )
                assert opened.message is not None
                steps = 2 if kind == "agent2" else 1
                for step in range(1, steps + 1):
                    written = await checkpoint.commit_step(
                        db,
                        session,
                        opened.message,
                        step_id=f"step_{step}",
                        parts=[{"type": "text", "text": f"agent {index} step {step}"}],
                        phase="final_answer",
                        phase_source="provider",
                        close=step == steps,
                    )
            message = written.message
            assert message is not None
            seeded.append(
                Seeded(
                    id=format_id("message", message.id),
                    sequence=message.sequence,
                    role=message.role,
                    visibility=message.visibility,
                    revision=message.revision,
                    parts=len(message.content),
                )
            )
    return seeded


async def last_event_sequence(client: httpx.AsyncClient, session_id: str) -> int:
    sequences = [event["sequence"] for event in await list_events(client, session_id)]
    assert sequences == list(range(1, len(sequences) + 1))
    return sequences[-1] if sequences else 0


async def page(
    client: httpx.AsyncClient, session_id: str, **params: Any
) -> dict[str, Any]:
    query = {
        k: (str(v).lower() if isinstance(v, bool) else v)
        for k, v in params.items()
        if v is not None
    }
    response = await client.get(f"/v1/sessions/{session_id}/messages", params=query)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = response.json()
    return body


async def walk(
    client: httpx.AsyncClient,
    session_id: str,
    expected: list[Seeded],
    *,
    limit: int | None,
    include_internal: bool,
    cursor: str,
) -> list[list[dict[str, Any]]]:
    """Walk newest to oldest, checking every envelope field on every page; returns the
    pages in the order they were read."""
    size = min(limit or 50, 200)
    pages: list[list[dict[str, Any]]] = []
    before: int | None = None
    remaining = list(expected)  # oldest first; pages are cut off its end
    while True:
        body = await page(
            client,
            session_id,
            limit=limit,
            before_sequence=before,
            include_internal=include_internal or None,
        )
        data = body["data"]
        want = remaining[-size:]
        remaining = remaining[: len(remaining) - len(want)]
        assert [m["id"] for m in data] == [m.id for m in want], (limit, before)
        assert [m["sequence"] for m in data] == sorted(m["sequence"] for m in data)
        assert body["total"] == len(expected)
        assert body["has_more"] is bool(remaining)
        assert body["cursor"] == cursor
        assert data, "a walk never reads an empty page"
        assert body["start_sequence"] == data[0]["sequence"]
        assert body["end_sequence"] == data[-1]["sequence"]
        if remaining:
            assert body["next_before_sequence"] == data[0]["sequence"]
        else:
            assert "next_before_sequence" not in body
        if not include_internal:
            assert all(m["visibility"] == "visible" for m in data)
        pages.append(data)
        if not body["has_more"]:
            break
        before = body["next_before_sequence"]
    assert not remaining
    return pages


async def test_walk_newest_to_oldest_visits_every_message_once(
    running: Running,
) -> None:
    client = running.client
    session_id = await create_session(client, "pagination")
    plan = history_plan()
    seeded = await seed(running, session_id, plan)
    visible = [m for m in seeded if m.visibility == "visible"]
    assert len(visible) == VISIBLE
    assert len(seeded) == VISIBLE + INTERNAL
    assert {m.role for m in visible} == {"user", "agent"}
    last = await last_event_sequence(client, session_id)
    assert last == max(m.sequence for m in seeded) + 1  # the closing step's event
    cursor = str(last)

    for include_internal, expected in ((False, visible), (True, seeded)):
        for limit in (None, 7, 1, 49, 200):
            pages = await walk(
                client,
                session_id,
                expected,
                limit=limit,
                include_internal=include_internal,
                cursor=cursor,
            )
            flat = [m for chunk in reversed(pages) for m in chunk]
            ids = [m["id"] for m in flat]
            assert len(ids) == len(set(ids)) == len(expected)
            assert ids == [m.id for m in expected]
            # Pages are disjoint and contiguous: each page is entirely older than the
            # page read before it.
            for newer, older in itertools.pairwise(pages):
                assert older[-1]["sequence"] < newer[0]["sequence"]
            if limit is None:
                assert [len(p) for p in pages[:-1]] == [50] * (len(pages) - 1)

    # No page splits a message: each listed message is its complete snapshot.
    everything = await page(client, session_id, limit=200, include_internal=True)
    by_id = {m.id: m for m in seeded}
    for message in everything["data"]:
        seed_row = by_id[message["id"]]
        assert message["sequence"] == seed_row.sequence
        assert message["state"] == "done"
        assert message["revision"] == seed_row.revision
        assert len(message["content"]) == seed_row.parts
        assert [p["sequence"] for p in message["content"]] == list(
            range(1, seed_row.parts + 1)
        )
        single = await client.get(f"/v1/sessions/{session_id}/messages/{message['id']}")
        assert single.status_code == 200
        assert single.json() == message


async def test_include_internal_changes_data_and_total(running: Running) -> None:
    client = running.client
    session_id = await create_session(client, "pagination")
    seeded = await seed(running, session_id, history_plan())
    internal_ids = {m.id for m in seeded if m.visibility == "internal"}
    assert len(internal_ids) == INTERNAL

    hidden = await page(client, session_id, limit=200)
    shown = await page(client, session_id, limit=200, include_internal=True)
    explicit_false = await page(client, session_id, limit=200, include_internal=False)
    assert hidden == explicit_false
    assert hidden["total"] == VISIBLE
    assert shown["total"] == VISIBLE + INTERNAL
    assert len(hidden["data"]) == VISIBLE
    assert len(shown["data"]) == VISIBLE + INTERNAL
    assert not internal_ids & {m["id"] for m in hidden["data"]}
    assert internal_ids <= {m["id"] for m in shown["data"]}
    assert {m["visibility"] for m in shown["data"]} == {"visible", "internal"}
    assert hidden["has_more"] is False
    assert shown["has_more"] is False
    assert hidden["cursor"] == shown["cursor"]

    # The newest page of the same size ends at the same message but reaches less far
    # back when it includes internal messages.
    newest_hidden = await page(client, session_id, limit=20)
    newest_shown = await page(client, session_id, limit=20, include_internal=True)
    assert newest_hidden["total"] == VISIBLE
    assert newest_shown["total"] == VISIBLE + INTERNAL
    assert newest_hidden["end_sequence"] == newest_shown["end_sequence"]
    assert any(m["visibility"] == "internal" for m in newest_shown["data"])
    assert newest_shown["start_sequence"] > newest_hidden["start_sequence"]
    assert newest_shown["next_before_sequence"] == newest_shown["start_sequence"]


async def test_internal_message_posted_over_the_api(running: Running) -> None:
    """`message.visibility: internal` is accepted on POST and hidden from plain lists."""
    client = running.client
    session_id = await create_session(client, "pagination")
    internal = await post_message(
        client, session_id, "audit note", visibility="internal"
    )
    assert internal["visibility"] == "internal"
    assert internal["delivery"] == "started"
    await wait_idle(client, session_id, within=30)

    hidden = await page(client, session_id)
    shown = await page(client, session_id, include_internal=True)
    assert internal["id"] not in {m["id"] for m in hidden["data"]}
    assert shown["data"][0]["id"] == internal["id"]
    assert shown["total"] == hidden["total"] + 1
    assert len(shown["data"]) == len(hidden["data"]) + 1
    assert all(m["role"] == "agent" for m in hidden["data"])
    assert hidden["cursor"] == str(await last_event_sequence(client, session_id))


async def test_default_limit_is_50_and_limit_is_capped_at_200(
    running: Running,
) -> None:
    client = running.client
    session_id = await create_session(client, "pagination")
    plan = ["user" if i % 2 else "agent" for i in range(205)]
    seeded = await seed(running, session_id, plan)
    cursor = str(await last_event_sequence(client, session_id))

    default = await page(client, session_id)
    assert len(default["data"]) == 50
    assert [m["id"] for m in default["data"]] == [m.id for m in seeded[-50:]]
    assert default["has_more"] is True
    assert default["next_before_sequence"] == seeded[-50].sequence

    for limit in (500, 201, 200, 3_000_000_000):
        capped = await page(client, session_id, limit=limit)
        assert len(capped["data"]) == 200, limit
        assert [m["id"] for m in capped["data"]] == [m.id for m in seeded[-200:]]
        assert capped["total"] == 205
        assert capped["has_more"] is True
        assert capped["start_sequence"] == seeded[-200].sequence
        assert capped["end_sequence"] == seeded[-1].sequence
        assert capped["next_before_sequence"] == seeded[-200].sequence
        assert capped["cursor"] == cursor

    rest = await page(
        client, session_id, limit=500, before_sequence=seeded[-200].sequence
    )
    assert [m["id"] for m in rest["data"]] == [m.id for m in seeded[:5]]
    assert rest["has_more"] is False
    assert "next_before_sequence" not in rest


async def test_empty_pages(running: Running) -> None:
    client = running.client
    session_id = await create_session(client, "pagination")
    empty = await page(client, session_id)
    assert empty == {"data": [], "total": 0, "has_more": False, "cursor": "0"}

    seeded = await seed(running, session_id, ["user", "agent", "internal", "user"])
    cursor = str(await last_event_sequence(client, session_id))
    before_first = await page(client, session_id, before_sequence=seeded[0].sequence)
    assert before_first == {
        "data": [],
        "total": 3,
        "has_more": False,
        "cursor": cursor,
    }
    # before_sequence between two messages: only the older ones.
    middle = await page(client, session_id, before_sequence=seeded[1].sequence + 1)
    assert [m["id"] for m in middle["data"]] == [seeded[0].id, seeded[1].id]
    assert middle["has_more"] is False
    assert middle["start_sequence"] == seeded[0].sequence
    assert middle["end_sequence"] == seeded[1].sequence
    # A cursor past the end reads the newest page.
    beyond = await page(client, session_id, before_sequence=10_000)
    assert beyond == await page(client, session_id)


async def test_bad_query_values_are_400_problems(running: Running) -> None:
    client = running.client
    session_id = await create_session(client, "pagination")
    await seed(running, session_id, ["user", "agent"])
    before = await page(client, session_id)
    for params in (
        {"limit": "0"},
        {"limit": "-5"},
        {"limit": "ten"},
        {"before_sequence": "0"},
        {"before_sequence": "x"},
        {"include_internal": "maybe"},
    ):
        response = await client.get(
            f"/v1/sessions/{session_id}/messages", params=params
        )
        assert response.status_code == 400, (params, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        assert problem["status"] == 400
        assert problem["title"] == "Bad Request"
        assert problem.get("detail")
        assert "Traceback" not in response.text
    zero = await client.get(f"/v1/sessions/{session_id}/messages?limit=0")
    assert "limit" in zero.json()["detail"]
    # Nothing changed.
    assert await page(client, session_id) == before

    missing = await client.get(f"/v1/sessions/{format_id('session', uuid7())}/messages")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    malformed = await client.get("/v1/sessions/sess_123/messages")
    assert malformed.status_code == 400
    assert malformed.json()["detail"] == (
        "Invalid session ID: invalid prefix: expected 'session', got 'sess'"
    )
