"""Error paths: every failure is an RFC 9457 problem+json body with upstream's texts, and a
rejected request leaves the database exactly as it was."""

import logging
import sqlite3
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import aiosqlite
import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

import app.db.reads
import app.events.service
import app.journal.checkpoint
import app.sessions.service
from app.db import models
from tests.support.api import (
    create_session,
    list_events,
    post_message,
    text_body,
    uuid_of,
)
from tests.support.database import table_rows
from tests.support.in_process import Running
from tests.support.problems import ERROR_TYPE_BASE, assert_problem
from tests.support.waits import wait_idle, wait_until

HEX32 = "0123456789abcdef0123456789abcdef"
UNKNOWN_SESSION = "session_" + uuid.UUID(int=0xDEAD).hex
TEXT_BODY = text_body("hi")

# Every route scoped to a session: (method, path after the session id, JSON body).
SESSION_ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "", None),
    ("PATCH", "", {"title": "renamed"}),
    ("DELETE", "", None),
    ("POST", "/cancel", None),
    ("GET", "/messages", None),
    ("POST", "/messages", TEXT_BODY),
    ("GET", "/messages/{mid}", None),
    ("GET", "/events", None),
    ("GET", "/sse", None),
    ("GET", "/messages/stream", None),
]
ROUTE_IDS = [f"{m} {p or '/'}" for m, p, _ in SESSION_ROUTES]


# Prefixes people actually send by mistake (upstream's stale docs say `sess_`).
WRONG_PREFIX = {"session": "sess", "message": "msg", "event": "evt"}


def malformed_ids(prefix: str) -> list[tuple[str, str]]:
    """Malformed `{prefix}_{32 hex}` ids with upstream's TypedId::parse texts."""
    upper = HEX32.upper()
    wrong = WRONG_PREFIX[prefix]
    other = "turn"
    return [
        (f"{wrong}_{HEX32}", f"invalid prefix: expected '{prefix}', got '{wrong}'"),
        (f"{other}_{HEX32}", f"invalid prefix: expected '{prefix}', got '{other}'"),
        (f"{prefix}_{HEX32[:31]}", "invalid length: expected 32, got 31"),
        (f"{prefix}_{HEX32}0", "invalid length: expected 32, got 33"),
        (f"{prefix}_", "invalid length: expected 32, got 0"),
        (f"{prefix}_{upper}", f"invalid hex in ID: {upper}"),
        (f"{prefix}_{HEX32[:31]}A", f"invalid hex in ID: {HEX32[:31]}A"),
        (f"{prefix}_{HEX32[:31]}g", f"invalid hex in ID: {HEX32[:31]}g"),
    ]


# ---- helpers -------------------------------------------------------------------------


@dataclass
class World:
    """Two idle sessions, each with one finished turn."""

    running: Running
    client: httpx.AsyncClient
    sid: str
    mid: str
    eid: str
    other_sid: str
    other_mid: str
    other_eid: str

    def fill(self, template: str) -> str:
        return template.format(sid=self.sid, mid=self.mid, eid=self.eid)


async def session_with_turn(
    client: httpx.AsyncClient, text: str
) -> tuple[str, str, str]:
    sid = await create_session(client, text)
    posted = await post_message(client, sid, text)
    await wait_idle(client, sid)
    events = await list_events(client, sid)
    return sid, posted["id"], events[0]["id"]


@pytest.fixture
async def world(running: Running) -> World:
    client = running.client
    sid, mid, eid = await session_with_turn(client, "first")
    other_sid, other_mid, other_eid = await session_with_turn(client, "second")
    return World(running, client, sid, mid, eid, other_sid, other_mid, other_eid)


async def request(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    json: Any = None,
    content: bytes | None = None,
    params: Any = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    if content is not None:
        headers = {"content-type": "application/json", **(headers or {})}
        return await client.request(
            method, url, content=content, params=params, headers=headers
        )
    return await client.request(method, url, json=json, params=params, headers=headers)


async def assert_unchanged(
    world: World, call: Awaitable[httpx.Response]
) -> httpx.Response:
    """Await `call` (a request not yet sent); assert that it changed no row."""
    database = world.running.app.state.app.database
    before = await table_rows(database)
    response = await call
    after = await table_rows(database)
    assert after == before, (
        f"{response.request.method} {response.request.url} -> {response.status_code} "
        "changed the database"
    )
    return response


# ---- malformed ids -------------------------------------------------------------------


@pytest.mark.parametrize(("method", "suffix", "body"), SESSION_ROUTES, ids=ROUTE_IDS)
async def test_malformed_session_id_is_400_with_upstream_text(
    world: World, method: str, suffix: str, body: dict[str, Any] | None
) -> None:
    for prefix in ("/v1", "/api/v1"):
        for bad, reason in malformed_ids("session"):
            url = f"{prefix}/sessions/{bad}" + world.fill(suffix)
            response = await assert_unchanged(
                world, request(world.client, method, url, json=body)
            )
            assert_problem(response, 400, detail=f"Invalid session ID: {reason}")


async def test_malformed_message_id_is_400_with_upstream_text(world: World) -> None:
    for prefix in ("/v1", "/api/v1"):
        for bad, reason in malformed_ids("message"):
            url = f"{prefix}/sessions/{world.sid}/messages/{bad}"
            response = await assert_unchanged(world, world.client.get(url))
            assert_problem(response, 400, detail=f"Invalid message ID: {reason}")


@pytest.mark.parametrize("route", ["events", "sse"])
async def test_malformed_since_id_is_400_with_upstream_text(
    world: World, route: str
) -> None:
    url = f"/v1/sessions/{world.sid}/{route}"
    for bad, reason in malformed_ids("event"):
        response = await assert_unchanged(
            world, world.client.get(url, params={"since_id": bad})
        )
        assert_problem(response, 400, detail=f"Invalid event ID: {reason}")


async def test_malformed_last_event_id_header_is_400(world: World) -> None:
    url = f"/v1/sessions/{world.sid}/sse"
    for bad, reason in malformed_ids("event"):
        response = await assert_unchanged(
            world,
            world.client.get(url, headers={"Last-Event-ID": bad}),
        )
        assert_problem(response, 400, detail=f"Invalid event ID: {reason}")


async def test_malformed_session_id_wins_over_other_problems(world: World) -> None:
    """The path id is parsed before anything else is looked at or validated."""
    bad = f"sess_{HEX32}"
    expected = "Invalid session ID: invalid prefix: expected 'session', got 'sess'"
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", f"/v1/sessions/{bad}/messages/message_x", {}),
        ("GET", f"/v1/sessions/{bad}/events", {"params": {"since_id": "event_x"}}),
        ("POST", f"/v1/sessions/{bad}/messages", {"json": TEXT_BODY}),
    ]
    for method, url, kwargs in cases:
        response = await assert_unchanged(
            world, world.client.request(method, url, **kwargs)
        )
        assert_problem(response, 400, detail=expected)


# ---- unknown, foreign and deleted sessions ------------------------------------------


@pytest.mark.parametrize(("method", "suffix", "body"), SESSION_ROUTES, ids=ROUTE_IDS)
async def test_unknown_session_is_404(
    world: World, method: str, suffix: str, body: dict[str, Any] | None
) -> None:
    for prefix in ("/v1", "/api/v1"):
        url = f"{prefix}/sessions/{UNKNOWN_SESSION}" + world.fill(suffix)
        response = await assert_unchanged(
            world, request(world.client, method, url, json=body)
        )
        assert_problem(
            response,
            404,
            detail=f"Session {UNKNOWN_SESSION} not found",
            code="session_not_found",
        )


async def test_unknown_message_is_404(world: World) -> None:
    missing = "message_" + uuid.uuid4().hex
    response = await assert_unchanged(
        world,
        world.client.get(f"/v1/sessions/{world.sid}/messages/{missing}"),
    )
    assert_problem(
        response, 404, detail=f"Message {missing} not found", code="message_not_found"
    )


async def test_message_of_another_session_is_404(world: World) -> None:
    url = f"/v1/sessions/{world.sid}/messages/{world.other_mid}"
    response = await assert_unchanged(world, world.client.get(url))
    assert_problem(response, 404, code="message_not_found")
    own = await world.client.get(
        f"/v1/sessions/{world.other_sid}/messages/{world.other_mid}"
    )
    assert own.status_code == 200


@pytest.mark.parametrize("route", ["events", "sse"])
async def test_since_id_that_names_no_event_is_rejected(
    world: World, route: str
) -> None:
    """An id that is no event of the session and no UUIDv7 (so no time cursor either,
    see events.service.resume_sequence) is a bad cursor."""
    for since_id in ("event_" + uuid.uuid4().hex, "event_" + "0" * 32):
        response = await assert_unchanged(
            world,
            world.client.get(
                f"/v1/sessions/{world.sid}/{route}", params={"since_id": since_id}
            ),
        )
        assert_problem(
            response, 400, detail=f"since_id: no event {since_id} in this session"
        )


async def test_deleted_session_is_404_on_every_route(world: World) -> None:
    deleted = await world.client.delete(f"/v1/sessions/{world.sid}")
    assert deleted.status_code == 204
    assert deleted.content == b""
    session_id = uuid_of(world.sid)
    database = world.running.app.state.app.database
    async with database.read() as db:
        for model in (models.Message, models.Event):
            rows = await db.scalar(
                select(func.count())
                .select_from(model)
                .where(model.session_id == session_id)
            )
            assert rows == 0, f"{model.__tablename__} rows outlived their session"
    for prefix in ("/v1", "/api/v1"):
        for method, suffix, body in SESSION_ROUTES:
            url = f"{prefix}/sessions/{world.sid}" + world.fill(suffix)
            response = await assert_unchanged(
                world,
                request(world.client, method, url, json=body),
            )
            assert_problem(
                response,
                404,
                detail=f"Session {world.sid} not found",
                code="session_not_found",
            )
    listed = (await world.client.get("/v1/sessions")).json()
    assert [s["id"] for s in listed["data"]] == [world.other_sid]
    assert listed["total"] == 1


async def test_session_deleted_mid_turn_stays_gone(world: World) -> None:
    client = world.client
    created = await client.post("/v1/sessions", json={})
    sid = created.json()["id"]
    await post_message(client, sid, "/scenario long 200")
    assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 204
    session_id = uuid_of(sid)
    runner = world.running.app.state.app.runner
    await wait_until(
        lambda: session_id not in runner.tasks,
        "the runner to let go of the deleted session",
        within=20,
        interval=0.02,
    )
    database = world.running.app.state.app.database
    async with database.read() as db:
        for model, column in (
            (models.Session, models.Session.id),
            (models.Message, models.Message.session_id),
            (models.Event, models.Event.session_id),
        ):
            rows = await db.scalar(
                select(func.count()).select_from(model).where(column == session_id)
            )
            assert rows == 0, f"{model.__tablename__} rows reappeared after delete"
    for method, suffix, body in SESSION_ROUTES:
        response = await request(
            client, method, f"/v1/sessions/{sid}" + world.fill(suffix), json=body
        )
        assert_problem(response, 404, code="session_not_found")


# ---- routing -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/nope"),
        ("GET", "/nope"),
        ("GET", "/v2/sessions"),
        ("POST", "/v1/session"),
        ("GET", "/v1/sessions/{sid}/nope"),
        ("GET", "/v1/sessions/{sid}/messages/{mid}/parts"),
        ("DELETE", "/api/v1/nope"),
    ],
)
async def test_unknown_route_is_404_problem(
    world: World, method: str, path: str
) -> None:
    url = world.fill(path)
    response = await assert_unchanged(world, world.client.request(method, url))
    assert_problem(response, 404, detail=f"No route for {method} {url}")


WRONG_METHODS: list[tuple[str, str, set[str]]] = [
    ("PUT", "/v1/sessions/{sid}", {"GET", "PATCH", "DELETE"}),
    ("POST", "/v1/sessions/{sid}", {"GET", "PATCH", "DELETE"}),
    ("DELETE", "/v1/sessions", {"GET", "POST"}),
    ("PATCH", "/api/v1/sessions", {"GET", "POST"}),
    ("GET", "/v1/sessions/{sid}/cancel", {"POST"}),
    ("POST", "/v1/sessions/{sid}/events", {"GET"}),
    ("DELETE", "/v1/sessions/{sid}/messages", {"GET", "POST"}),
    ("PUT", "/v1/sessions/{sid}/messages/{mid}", {"GET"}),
]


@pytest.mark.parametrize(("method", "path", "allowed"), WRONG_METHODS)
async def test_wrong_method_is_405_problem(
    world: World, method: str, path: str, allowed: set[str]
) -> None:
    url = world.fill(path)
    response = await assert_unchanged(world, world.client.request(method, url))
    assert_problem(response, 405, detail=f"Method {method} is not allowed on {url}")
    assert "allow" in response.headers


@pytest.mark.parametrize(("method", "path", "allowed"), WRONG_METHODS)
async def test_405_allow_header_lists_every_supported_method(
    world: World, method: str, path: str, allowed: set[str]
) -> None:
    """RFC 9110 §15.5.6: a 405 MUST carry `Allow` with the resource's supported methods."""
    response = await world.client.request(method, world.fill(path))
    assert response.status_code == 405
    listed = {m.strip() for m in response.headers["allow"].split(",")}
    assert allowed <= listed, f"Allow: {response.headers['allow']}, expected {allowed}"


# ---- request bodies ------------------------------------------------------------------


MALFORMED_BODIES: list[tuple[str, str, bytes]] = [
    ("POST", "/v1/sessions", b"{bad"),
    ("POST", "/v1/sessions", b'{"title": "a",}'),
    ("POST", "/v1/sessions", b"{} trailing"),
    ("POST", "/api/v1/sessions", b"{'title': 'single quotes'}"),
    ("PATCH", "/v1/sessions/{sid}", b"["),
    ("POST", "/v1/sessions/{sid}/messages", b'{"message": {"content": ['),
    ("POST", "/v1/sessions/{sid}/messages", b'{"message": {"content": [}}'),
]


@pytest.mark.parametrize(("method", "path", "content"), MALFORMED_BODIES)
async def test_malformed_json_body_is_400(
    world: World, method: str, path: str, content: bytes
) -> None:
    url = world.fill(path)
    response = await assert_unchanged(
        world, request(world.client, method, url, content=content)
    )
    assert_problem(response, 400, detail="Malformed JSON body", code="invalid_json")


async def test_body_that_is_not_utf8_is_400(world: World) -> None:
    response = await assert_unchanged(
        world,
        request(world.client, "POST", "/v1/sessions", content=b"\xff\xfe{"),
    )
    assert_problem(response, 400)


INVALID_BODIES: list[tuple[str, str, Any, list[str]]] = [
    ("POST", "/v1/sessions", {"title": 5}, ["title"]),
    ("POST", "/v1/sessions", {"title": "x" * 1001}, ["title"]),
    ("POST", "/v1/sessions", {"tags": "not-a-list"}, ["tags"]),
    ("POST", "/v1/sessions", {"model_id": "model_123"}, ["model_id"]),
    ("POST", "/v1/sessions", {"agent_id": f"agent_{HEX32.upper()}"}, ["agent_id"]),
    ("POST", "/v1/sessions", {"max_iterations": 0}, ["max_iterations"]),
    ("POST", "/v1/sessions", {"source": "slack"}, ["source"]),
    ("POST", "/v1/sessions", {"hints": [1, 2]}, ["hints"]),
    ("POST", "/v1/sessions", [1, 2], []),
    ("PATCH", "/v1/sessions/{sid}", {"title": ["x"]}, ["title"]),
    ("PATCH", "/v1/sessions/{sid}", {"tags": [1, {}]}, ["tags.1"]),
    ("POST", "/v1/sessions/{sid}/messages", {}, ["message"]),
    ("POST", "/v1/sessions/{sid}/messages", {"message": {}}, ["message.content"]),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {"message": {"content": []}},
        ["message.content"],
    ),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {"message": {"content": "hello"}},
        ["message.content"],
    ),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {"message": {"content": [{"type": "bogus", "text": "x"}]}},
        ["message.content.0"],
    ),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {"message": {"content": [{"type": "text"}]}},
        ["message.content.0.text.text"],
    ),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {"message": {"content": [{"type": "image_file", "image_id": "img_1"}]}},
        ["message.content.0.image_file.image_id"],
    ),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {"message": {"content": [{"type": "file", "file_id": f"img_{HEX32}"}]}},
        ["message.content.0.file.file_id"],
    ),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {"message": {"content": [{"type": "context", "tag": "<b>", "context": "c"}]}},
        ["message.content.0.context.tag"],
    ),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {"message": {"visibility": "secret", **TEXT_BODY["message"]}},
        ["message.visibility"],
    ),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {**TEXT_BODY, "controls": {"model_id": "gpt-4"}},
        ["controls.model_id"],
    ),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {**TEXT_BODY, "controls": {"reasoning": {"effort": "extreme"}}},
        ["controls.reasoning.effort"],
    ),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {**TEXT_BODY, "external_actor": {"actor_id": "U1"}},
        ["external_actor.source"],
    ),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {**TEXT_BODY, "metadata": "not-an-object"},
        ["metadata"],
    ),
    (
        "POST",
        "/v1/sessions/{sid}/messages",
        {**TEXT_BODY, "client_message_id": ""},
        ["client_message_id"],
    ),
]


@pytest.mark.parametrize(("method", "path", "body", "fields"), INVALID_BODIES)
async def test_invalid_body_is_422_naming_the_field(
    world: World, method: str, path: str, body: Any, fields: list[str]
) -> None:
    url = world.fill(path)
    response = await assert_unchanged(
        world, world.client.request(method, url, json=body)
    )
    problem = assert_problem(response, 422, code="validation_error")
    errors = problem["errors"]
    assert isinstance(errors, list), problem
    assert errors, problem
    for error in errors:
        assert set(error) == {"loc", "msg", "type"}, error
        assert error["loc"][0] == "body", error
        assert isinstance(error["msg"], str), error
        assert error["msg"], error
    named = {".".join(error["loc"][1:]) for error in errors}
    for name in fields:
        assert name in named, f"{name} not among {named}"
        assert name in problem["detail"], problem["detail"]


@pytest.mark.parametrize("role", ["agent", "assistant", "system"])
async def test_non_user_role_is_upstreams_400_and_starts_no_turn(
    world: World, role: str
) -> None:
    body = {"message": {"role": role, "content": [{"type": "text", "text": "x"}]}}
    response = await assert_unchanged(
        world,
        world.client.post(f"/v1/sessions/{world.sid}/messages", json=body),
    )
    problem = assert_problem(response, 400)
    assert (
        problem["detail"] == "Only user messages can be created through this endpoint"
    )
    session = (await world.client.get(f"/v1/sessions/{world.sid}")).json()
    assert session["status"] == "idle"


# ---- query values --------------------------------------------------------------------


BAD_QUERIES: list[tuple[str, Any, str | None]] = [
    # sessions
    ("/v1/sessions", {"limit": 0}, None),
    ("/v1/sessions", {"limit": 101}, None),
    ("/v1/sessions", {"limit": "ten"}, None),
    ("/v1/sessions", {"offset": -1}, None),
    ("/v1/sessions", {"status": "bogus"}, "status: unknown value 'bogus'"),
    ("/v1/sessions", {"status": "idle,finished"}, "status: unknown value 'finished'"),
    ("/v1/sessions", {"order": "title"}, None),
    ("/v1/sessions", {"created_after": "yesterday"}, None),
    (
        "/v1/sessions",
        {"created_before": "2026-01-01T00:00:00"},
        "created_before: needs a UTC offset (RFC 3339), e.g. Z or +02:00",
    ),
    ("/v1/sessions", {"search": "x" * 201}, None),
    # events
    ("/v1/sessions/{sid}/events", {"limit": 0}, None),
    ("/v1/sessions/{sid}/events", {"limit": 1001}, None),
    ("/v1/sessions/{sid}/events", {"limit": "all"}, None),
    ("/v1/sessions/{sid}/events", {"after_sequence": -1}, None),
    ("/v1/sessions/{sid}/events", {"before_sequence": 0}, None),
    (
        "/v1/sessions/{sid}/events",
        {"types": "message.created"},
        "types: unknown event type 'message.created'",
    ),
    (
        "/v1/sessions/{sid}/events",
        [("types", "input.message"), ("types", "tool.result")],
        "types: unknown event type 'tool.result'",
    ),
    (
        "/v1/sessions/{sid}/events",
        {"exclude": "session.completed"},
        "exclude: unknown event type 'session.completed'",
    ),
    # This service's live-only events are never in the log: not a filter of it.
    (
        "/v1/sessions/{sid}/events",
        {"types": "llm.retry"},
        "types: unknown event type 'llm.retry'",
    ),
    (
        "/v1/sessions/{sid}/events",
        [("types", "input.message")] * 65,
        "types: too many values (max 64)",
    ),
    (
        "/v1/sessions/{sid}/events",
        {"since_id": "{eid}", "after_sequence": 0},
        "since_id and after_sequence are mutually exclusive",
    ),
    # messages
    ("/v1/sessions/{sid}/messages", {"limit": 0}, "limit: must be at least 1"),
    ("/v1/sessions/{sid}/messages", {"limit": -5}, "limit: must be at least 1"),
    ("/v1/sessions/{sid}/messages", {"limit": "many"}, None),
    ("/v1/sessions/{sid}/messages", {"before_sequence": 0}, None),
    ("/v1/sessions/{sid}/messages", {"include_internal": "maybe"}, None),
    # streams: rejected before any frame is sent
    (
        "/v1/sessions/{sid}/sse",
        {"types": "message.delta"},
        "types: unknown event type 'message.delta'",
    ),
    (
        "/v1/sessions/{sid}/sse",
        {"exclude": "bogus"},
        "exclude: unknown event type 'bogus'",
    ),
    (
        "/v1/sessions/{sid}/sse",
        {"since_id": "{eid}", "after_sequence": 0},
        "since_id and after_sequence are mutually exclusive",
    ),
    ("/v1/sessions/{sid}/sse", {"after_sequence": -1}, None),
    (
        "/v1/sessions/{sid}/messages/stream",
        {"after": "latest"},
        "after: expected a non-negative integer cursor",
    ),
]


def _fill_params(world: World, params: Any) -> Any:
    if isinstance(params, dict):
        return {
            k: world.fill(v) if isinstance(v, str) else v for k, v in params.items()
        }
    return [(k, world.fill(v)) for k, v in params]


@pytest.mark.parametrize(("path", "params", "detail"), BAD_QUERIES)
async def test_bad_query_value_is_400(
    world: World, path: str, params: Any, detail: str | None
) -> None:
    url = world.fill(path)
    query = _fill_params(world, params)
    response = await assert_unchanged(world, world.client.get(url, params=query))
    problem = assert_problem(response, 400, detail=detail)
    assert "detail" in problem
    if "errors" in problem:
        # Framework-level query validation names the parameter, as a body error would.
        assert problem["code"] == "invalid_parameter"
        names = {e["loc"][-1] for e in problem["errors"]}
        assert names & set(dict(query)), (names, query)
        assert all(e["loc"][0] == "query" for e in problem["errors"])


async def test_messages_limit_above_max_is_capped_not_rejected(world: World) -> None:
    response = await world.client.get(
        f"/v1/sessions/{world.sid}/messages", params={"limit": 10_000}
    )
    assert response.status_code == 200
    assert len(response.json()["data"]) == 2


# ---- unexpected failures -------------------------------------------------------------


async def _explode(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("secret internals: /etc/passwd")


@pytest.mark.parametrize(
    "suffix",
    ["", "/messages/{mid}", "/events", "/sse", "/messages/stream"],
)
async def test_unexpected_exception_is_generic_500_with_request_id(
    world: World,
    suffix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The session lookup every route starts with: sessions' own, the events feature's
    # for the log and the streams, and the request-path reads of messages.
    monkeypatch.setattr(app.sessions.service, "get_session", _explode)
    monkeypatch.setattr(app.events.service, "require_session", _explode)
    for reads in (app.db.reads.SqliteReads, app.db.reads.PgReads):
        monkeypatch.setattr(reads, "page", _explode)
        monkeypatch.setattr(reads, "message", _explode)
        monkeypatch.setattr(reads, "head", _explode)
    url = f"/v1/sessions/{world.sid}" + world.fill(suffix)
    with caplog.at_level(logging.ERROR, logger="app.errors"):
        response = await assert_unchanged(world, world.client.get(url))
    problem = assert_problem(response, 500)
    assert problem == {
        "title": "Internal Server Error",
        "status": 500,
        "detail": "Internal server error",
        "code": "internal_error",
        "type": ERROR_TYPE_BASE + "internal_error",
        "instance": url,
        "error": {"code": "internal_error", "message": "Internal server error"},
    }
    assert "secret" not in response.text
    request_id = response.headers["x-request-id"]
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged, "the failure was not logged with its request id"
    assert logged[0].exc_info is not None, "the log record lacks the traceback"


async def test_failure_after_writes_rolls_everything_back(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = app.journal.checkpoint.append_user_message

    async def append_then_fail(*args: Any, **kwargs: Any) -> Any:
        await real(*args, **kwargs)
        raise RuntimeError("failed after writing")

    monkeypatch.setattr(app.journal.checkpoint, "append_user_message", append_then_fail)
    response = await assert_unchanged(
        world,
        world.client.post(f"/v1/sessions/{world.sid}/messages", json=TEXT_BODY),
    )
    assert_problem(response, 500, detail="Internal server error", code="internal_error")
    session_id = uuid_of(world.sid)
    assert session_id not in world.running.app.state.app.runner.tasks
    monkeypatch.undo()
    # The session still works, and its sequence continues without a gap.
    before = (await world.client.get(f"/v1/sessions/{world.sid}/events")).json()["data"]
    posted = await world.client.post(
        f"/v1/sessions/{world.sid}/messages", json=TEXT_BODY
    )
    assert posted.status_code == 201
    assert posted.json()["sequence"] == before[-1]["sequence"] + 1


async def test_database_outage_is_503_with_retry_after(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def unavailable(*_args: Any, **_kwargs: Any) -> Any:
        raise OperationalError("SELECT 1", {}, ConnectionRefusedError("db is down"))

    monkeypatch.setattr(app.sessions.service, "get_session", unavailable)
    response = await assert_unchanged(
        world, world.client.get(f"/v1/sessions/{world.sid}")
    )
    problem = assert_problem(response, 503, code="unavailable")
    assert problem["retry_after_seconds"] == 2
    assert response.headers["retry-after"] == "2"
    assert "db is down" not in response.text


@pytest.mark.sqlite_only(reason="the SQLite reads' own driver error")
async def test_a_locked_sqlite_file_on_a_read_is_503_not_500(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request-path reads (and the runner's) run on aiosqlite connections of
    their own: SQLite's "database is locked" there is the database being
    unavailable, as it is through SQLAlchemy."""

    async def locked(*_args: Any, **_kwargs: Any) -> Any:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(aiosqlite.Connection, "execute_fetchall", locked)
    response = await assert_unchanged(
        world, world.client.get(f"/v1/sessions/{world.sid}/messages")
    )
    problem = assert_problem(response, 503, code="unavailable")
    assert response.headers["retry-after"] == "2"
    assert "locked" not in problem["detail"]
