"""One explicit test per finding of the API fuzzer (tests/test_fuzz.py), on every lane.

Each test names the request the fuzzer found and pins the answer the fix gives."""

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from sqlalchemy import func, select

from app.db import models
from app.db.base import Base
from app.main import create_app
from app.schemas import MAX_INT32
from app.settings import Settings
from tests.support.lanes import make_settings

ROOT = Path(__file__).resolve().parents[1]
PROBLEM_JSON = "application/problem+json"
TEXT = {"message": {"content": [{"type": "text", "text": "hi"}]}}
INT32_MAX = 2**31 - 1
INT32_PAST = 2**31


def assert_problem(
    response: httpx.Response, status: int, detail: str | None = None
) -> dict[str, Any]:
    context = f"{response.request.method} {response.request.url} -> {response.status_code} {response.text}"
    assert response.status_code == status, context
    assert response.headers["content-type"].split(";")[0] == PROBLEM_JSON, context
    body: dict[str, Any] = response.json()
    assert body["status"] == status, context
    assert isinstance(body["title"], str), context
    if detail is not None:
        assert body.get("detail") == detail, context
    return body


class Api:
    def __init__(self, app: Any, client: httpx.AsyncClient) -> None:
        self.app = app
        self.client = client

    async def session(self) -> str:
        response = await self.client.post("/v1/sessions", json={"title": "t"})
        assert response.status_code == 201, response.text
        sid: str = response.json()["id"]
        return sid

    async def counts(self) -> tuple[int, int, int]:
        async with self.app.state.app.database.read() as db:

            async def count(model: type[Base]) -> int:
                return int(
                    await db.scalar(select(func.count()).select_from(model)) or 0
                )

            return (
                await count(models.Session),
                await count(models.Message),
                await count(models.Event),
            )


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    """The app in-process, with streams that cycle quickly so a 200 stream ends."""
    app = create_app(
        make_settings(
            settings.database_url, sse_cycle_seconds=0.1, sse_heartbeat_seconds=0.05
        )
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test"
        ) as client:
            yield Api(app, client)


# ---- GET /v1/sessions?created_before=0.5 was 200 -------------------------------------


@pytest.mark.parametrize("value", ["0.5", "1700000000", "-1", "now"])
async def test_created_filters_take_rfc3339_only_not_unix_times(
    api: Api, value: str
) -> None:
    for name in ("created_after", "created_before"):
        response = await api.client.get("/v1/sessions", params={name: value})
        body = assert_problem(response, 400)
        assert body["detail"].startswith(f"{name}: "), body


async def test_created_filters_still_take_rfc3339(api: Api) -> None:
    await api.session()
    response = await api.client.get(
        "/v1/sessions",
        params={
            "created_after": "2000-01-01T00:00:00Z",
            "created_before": "2999-01-01T00:00:00+02:00",
        },
    )
    assert response.status_code == 200, response.text
    assert response.json()["total"] == 1


# ---- OPTIONS /v1/sessions answered 405 with `Allow: POST` ----------------------------


@pytest.mark.parametrize("prefix", ["/v1", "/api/v1"])
async def test_405_allow_names_every_method_of_the_path(api: Api, prefix: str) -> None:
    sid = await api.session()
    cases = [
        ("OPTIONS", "/sessions", "GET, POST"),
        ("PUT", "/sessions", "GET, POST"),
        ("PUT", f"/sessions/{sid}", "GET, PATCH, DELETE"),
        ("OPTIONS", f"/sessions/{sid}/messages", "GET, POST"),
        ("DELETE", f"/sessions/{sid}/cancel", "POST"),
        ("POST", f"/sessions/{sid}/messages/stream", "GET"),
        ("POST", f"/sessions/{sid}/events", "GET"),
    ]
    for method, path, allow in cases:
        response = await api.client.request(method, prefix + path)
        assert_problem(response, 405)
        assert response.headers["allow"] == allow, (method, path)


# ---- GET /v1/sessions?offset=487282299130719109120 was 500 ---------------------------


async def test_query_integers_past_int32_are_400_not_500(api: Api) -> None:
    sid = await api.session()
    cases = [
        ("/v1/sessions", "offset"),
        (f"/v1/sessions/{sid}/events", "after_sequence"),
        (f"/v1/sessions/{sid}/events", "before_sequence"),
        (f"/v1/sessions/{sid}/messages", "before_sequence"),
        (f"/v1/sessions/{sid}/sse", "after_sequence"),
    ]
    for path, name in cases:
        for value in (INT32_PAST, 487282299130719109120):
            response = await api.client.get(path, params={name: value})
            body = assert_problem(response, 400)
            assert body["detail"].startswith(f"{name}: "), body


async def test_query_integers_at_int32_max_are_served(api: Api) -> None:
    sid = await api.session()
    await api.client.post(f"/v1/sessions/{sid}/messages", json=TEXT)
    cases = [
        ("/v1/sessions", "offset"),
        (f"/v1/sessions/{sid}/events", "after_sequence"),
        (f"/v1/sessions/{sid}/events", "before_sequence"),
        (f"/v1/sessions/{sid}/messages", "before_sequence"),
    ]
    for path, name in cases:
        response = await api.client.get(path, params={name: INT32_MAX})
        assert response.status_code == 200, (path, name, response.text)


# ---- POST /v1/sessions {"agent_name": "\u0000"} was 500 on PostgreSQL ----------------


async def test_nul_in_a_stored_string_is_422_naming_the_field(api: Api) -> None:
    sid = await api.session()
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("POST", "/v1/sessions", {"agent_name": "\x00"}, "agent_name"),
        ("POST", "/v1/sessions", {"title": "a\x00b"}, "title"),
        ("POST", "/v1/sessions", {"tags": ["ok", "n\x00"]}, "tags.1"),
        ("POST", "/v1/sessions", {"metadata": {"k": {"x": "\x00"}}}, "metadata.k.x"),
        ("POST", "/v1/sessions", {"metadata": {"k\x00": 1}}, "metadata.k\x00"),
        ("PATCH", f"/v1/sessions/{sid}", {"goal": "\x00"}, "goal"),
        (
            "POST",
            f"/v1/sessions/{sid}/messages",
            {"message": {"content": [{"type": "text", "text": "a\x00"}]}},
            # The part's type is part of the path, as for every part field.
            "message.content.0.text.text",
        ),
        (
            "POST",
            f"/v1/sessions/{sid}/messages",
            {**TEXT, "client_message_id": "\x00"},
            "client_message_id",
        ),
        (
            "POST",
            f"/v1/sessions/{sid}/messages",
            {**TEXT, "external_actor": {"actor_id": "a", "source": "\x00"}},
            "external_actor.source",
        ),
    ]
    before = await api.counts()
    for method, path, body, field in cases:
        response = await api.client.request(method, path, json=body)
        assert_problem(response, 422, f"{field}: must not contain NUL (U+0000)")
    assert await api.counts() == before
    # Text around a NUL-free string is untouched.
    response = await api.client.post("/v1/sessions", json={"title": "a\\u0000b"})
    assert response.status_code == 201
    assert response.json()["title"] == "a\\u0000b"


async def test_nul_in_search_is_400(api: Api) -> None:
    await api.session()
    response = await api.client.get("/v1/sessions", params={"search": "a\x00"})
    assert_problem(response, 400, "search: must not contain NUL (U+0000)")


# ---- a malformed Last-Event-ID was ignored when a query cursor was given --------------


async def test_malformed_last_event_id_is_400_even_beside_a_query_cursor(
    api: Api,
) -> None:
    sid = await api.session()
    response = await api.client.get(
        f"/v1/sessions/{sid}/sse",
        params={"after_sequence": 0},
        headers={"Last-Event-ID": "null"},
    )
    assert_problem(
        response,
        400,
        "Invalid event ID: invalid prefix: expected 'event', got 'null'",
    )
    response = await api.client.get(
        f"/v1/sessions/{sid}/messages/stream",
        params={"after": "0"},
        headers={"Last-Event-ID": "null"},
    )
    assert_problem(
        response, 400, "Last-Event-ID: expected a non-negative integer cursor"
    )


async def test_empty_cursors_mean_no_cursor(api: Api) -> None:
    sid = await api.session()
    for path, params in (
        ("/messages/stream", {"after": ""}),
        ("/messages/stream", {}),
        ("/sse", {}),
    ):
        response = await api.client.get(
            f"/v1/sessions/{sid}{path}",
            params=params,
            headers={"Last-Event-ID": ""},
        )
        assert response.status_code == 200, (path, response.text)


# ---- SSE frames: documented as one string, sent as events -----------------------------


@pytest.fixture(scope="module")
def committed_schema() -> Any:
    return schemathesis.openapi.from_path(ROOT / "openapi" / "openapi.json")


async def test_stream_frames_match_the_documented_event_schemas(
    api: Api, committed_schema: Any
) -> None:
    """The fuzzer's ST108: `reset` and `disconnecting` frames (the latter after durable
    events, so it inherits their last event ID) against the documented frame schemas."""
    sid = await api.session()
    assert (await api.client.post(f"/v1/sessions/{sid}/messages", json=TEXT)).is_success
    stream = committed_schema["/v1/sessions/{session_id}/messages/stream"]["GET"]
    sse = committed_schema["/v1/sessions/{session_id}/sse"]["GET"]
    for operation, path, params, frames in (
        (stream, "/messages/stream", {"after": "999999"}, ["event: reset"]),
        (stream, "/messages/stream", {"after": "0"}, ["event: message", "id: "]),
        (sse, "/sse", {"after_sequence": 0}, ["event: input.message", "id: event_"]),
        (sse, "/sse", {}, ["event: connected", "event: disconnecting"]),
    ):
        response = await api.client.get(f"/v1/sessions/{sid}{path}", params=params)
        assert response.status_code == 200
        for frame in frames:
            assert frame in response.text, (path, params, response.text)
        operation.validate_response(response)


# ---- the document says what the server enforces ---------------------------------------


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    settings = Settings(database_url="sqlite+aiosqlite:///:memory:")
    doc: dict[str, Any] = create_app(settings).openapi()
    return doc


def _param(document: dict[str, Any], path: str, name: str) -> dict[str, Any]:
    for parameter in document["paths"][path]["get"]["parameters"]:
        if parameter["name"] == name:
            schema: dict[str, Any] = parameter["schema"]
            return schema
    raise AssertionError(f"{path} has no parameter {name}")


def test_ids_and_cursors_are_documented_with_their_format(
    document: dict[str, Any],
) -> None:
    """The fuzzer's ST202: `GET /v1/sessions/0` was schema-valid (any string) and 400."""
    messages = "/v1/sessions/{session_id}/messages"
    one = "/v1/sessions/{session_id}/messages/{message_id}"
    events = "/v1/sessions/{session_id}/events"
    stream = "/v1/sessions/{session_id}/messages/stream"
    assert _param(document, messages, "session_id")["pattern"] == (
        "^session_[0-9a-f]{32}$"
    )
    assert _param(document, one, "message_id")["pattern"] == "^message_[0-9a-f]{32}$"
    assert _param(document, events, "since_id")["anyOf"][0]["pattern"] == (
        "^event_[0-9a-f]{32}$"
    )
    assert _param(document, messages, "limit")["minimum"] == 1
    cursor = re.compile(_param(document, stream, "after")["anyOf"][0]["pattern"])
    assert [bool(cursor.match(t)) for t in ("0", "0042", str(MAX_INT32))] == [True] * 3
    assert not any(cursor.match(t) for t in ("", "-1", str(MAX_INT32 + 1), "²"))
    types = _param(document, events, "types")["anyOf"][0]
    assert "input.message" in types["items"]["enum"]
    assert types["maxItems"] == 64
    role = document["components"]["schemas"]["InputMessage"]["properties"]["role"]
    assert role["enum"] == ["user"]


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("", True),
        ("idle", True),
        (" idle , running", True),
        ("idle,,", True),
        ("bogus", False),
        ("idle,bogus", False),
    ],
)
async def test_status_filter_pattern_agrees_with_the_server(
    api: Api, document: dict[str, Any], value: str, accepted: bool
) -> None:
    pattern = _param(document, "/v1/sessions", "status")["pattern"]
    assert (re.match(pattern, value) is not None) is accepted
    response = await api.client.get("/v1/sessions", params={"status": value})
    assert response.status_code == (200 if accepted else 400), response.text


def test_every_status_the_server_can_send_is_documented(
    document: dict[str, Any],
) -> None:
    """429 (rate limiter), 500 and 503 (with Retry-After) can answer any route; 413 and
    415 any POST or PATCH (the body guard); 304 the messages list (If-None-Match). The
    framework's `422 HTTPValidationError` is never sent, so it is not documented."""
    for path, item in document["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in item.items():
            statuses = set(operation["responses"])
            assert {"400", "401", "429", "500", "503"} <= statuses, (method, path)
            if method in ("post", "patch"):
                assert {"413", "415"} <= statuses, (method, path)
            if "422" in statuses:
                content = operation["responses"]["422"]["content"]
                assert PROBLEM_JSON in content, (method, path)
    assert (
        "304"
        in document["paths"]["/v1/sessions/{session_id}/messages"]["get"]["responses"]
    )
    assert "HTTPValidationError" not in document["components"]["schemas"]


async def test_search_matches_percent_and_underscore_literally(
    client: httpx.AsyncClient,
) -> None:
    for title in ("100% sure", "1000 things", "a_b", "axb"):
        assert (
            await client.post("/v1/sessions", json={"title": title})
        ).status_code == 201
    percent = (await client.get("/v1/sessions", params={"search": "100%"})).json()
    assert [s["title"] for s in percent["data"]] == ["100% sure"]
    underscore = (await client.get("/v1/sessions", params={"search": "a_b"})).json()
    assert [s["title"] for s in underscore["data"]] == ["a_b"]


# POST /v1/sessions {"max_iterations": true}: JSON true was read as 1 (201).
@pytest.mark.parametrize("value", [True, False, "3", 2.5])
async def test_max_iterations_takes_integers_only(api: Api, value: Any) -> None:
    response = await api.client.post("/v1/sessions", json={"max_iterations": value})
    body = assert_problem(response, 422)
    assert "max_iterations" in body["detail"], body


async def test_max_iterations_takes_an_integral_number(api: Api) -> None:
    response = await api.client.post("/v1/sessions", json={"max_iterations": 3.0})
    assert response.status_code == 201, response.text
    assert response.json()["max_iterations"] == 3
