"""HTTP answers the server controls: every 4xx is problem+json with `code`, `type` and
the `error` member the SDKs read; `If-None-Match: *` is a 304 on an existing resource;
a trailing slash is a 404 that names the route, never a 307; HEAD and other unknown
methods are a 405 with `Allow`."""

from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.support.api import create_session, post_message, text_body
from tests.support.database import table_rows
from tests.support.in_process import Running, running_app
from tests.support.lanes import make_settings
from tests.support.problems import ERROR_TYPE_BASE, PROBLEM_JSON, assert_problem
from tests.support.waits import wait_idle

HEX32 = "0123456789abcdef0123456789abcdef"
UNKNOWN_SESSION = f"session_{HEX32}"


@pytest.fixture
async def world(running: Running) -> tuple[httpx.AsyncClient, str, str]:
    """A client and an idle session with one finished turn, and its first message."""
    client = running.client
    sid = await create_session(client, "http")
    message = await post_message(client, sid, "hello")
    await wait_idle(client, sid)
    return client, sid, message["id"]


# ---- every 4xx carries a code, its type and the `error` member --------------------------

JSON = {"Content-Type": "application/json"}

# (name, method, path, request kwargs, status, code); {sid} and {mid} are filled in.
FOURXX: list[tuple[str, str, str, dict[str, Any], int, str]] = [
    (
        "malformed json",
        "POST",
        "/v1/sessions",
        {"content": b"{", "headers": JSON},
        400,
        "invalid_json",
    ),
    (
        "not utf-8",
        "POST",
        "/v1/sessions",
        {"content": b"\xff\xfe{", "headers": JSON},
        400,
        "invalid_json",
    ),
    ("malformed id", "GET", "/v1/sessions/sess_1", {}, 400, "invalid_id"),
    (
        "bad query value",
        "GET",
        "/v1/sessions",
        {"params": {"limit": 0}},
        400,
        "invalid_parameter",
    ),
    (
        "unknown status",
        "GET",
        "/v1/sessions",
        {"params": {"status": "x"}},
        400,
        "invalid_parameter",
    ),
    (
        "bad cursor",
        "GET",
        "/v1/sessions/{sid}/messages/stream",
        {"params": {"after": "x"}},
        400,
        "invalid_parameter",
    ),
    (
        "non-user role",
        "POST",
        "/v1/sessions/{sid}/messages",
        {
            "json": {
                "message": {"role": "agent", "content": [{"type": "text", "text": "x"}]}
            }
        },
        400,
        "bad_request",
    ),
    (
        "unknown session",
        "GET",
        f"/v1/sessions/{UNKNOWN_SESSION}",
        {},
        404,
        "session_not_found",
    ),
    (
        "unknown message",
        "GET",
        f"/v1/sessions/{{sid}}/messages/message_{HEX32}",
        {},
        404,
        "message_not_found",
    ),
    ("unknown route", "GET", "/v1/nope", {}, 404, "not_found"),
    ("wrong method", "PUT", "/v1/sessions", {}, 405, "method_not_allowed"),
    (
        "reused client_message_id",
        "POST",
        "/v1/sessions/{sid}/messages",
        {"json": text_body("changed", client_message_id="c1")},
        409,
        "client_message_id_conflict",
    ),
    (
        "too large",
        "POST",
        "/v1/sessions",
        {"content": b"{}" + b" " * 2_000_000, "headers": JSON},
        413,
        "payload_too_large",
    ),
    (
        "not json",
        "POST",
        "/v1/sessions",
        {"content": b"title=x", "headers": {"Content-Type": "text/plain"}},
        415,
        "unsupported_media_type",
    ),
    (
        "invalid body",
        "POST",
        "/v1/sessions",
        {"json": {"title": 5}},
        422,
        "validation_error",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [case[1:] for case in FOURXX],
    ids=[case[0] for case in FOURXX],
)
async def test_every_4xx_carries_code_type_and_error_member(
    running: Running,
    method: str,
    path: str,
    kwargs: dict[str, Any],
    status: int,
    code: str,
) -> None:
    client = running.client
    sid = await create_session(client, "errors")
    first = await client.post(
        f"/v1/sessions/{sid}/messages", json=text_body("hi", client_message_id="c1")
    )
    assert first.status_code == 201
    await wait_idle(client, sid)
    before = await table_rows(running.app.state.app.database)
    response = await client.request(method, path.format(sid=sid), **kwargs)
    problem = assert_problem(response, status, code=code)
    assert problem["type"] == ERROR_TYPE_BASE + code
    assert problem["error"] == {"code": code, "message": problem["detail"]}
    assert await table_rows(running.app.state.app.database) == before


# ---- If-None-Match: * -----------------------------------------------------------------------


def conditional_paths(sid: str, mid: str) -> list[str]:
    """GETs of existing resources, on the hot path and through FastAPI."""
    return [
        f"/v1/sessions/{sid}",
        "/v1/sessions",
        f"/v1/sessions/{sid}/events",
        f"/v1/sessions/{sid}/messages",  # the hot path
        f"/v1/sessions/{sid}/messages?limit=050",  # not canonical: FastAPI
        f"/api/v1/sessions/{sid}/messages",
        f"/v1/sessions/{sid}/messages/{mid}",
        f"/api/v1/sessions/{sid}/messages/{mid}",
    ]


async def test_if_none_match_star_on_an_existing_resource_is_304(
    world: tuple[httpx.AsyncClient, str, str],
) -> None:
    client, sid, mid = world
    for path in conditional_paths(sid, mid):
        plain = await client.get(path)
        assert plain.status_code == 200, (path, plain.text)
        response = await client.get(path, headers={"If-None-Match": "*"})
        assert response.status_code == 304, (path, response.status_code)
        assert response.content == b""
        assert "content-type" not in response.headers, path
        assert response.headers["x-request-id"]


async def test_if_none_match_with_other_tags_is_200(
    world: tuple[httpx.AsyncClient, str, str],
) -> None:
    client, sid, mid = world
    for path in conditional_paths(sid, mid):
        response = await client.get(path, headers={"If-None-Match": '"nope", W/"x"'})
        assert response.status_code == 200, (path, response.status_code)


async def test_if_none_match_star_on_a_missing_resource_is_its_404(
    world: tuple[httpx.AsyncClient, str, str],
) -> None:
    client, sid, _ = world
    for path in (
        f"/v1/sessions/{UNKNOWN_SESSION}",
        f"/v1/sessions/{UNKNOWN_SESSION}/messages",
        f"/v1/sessions/{sid}/messages/message_{HEX32}",
    ):
        response = await client.get(path, headers={"If-None-Match": "*"})
        assert_problem(response, 404)


async def test_if_none_match_star_does_not_end_a_stream(running: Running) -> None:
    client = running.client
    sid = await create_session(client, "stream")
    app_settings = running.app.state.app.settings
    assert app_settings.sse_cycle_seconds <= 5  # the in-process stream ends by itself
    for path in (f"/v1/sessions/{sid}/sse", f"/v1/sessions/{sid}/messages/stream"):
        async with client.stream(
            "GET", path, headers={"If-None-Match": "*"}
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")


# ---- trailing slashes, HEAD, unknown methods and routes -----------------------------------


@pytest.mark.parametrize(
    ("method", "path", "meant"),
    [
        ("GET", "/v1/sessions/", "/v1/sessions"),
        ("POST", "/v1/sessions/", "/v1/sessions"),
        ("GET", "/api/v1/sessions/", "/api/v1/sessions"),
        ("GET", "/v1/sessions/{sid}/", "/v1/sessions/{sid}"),
        ("DELETE", "/v1/sessions/{sid}/", "/v1/sessions/{sid}"),
        ("GET", "/v1/sessions/{sid}/messages/", "/v1/sessions/{sid}/messages"),
        ("POST", "/v1/sessions/{sid}/messages/", "/v1/sessions/{sid}/messages"),
        ("GET", "/v1/sessions/{sid}/sse/", "/v1/sessions/{sid}/sse"),
        ("GET", "/v1/sessions/{sid}/events/", "/v1/sessions/{sid}/events"),
    ],
)
async def test_trailing_slash_is_404_naming_the_route_not_a_redirect(
    running: Running, method: str, path: str, meant: str
) -> None:
    client = running.client
    sid = await create_session(client, "slash")
    url, meant = path.format(sid=sid), meant.format(sid=sid)
    before = await table_rows(running.app.state.app.database)
    kwargs: dict[str, Any] = {"json": text_body()} if method == "POST" else {}
    response = await client.request(method, url, **kwargs)
    assert_problem(
        response,
        404,
        detail=f"No route for {method} {url}; routes have no trailing slash: {meant}",
        code="not_found",
    )
    assert "location" not in response.headers
    assert await table_rows(running.app.state.app.database) == before


async def test_trailing_slash_of_an_unknown_route_is_a_plain_404(
    running: Running,
) -> None:
    response = await running.client.get("/v1/nope/")
    assert_problem(response, 404, detail="No route for GET /v1/nope/")


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/v1/sessions", "GET, POST"),
        ("/v1/sessions/{sid}", "GET, PATCH, DELETE"),
        ("/v1/sessions/{sid}/messages", "GET, POST"),  # hot on GET
        ("/api/v1/sessions/{sid}/events", "GET"),
        ("/v1/sessions/{sid}/sse", "GET"),
    ],
)
async def test_head_is_405_problem_with_allow(
    running: Running, path: str, allowed: str
) -> None:
    client = running.client
    sid = await create_session(client, "head")
    response = await client.head(path.format(sid=sid))
    assert response.status_code == 405
    assert response.headers["allow"] == allowed
    assert response.headers["content-type"] == PROBLEM_JSON
    assert response.headers["x-request-id"]


async def test_head_of_an_unknown_route_is_404_problem(running: Running) -> None:
    response = await running.client.head("/v1/nope")
    assert response.status_code == 404
    assert response.headers["content-type"] == PROBLEM_JSON


async def test_refused_cors_preflight_is_a_problem(settings: Settings) -> None:
    """Starlette answers a refused preflight in text/plain; here it is problem+json."""
    allowed = "https://app.example"
    cors = make_settings(settings.database_url, cors_origins=[allowed])
    async with running_app(cors) as running:
        client = running.client
        for origin, method in (("https://evil.example", "POST"), (allowed, "PUT")):
            response = await client.options(
                "/v1/sessions",
                headers={
                    "Origin": origin,
                    "Access-Control-Request-Method": method,
                    "Access-Control-Request-Headers": "content-type",
                },
            )
            problem = assert_problem(response, 400, code="cors_preflight_refused")
            assert problem["detail"].startswith("Disallowed CORS "), problem
            assert response.headers.get("access-control-allow-origin") in (
                None,
                allowed,
            )
        response = await client.options(
            "/v1/sessions",
            headers={"Origin": allowed, "Access-Control-Request-Method": "POST"},
        )
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == allowed
