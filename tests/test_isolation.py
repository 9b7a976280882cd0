"""Tenant isolation: an API key sees only its organization's sessions. Every route answers
404 problem+json for another organization's session (exactly as for one that does not
exist), leaks none of its data, and changes none of its rows."""

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.auth import create_key
from app.db import models
from app.db.session import Database
from app.main import create_app
from app.settings import Settings
from tests.support.api import auth, text_body, uuid_of
from tests.support.database import Rows, table_rows
from tests.support.in_process import running_app
from tests.support.lanes import make_settings
from tests.support.problems import assert_problem
from tests.support.sse import parse
from tests.support.waits import wait_idle

ORG_A = uuid.UUID(hex="a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0")
ORG_B = uuid.UUID(hex="b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1")
PREFIXES = ("/v1", "/api/v1")
REQUEST_TIMEOUT = 20.0
ID_PATTERN = re.compile(r"\b[a-z]+_([0-9a-f]{32})\b")


@dataclass
class Tenants:
    """Organization B's data, made through the API with B's key, and A's key."""

    client: httpx.AsyncClient
    database: Database
    key_a: str
    key_b: str
    a_session: str
    b_sessions: list[str]
    b_messages: dict[str, list[str]]  # session id -> message ids, oldest first
    b_events: dict[str, list[str]]  # session id -> event ids, oldest first
    b_client_message_ids: dict[str, str]
    # Strings that are B's and must never reach A: texts, titles, tags, metadata values.
    b_secrets: list[str] = field(default_factory=list)

    @property
    def b_ids(self) -> set[str]:
        """Every wire id of B's, as its 32-hex suffix (ids travel with several prefixes:
        `session_`, `wsp_`, `org_`, `principal_`, `message_`, `event_`, `turn_`)."""
        ids = {ORG_B.hex}
        for sid in self.b_sessions:
            ids.add(sid.split("_", 1)[1])
        for values in (*self.b_messages.values(), *self.b_events.values()):
            ids.update(value.split("_", 1)[1] for value in values)
        return ids


async def make_b_session(
    client: httpx.AsyncClient, key: str, index: int
) -> tuple[str, list[str], list[str], str, list[str]]:
    marker = uuid.uuid4().hex[:12]
    title = f"b-title-{marker}"
    tag = f"b-tag-{marker}"
    meta = f"b-meta-{marker}"
    text = f"b-secret-text-{index}-{marker}"
    cmid = f"b-cmid-{marker}"
    created = await client.post(
        "/v1/sessions",
        json={"title": title, "tags": [tag], "metadata": {"note": meta}},
        headers=auth(key),
    )
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    posted = await client.post(
        f"/v1/sessions/{sid}/messages",
        json=text_body(text, client_message_id=cmid, metadata={"note": meta}),
        headers=auth(key),
    )
    assert posted.status_code == 201, posted.text
    await wait_idle(client, sid, headers=auth(key))
    messages = await client.get(
        f"/v1/sessions/{sid}/messages",
        params={"limit": 200, "include_internal": "true"},
        headers=auth(key),
    )
    assert messages.status_code == 200, messages.text
    message_ids = [m["id"] for m in messages.json()["data"]]
    assert len(message_ids) >= 2, messages.text  # the user's message and the reply
    events = await client.get(
        f"/v1/sessions/{sid}/events", params={"limit": 1000}, headers=auth(key)
    )
    assert events.status_code == 200, events.text
    event_ids = [e["id"] for e in events.json()["data"]]
    assert event_ids, events.text
    return sid, message_ids, event_ids, cmid, [title, tag, meta, text, cmid]


@pytest.fixture
async def tenants(settings: Settings) -> AsyncIterator[Tenants]:
    """Keys for organizations A and B (no auth cache, so every request resolves its key),
    two idle sessions of B's with a finished turn each, and one session of A's."""
    # Streams that open by mistake end on their own within about a second.
    isolated = make_settings(
        settings.database_url, auth_cache_seconds=0.0, sse_cycle_seconds=1.0
    )
    async with running_app(isolated) as running:
        client = running.client
        database: Database = running.app.state.app.database
        async with database.write() as db:
            _, key_a = await create_key(db, organization_id=ORG_A, name="a")
            _, key_b = await create_key(db, organization_id=ORG_B, name="b")
        b_sessions: list[str] = []
        b_messages: dict[str, list[str]] = {}
        b_events: dict[str, list[str]] = {}
        b_cmids: dict[str, str] = {}
        secrets: list[str] = []
        for index in range(2):
            sid, mids, eids, cmid, strings = await make_b_session(client, key_b, index)
            b_sessions.append(sid)
            b_messages[sid] = mids
            b_events[sid] = eids
            b_cmids[sid] = cmid
            secrets.extend(strings)
        created = await client.post(
            "/v1/sessions", json={"title": "a-own"}, headers=auth(key_a)
        )
        assert created.status_code == 201, created.text
        yield Tenants(
            client=client,
            database=database,
            key_a=key_a,
            key_b=key_b,
            a_session=created.json()["id"],
            b_sessions=b_sessions,
            b_messages=b_messages,
            b_events=b_events,
            b_client_message_ids=b_cmids,
            b_secrets=secrets,
        )


async def b_snapshot(database: Database) -> Rows:
    """Organization B's rows only: its sessions and their messages and events."""
    rows = await table_rows(database)
    b_ids = {row[0] for row in rows["sessions"] if row[1] == ORG_B}
    session_columns = [c.name for c in models.Session.__table__.columns]
    assert session_columns[:2] == ["id", "organization_id"]
    message_sid = [c.name for c in models.Message.__table__.columns].index("session_id")
    event_sid = [c.name for c in models.Event.__table__.columns].index("session_id")
    return {
        "sessions": [row for row in rows["sessions"] if row[0] in b_ids],
        "messages": [row for row in rows["messages"] if row[message_sid] in b_ids],
        "events": [row for row in rows["events"] if row[event_sid] in b_ids],
    }


async def call(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    json: Any = None,
    params: Any = None,
) -> httpx.Response:
    """One request with a deadline: a stream that opened by mistake (200) would otherwise
    keep the in-process transport reading until the stream cycles."""
    return await asyncio.wait_for(
        client.request(method, url, headers=headers, json=json, params=params),
        REQUEST_TIMEOUT,
    )


def exposed_text(response: httpx.Response) -> str:
    """What a caller can read: the body and every header value."""
    return response.text + "\n" + "\n".join(response.headers.values())


def assert_not_found(response: httpx.Response, code: str) -> dict[str, Any]:
    """A 404 problem with `code`, and none of the headers a found resource carries."""
    body = assert_problem(response, 404, code=code)
    context = f"{response.request.method} {response.request.url}: {response.headers}"
    assert "location" not in response.headers, context
    assert "x-total-count" not in response.headers, context
    assert "etag" not in response.headers, context
    return body


def assert_no_leak(response: httpx.Response, tenants: Tenants, sent: str = "") -> None:
    """None of B's ids appear except those the caller put in the request path itself
    (or `sent`, an id it sent elsewhere), and none of B's texts, titles, tags or
    metadata."""
    context = f"{response.request.method} {response.request.url} -> {response.text}"
    path = response.request.url.path + " " + sent
    allowed = {hex_ for hex_ in tenants.b_ids if hex_ in path}
    exposed = exposed_text(response)
    for hex_ in tenants.b_ids - allowed:
        assert hex_ not in exposed, f"B's id {hex_} leaked: {context}"
    for secret in tenants.b_secrets:
        assert secret not in exposed, f"B's data {secret!r} leaked: {context}"


def normalized(response: httpx.Response, *ids: str) -> tuple[int, str, Any]:
    """Status, media type and body with the given ids replaced by a placeholder, to
    compare the answer for B's id with the answer for an id that does not exist."""
    text = response.text
    for value in ids:
        text = text.replace(value, "<id>")
    media = response.headers.get("content-type", "").split(";")[0]
    return response.status_code, media, text


def random_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def mutate(wire_id: str, position: int) -> str:
    """The id with one hex digit of its suffix changed."""
    prefix, _, suffix = wire_id.partition("_")
    digit = suffix[position]
    replacement = "0" if digit != "0" else "1"
    return f"{prefix}_{suffix[:position]}{replacement}{suffix[position + 1 :]}"


# ---- every session route, with A's key, against B's sessions -------------------------

# (name, method, path template, json body, query params, extra headers)
Route = tuple[str, str, str, Any, dict[str, Any] | None, dict[str, str]]


def routes(tenants: Tenants, sid: str) -> list[Route]:
    """The walk against one of B's sessions, with B's real message and event ids."""
    return route_walk(
        sid,
        mid=tenants.b_messages[sid][0],
        last_mid=tenants.b_messages[sid][-1],
        eid=tenants.b_events[sid][0],
        cmid=tenants.b_client_message_ids[sid],
    )


# An interaction id of the right shape: foreign or not, it must not be found.
INTERACTION = "interaction_" + "0" * 32


def route_walk(
    sid: str, *, mid: str, last_mid: str, eid: str, cmid: str, iid: str = INTERACTION
) -> list[Route]:
    base = f"/sessions/{sid}"
    return [
        ("get_session", "GET", base, None, None, {}),
        ("export_session", "GET", f"{base}/export", None, None, {}),
        ("pin_session", "PUT", f"{base}/pin", None, None, {}),
        ("unpin_session", "DELETE", f"{base}/pin", None, None, {}),
        ("archive_session", "PUT", f"{base}/archive", None, None, {}),
        ("unarchive_session", "DELETE", f"{base}/archive", None, None, {}),
        (
            "put_feedback",
            "PUT",
            f"{base}/messages/{mid}/feedback",
            {"rating": "bad", "comment": "from a"},
            None,
            {},
        ),
        ("list_feedback", "GET", f"{base}/feedback", None, None, {}),
        (
            "update_session",
            "PATCH",
            base,
            {"title": "hijacked", "tags": ["x"]},
            None,
            {},
        ),
        ("delete_session", "DELETE", base, None, None, {}),
        ("cancel_turn", "POST", f"{base}/cancel", None, None, {}),
        (
            "list_messages",
            "GET",
            f"{base}/messages",
            None,
            {"limit": 200, "include_internal": "true"},
            {},
        ),
        (
            "list_messages_older",
            "GET",
            f"{base}/messages",
            None,
            {"before_sequence": 1000},
            {},
        ),
        ("create_message", "POST", f"{base}/messages", text_body("from a"), None, {}),
        (
            # B's client_message_id: a duplicate check before the ownership check would
            # hand back B's stored message.
            "create_message_duplicate_cmid",
            "POST",
            f"{base}/messages",
            text_body("from a", client_message_id=cmid),
            None,
            {},
        ),
        ("get_message", "GET", f"{base}/messages/{mid}", None, None, {}),
        ("get_message_reply", "GET", f"{base}/messages/{last_mid}", None, None, {}),
        ("list_events_since_id", "GET", f"{base}/events", None, {"since_id": eid}, {}),
        (
            "list_events_all",
            "GET",
            f"{base}/events",
            None,
            {"after_sequence": 0, "limit": 1000},
            {},
        ),
        ("stream_sse", "GET", f"{base}/sse", None, None, {}),
        ("stream_sse_replay", "GET", f"{base}/sse", None, {"after_sequence": 0}, {}),
        ("stream_sse_since_id", "GET", f"{base}/sse", None, {"since_id": eid}, {}),
        (
            "stream_sse_last_event_id",
            "GET",
            f"{base}/sse",
            None,
            None,
            {"Last-Event-ID": eid},
        ),
        ("stream_messages", "GET", f"{base}/messages/stream", None, None, {}),
        (
            "stream_messages_replay",
            "GET",
            f"{base}/messages/stream",
            None,
            {"after": "0", "include_internal": "true"},
            {},
        ),
        (
            "stream_messages_last_event_id",
            "GET",
            f"{base}/messages/stream",
            None,
            None,
            {"Last-Event-ID": "0"},
        ),
        (
            "submit_tool_results",
            "POST",
            f"{base}/tool-results",
            {"tool_results": [{"tool_call_id": "call_1", "result": "from a"}]},
            None,
            {},
        ),
        ("list_interactions", "GET", f"{base}/interactions", None, None, {}),
        (
            "resolve_interaction",
            "POST",
            f"{base}/interactions/{iid}",
            {"decision": "approve"},
            None,
            {},
        ),
        (
            "submit_tool_approvals",
            "POST",
            f"{base}/tool-approvals",
            {"decisions": [{"interaction_id": iid, "decision": "approve"}]},
            None,
            {},
        ),
        ("fork_session", "POST", f"{base}/fork", {}, None, {}),
        (
            "regenerate_message",
            "POST",
            f"{base}/messages/{last_mid}/regenerate",
            None,
            None,
            {},
        ),
        (
            "edit_message",
            "POST",
            f"{base}/messages/{mid}/edit",
            {"message": {"content": [{"type": "text", "text": "edited"}]}},
            None,
            {},
        ),
        (
            "run_session_agent",
            "POST",
            f"{base}/ag-ui",
            {
                "threadId": "t",
                "runId": "r",
                "messages": [{"id": "ag-ui-m", "role": "user", "content": "hi"}],
            },
            None,
            {},
        ),
        (
            "session_agent_capabilities",
            "GET",
            f"{base}/ag-ui/capabilities",
            None,
            None,
            {},
        ),
    ]


ROUTE_NAMES = [
    "get_session",
    "export_session",
    "pin_session",
    "unpin_session",
    "archive_session",
    "unarchive_session",
    "put_feedback",
    "list_feedback",
    "update_session",
    "delete_session",
    "cancel_turn",
    "list_messages",
    "list_messages_older",
    "create_message",
    "create_message_duplicate_cmid",
    "get_message",
    "get_message_reply",
    "list_events_since_id",
    "list_events_all",
    "stream_sse",
    "stream_sse_replay",
    "stream_sse_since_id",
    "stream_sse_last_event_id",
    "stream_messages",
    "stream_messages_replay",
    "stream_messages_last_event_id",
    "submit_tool_results",
    "list_interactions",
    "resolve_interaction",
    "submit_tool_approvals",
    "fork_session",
    "regenerate_message",
    "edit_message",
    "run_session_agent",
    "session_agent_capabilities",
]


def test_the_walk_covers_every_session_route() -> None:
    """Every route under /v1/sessions/{session_id} the app documents is in the walk, so
    a route added later cannot skip the isolation tests."""
    app = create_app(make_settings("sqlite+aiosqlite:///:memory:"))
    served = {
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        if path.startswith("/v1/sessions/{session_id}")
        for method in operations
    }
    walk = route_walk(
        "{session_id}",
        mid="{message_id}",
        last_mid="{message_id}",
        eid="event_" + "0" * 32,
        cmid="c",
        iid="{interaction_id}",
    )
    walked = {(method, "/v1" + path) for _, method, path, *_ in walk}
    assert served == walked
    assert [name for name, *_ in walk] == ROUTE_NAMES


def a_credentials(tenants: Tenants) -> list[dict[str, str]]:
    """A's key as the SDKs send it: Bearer, bare, and with B's organization claimed in
    X-Org-Id (which must not widen what the key sees)."""
    return [
        auth(tenants.key_a),
        {"Authorization": tenants.key_a},
        {**auth(tenants.key_a), "X-Org-Id": f"org_{ORG_B.hex}"},
    ]


@pytest.mark.parametrize("route_name", ROUTE_NAMES)
async def test_other_organizations_session_is_404_on_every_route(
    tenants: Tenants, route_name: str
) -> None:
    client = tenants.client
    for sid in tenants.b_sessions:
        matching = [r for r in routes(tenants, sid) if r[0] == route_name]
        assert len(matching) == 1
        _, method, path, body, params, extra = matching[0]
        for prefix in PREFIXES:
            for headers in a_credentials(tenants):
                before = await table_rows(tenants.database)
                response = await call(
                    client,
                    method,
                    prefix + path,
                    headers={**headers, **extra},
                    json=body,
                    params=params,
                )
                after = await table_rows(tenants.database)
                problem = assert_not_found(response, "session_not_found")
                assert_no_leak(response, tenants)
                assert problem.get("instance") == prefix + path
                assert after == before, (
                    f"{method} {prefix}{path} with A's key changed the database"
                )
    # B still sees all of its data.
    for sid in tenants.b_sessions:
        response = await client.get(f"/v1/sessions/{sid}", headers=auth(tenants.key_b))
        assert response.status_code == 200, response.text


@pytest.mark.parametrize("route_name", ROUTE_NAMES)
async def test_other_organizations_session_answers_like_a_missing_one(
    tenants: Tenants, route_name: str
) -> None:
    """No existence oracle: B's real id and an id that exists nowhere get the same answer,
    byte for byte once the id itself is masked."""
    client = tenants.client
    sid = tenants.b_sessions[0]
    ghost = random_id("session")
    _, method, path, body, params, extra = next(
        r for r in routes(tenants, sid) if r[0] == route_name
    )
    ghost_path = path.replace(sid, ghost)
    headers = {**auth(tenants.key_a), **extra}
    to_b = await call(
        client, method, "/v1" + path, headers=headers, json=body, params=params
    )
    to_ghost = await call(
        client, method, "/v1" + ghost_path, headers=headers, json=body, params=params
    )
    assert normalized(to_b, sid) == normalized(to_ghost, ghost)


async def test_other_organizations_data_is_unchanged_after_write_attempts(
    tenants: Tenants,
) -> None:
    """A's DELETE, PATCH, POST messages and cancel against B's sessions: B's rows are
    identical before and after, and B's API still returns the same sessions and messages."""
    client = tenants.client
    before = await b_snapshot(tenants.database)
    assert len(before["sessions"]) == 2
    assert before["messages"]
    assert before["events"]
    b_views_before = []
    for sid in tenants.b_sessions:
        session = await client.get(f"/v1/sessions/{sid}", headers=auth(tenants.key_b))
        page = await client.get(
            f"/v1/sessions/{sid}/messages",
            params={"limit": 200, "include_internal": "true"},
            headers=auth(tenants.key_b),
        )
        b_views_before.append((session.json(), page.json()))
    for sid in tenants.b_sessions:
        for prefix in PREFIXES:
            attempts: list[tuple[str, str, Any]] = [
                (
                    "PATCH",
                    f"{prefix}/sessions/{sid}",
                    {"title": "x", "tags": ["y"], "goal": "z"},
                ),
                ("POST", f"{prefix}/sessions/{sid}/messages", text_body("steer")),
                ("POST", f"{prefix}/sessions/{sid}/cancel", None),
                ("DELETE", f"{prefix}/sessions/{sid}", None),
            ]
            for method, url, body in attempts:
                response = await call(
                    client, method, url, headers=auth(tenants.key_a), json=body
                )
                assert_not_found(response, "session_not_found")
                assert_no_leak(response, tenants)
    after = await b_snapshot(tenants.database)
    assert after == before
    for sid, (session_before, page_before) in zip(
        tenants.b_sessions, b_views_before, strict=True
    ):
        session = await client.get(f"/v1/sessions/{sid}", headers=auth(tenants.key_b))
        page = await client.get(
            f"/v1/sessions/{sid}/messages",
            params={"limit": 200, "include_internal": "true"},
            headers=auth(tenants.key_b),
        )
        assert session.status_code == 200, session.text
        assert (session.json(), page.json()) == (session_before, page_before)


async def test_cancel_and_steer_from_another_organization_do_not_touch_a_running_turn(
    tenants: Tenants,
) -> None:
    client = tenants.client
    sid = tenants.b_sessions[0]
    posted = await client.post(
        f"/v1/sessions/{sid}/messages",
        json=text_body("/scenario long 100000"),
        headers=auth(tenants.key_b),
    )
    assert posted.status_code == 201, posted.text
    assert posted.json()["delivery"] == "started"
    session_uuid = uuid_of(sid)

    async def turn_state() -> tuple[Any, Any, int]:
        async with tenants.database.read() as db:
            row = (
                await db.execute(
                    select(
                        models.Session.active_turn_id,
                        models.Session.cancel_requested_at,
                    ).where(models.Session.id == session_uuid)
                )
            ).one()
            users = await db.scalars(
                select(models.Message.id).where(
                    models.Message.session_id == session_uuid,
                    models.Message.role == "user",
                )
            )
            return row[0], row[1], len(users.all())

    try:
        active_turn, cancel_requested, user_messages = await turn_state()
        assert active_turn is not None
        assert cancel_requested is None
        for prefix in PREFIXES:
            cancel = await call(
                client,
                "POST",
                f"{prefix}/sessions/{sid}/cancel",
                headers=auth(tenants.key_a),
            )
            assert_not_found(cancel, "session_not_found")
            steer = await call(
                client,
                "POST",
                f"{prefix}/sessions/{sid}/messages",
                headers=auth(tenants.key_a),
                json=text_body("steer from a"),
            )
            assert_not_found(steer, "session_not_found")
            assert_no_leak(steer, tenants)
        assert await turn_state() == (active_turn, None, user_messages)
        session = await client.get(f"/v1/sessions/{sid}", headers=auth(tenants.key_b))
        assert session.json()["status"] == "active"
    finally:
        cancelled = await client.post(
            f"/v1/sessions/{sid}/cancel", headers=auth(tenants.key_b)
        )
        assert cancelled.status_code == 200, cancelled.text
        await wait_idle(client, sid, headers=auth(tenants.key_b))
    assert cancelled.json()["status"] == "cancelled"


# ---- listing --------------------------------------------------------------------------


async def test_list_sessions_never_lists_another_organizations_sessions(
    tenants: Tenants,
) -> None:
    client = tenants.client
    b_title = tenants.b_secrets[0]
    queries: list[dict[str, Any]] = [
        {},
        {"limit": 100},
        {"offset": 0, "limit": 1},
        {"search": b_title},
        {"search": "b-title"},
        {"status": "idle,started,active,running,waitingfortoolresults"},
        {"order": "last_activity"},
        {"created_after": "2000-01-01T00:00:00Z"},
        {"created_before": "2999-01-01T00:00:00Z"},
    ]
    for prefix in PREFIXES:
        for params in queries:
            for headers in a_credentials(tenants):
                response = await call(
                    client, "GET", f"{prefix}/sessions", headers=headers, params=params
                )
                assert response.status_code == 200, response.text
                body = response.json()
                # A's one session is titled "a-own": B's words find nothing.
                expected = [] if "search" in params else [tenants.a_session]
                assert [s["id"] for s in body["data"]] == expected, (params, body)
                assert body["total"] == len(expected), (params, body)
                assert "next_url" not in body
                for session in body["data"]:
                    assert session["organization_id"] == f"org_{ORG_A.hex}"
                assert_no_leak(response, tenants)
    # The unfiltered list is exactly A's one session; B's is exactly B's two.
    mine = await client.get("/v1/sessions", headers=auth(tenants.key_a))
    assert [s["id"] for s in mine.json()["data"]] == [tenants.a_session]
    assert mine.json()["total"] == 1
    theirs = await client.get("/v1/sessions", headers=auth(tenants.key_b))
    assert sorted(s["id"] for s in theirs.json()["data"]) == sorted(tenants.b_sessions)
    assert theirs.json()["total"] == 2
    assert tenants.a_session not in theirs.text


async def test_paging_urls_never_point_at_another_organizations_sessions(
    tenants: Tenants,
) -> None:
    """With more of B's sessions than a page holds, A's page still has no next_url and a
    total of its own sessions only (a count across organizations would leak B's volume)."""
    client = tenants.client
    for _ in range(3):
        created = await client.post(
            "/v1/sessions", json={}, headers=auth(tenants.key_b)
        )
        assert created.status_code == 201, created.text
    response = await client.get(
        "/v1/sessions", params={"limit": 1}, headers=auth(tenants.key_a)
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["total"] == 1
    assert "next_url" not in body
    assert [s["id"] for s in body["data"]] == [tenants.a_session]


# ---- guessed ids -----------------------------------------------------------------------


def guessed_session_ids(tenants: Tenants) -> list[str]:
    real = tenants.b_sessions[0]
    return [
        random_id("session"),
        "session_" + uuid.UUID(int=uuid.uuid4().int).hex,
        mutate(real, 31),
        mutate(real, 0),
        mutate(real, 12),
        mutate(real, 20),
    ]


async def test_guessed_session_ids_are_404_for_every_key(tenants: Tenants) -> None:
    client = tenants.client
    guesses = guessed_session_ids(tenants)
    assert not set(guesses) & set(tenants.b_sessions)
    before = await table_rows(tenants.database)
    for sid in guesses:
        for key in (tenants.key_a, tenants.key_b):
            for method, suffix, body in [
                ("GET", "", None),
                ("PATCH", "", {"title": "guess"}),
                ("DELETE", "", None),
                ("POST", "/cancel", None),
                ("GET", "/messages", None),
                ("POST", "/messages", text_body("guess")),
                (
                    "GET",
                    f"/messages/{tenants.b_messages[tenants.b_sessions[0]][0]}",
                    None,
                ),
                ("GET", "/events", None),
                ("GET", "/sse", None),
                ("GET", "/messages/stream", None),
            ]:
                response = await call(
                    client,
                    method,
                    f"/v1/sessions/{sid}{suffix}",
                    headers=auth(key),
                    json=body,
                )
                assert_not_found(response, "session_not_found")
                if key == tenants.key_a:
                    assert_no_leak(response, tenants)
    assert await table_rows(tenants.database) == before


async def test_guessed_message_ids_in_own_session_are_404(tenants: Tenants) -> None:
    """A's own session with B's real message id, or a near miss of it, is a missing
    message, answered exactly as an id that exists nowhere."""
    client = tenants.client
    a_sid = tenants.a_session
    b_mid = tenants.b_messages[tenants.b_sessions[0]][0]
    ghost = random_id("message")
    ghost_answer = await client.get(
        f"/v1/sessions/{a_sid}/messages/{ghost}", headers=auth(tenants.key_a)
    )
    assert_not_found(ghost_answer, "message_not_found")
    for mid in (b_mid, mutate(b_mid, 31), mutate(b_mid, 0)):
        for prefix in PREFIXES:
            response = await client.get(
                f"{prefix}/sessions/{a_sid}/messages/{mid}", headers=auth(tenants.key_a)
            )
            assert_not_found(response, "message_not_found")
            assert_no_leak(response, tenants)
            if prefix == "/v1":
                assert normalized(response, mid) == normalized(ghost_answer, ghost)
    # B's own session with a near miss of its message id is a missing message, too.
    b_sid = tenants.b_sessions[0]
    response = await client.get(
        f"/v1/sessions/{b_sid}/messages/{mutate(b_mid, 31)}",
        headers=auth(tenants.key_b),
    )
    assert_not_found(response, "message_not_found")
    # And B's message id under B's other session is not found either.
    other = tenants.b_sessions[1]
    response = await client.get(
        f"/v1/sessions/{other}/messages/{b_mid}", headers=auth(tenants.key_b)
    )
    assert_not_found(response, "message_not_found")


def stream_events(response: httpx.Response) -> list[str]:
    """The `event:` names of a finished event stream (comments are timing, not data)."""
    return [f.event for f in parse(response.text) if f.event is not None]


async def test_other_organizations_event_id_as_cursor_reveals_nothing(
    tenants: Tenants,
) -> None:
    """B's real event id as `since_id` (or Last-Event-ID) on A's own session gets exactly
    the answer an event id of the same shape that exists nowhere gets (B's id with its
    last hex digit changed: same version, same timestamp). Whatever the cursor resolves
    to, it never confirms B's event nor brings any of B's data along."""
    client = tenants.client
    a_sid = tenants.a_session
    b_eid = tenants.b_events[tenants.b_sessions[0]][-1]
    ghost = mutate(b_eid, 31)
    cases: list[tuple[str, dict[str, Any], dict[str, str]]] = [
        ("/events", {"since_id": "{eid}"}, {}),
        ("/sse", {"since_id": "{eid}"}, {}),
        ("/sse", {}, {"Last-Event-ID": "{eid}"}),
    ]
    for suffix, params, extra in cases:
        answers = []
        for eid in (b_eid, ghost):
            response = await call(
                client,
                "GET",
                f"/v1/sessions/{a_sid}{suffix}",
                headers={
                    **auth(tenants.key_a),
                    **{k: v.format(eid=eid) for k, v in extra.items()},
                },
                params={k: v.format(eid=eid) for k, v in params.items()},
            )
            # The id A sent may be echoed back to it (a 400 names it); nothing else of B's.
            assert_no_leak(response, tenants, sent=eid)
            status, media, body = normalized(response, eid)
            if status == 200 and media == "text/event-stream":
                answers.append((status, media, stream_events(response)))
            else:
                answers.append((status, media, body))
        assert answers[0] == answers[1], (suffix, answers)
        assert answers[0][0] in (200, 400), (suffix, answers)


async def test_keys_resolve_to_their_own_organization(tenants: Tenants) -> None:
    """Sessions a key creates belong to its organization, whatever X-Org-Id claims."""
    client = tenants.client
    created = await client.post(
        "/v1/sessions",
        json={"title": "claims b"},
        headers={**auth(tenants.key_a), "X-Org-Id": f"org_{ORG_B.hex}"},
    )
    assert created.status_code == 201, created.text
    assert created.json()["organization_id"] == f"org_{ORG_A.hex}"
    sid = created.json()["id"]
    response = await client.get(f"/v1/sessions/{sid}", headers=auth(tenants.key_b))
    assert_not_found(response, "session_not_found")
    mine = await client.get(f"/v1/sessions/{sid}", headers=auth(tenants.key_a))
    assert mine.status_code == 200, mine.text
    assert not set(ID_PATTERN.findall(mine.text)) & tenants.b_ids


async def test_chat_routes_never_reach_another_organizations_session(
    tenants: Tenants,
) -> None:
    """The AI SDK's chat routes and AG-UI's thread route: B's session id is a 404 for
    A (posting, answering, resuming, running) and changes nothing; a chat id B uses
    names another session for A."""
    client = tenants.client
    sid = tenants.b_sessions[0]
    b_message = tenants.b_messages[sid][-1]
    user = {"id": "ui-a", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    answer: dict[str, Any] = {
        "id": b_message,
        "role": "assistant",
        "parts": [
            {
                "type": "tool-lookup",
                "toolCallId": "call_x",
                "state": "approval-responded",
                "approval": {"id": INTERACTION, "approved": True},
            }
        ],
    }
    for headers in a_credentials(tenants):
        before = await b_snapshot(tenants.database)
        for message in (user, answer):
            response = await call(
                client,
                "POST",
                "/v1/chat",
                headers=headers,
                json={"id": sid, "messages": [message]},
            )
            assert_not_found(response, "session_not_found")
            assert_no_leak(response, tenants, sent=sid + b_message)
        agent = await call(
            client,
            "POST",
            "/v1/ag-ui",
            headers=headers,
            json={"threadId": sid, "runId": "r", "messages": []},
        )
        assert_not_found(agent, "session_not_found")
        assert_no_leak(agent, tenants, sent=sid)
        resumed = await call(client, "GET", f"/v1/chat/{sid}/stream", headers=headers)
        assert_not_found(resumed, "session_not_found")
        assert_no_leak(resumed, tenants)
        assert await b_snapshot(tenants.database) == before
    # One chat id, two organizations: two sessions, each with its own messages.
    said = {}
    for key, text in ((tenants.key_b, "b-chat-secret"), (tenants.key_a, "a-chat")):
        message = {
            "id": "ui-1",
            "role": "user",
            "parts": [{"type": "text", "text": text}],
        }
        response = await call(
            client,
            "POST",
            "/v1/chat",
            headers=auth(key),
            json={"id": "shared-chat", "messages": [message]},
        )
        assert response.status_code == 200, response.text
        said[key] = response.text
    assert "b-chat-secret" not in said[tenants.key_a]
    assert "a-chat" in said[tenants.key_a]
    listed = await client.get("/v1/sessions", headers=auth(tenants.key_a))
    assert len(listed.json()["data"]) == 2  # A's own session, and its chat's
