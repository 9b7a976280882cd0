"""Request limits: every refusal is problem+json with its own status and code, and a refused
request writes nothing. Limits come from settings, so the tests run with small ones."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from app.auth import create_key
from app.db.session import Database
from app.main import create_app
from app.settings import Settings
from tests.support.api import auth, create_session, post_message, text_body
from tests.support.database import table_rows
from tests.support.in_process import running_app
from tests.support.lanes import make_settings
from tests.support.problems import assert_problem, assert_too_many
from tests.support.servers import start_own_server
from tests.support.waits import wait_idle

MAX_BODY = 4096
MAX_PARTS = 3
MAX_TEXT = 100
MAX_DEPTH = 4
MAX_JSON = 256
SMALL_LIMITS: dict[str, Any] = {
    "max_body_bytes": MAX_BODY,
    "max_message_parts": MAX_PARTS,
    "max_text_chars": MAX_TEXT,
    "max_json_depth": MAX_DEPTH,
    "max_json_bytes": MAX_JSON,
}
ORG_1 = uuid.UUID(hex="11111111111111111111111111111111")
ORG_2 = uuid.UUID(hex="22222222222222222222222222222222")


def parts_body(count: int) -> dict[str, Any]:
    return {
        "message": {
            "content": [{"type": "text", "text": f"part {i}"} for i in range(count)]
        }
    }


def nested(levels: int) -> dict[str, Any]:
    """`levels` objects inside each other, the innermost holding a scalar:
    nested(2) == {"k1": {"k2": "leaf"}}."""
    value: Any = "leaf"
    for level in range(levels, 0, -1):
        value = {f"k{level}": value}
    assert isinstance(value, dict)
    return value


def nested_empty(levels: int) -> dict[str, Any]:
    """`levels` objects inside each other, the innermost empty:
    nested_empty(2) == {"k1": {}}."""
    value: dict[str, Any] = {}
    for level in range(levels - 1, 0, -1):
        value = {f"k{level}": value}
    return value


def sized(encoded_bytes: int) -> dict[str, Any]:
    """An object whose orjson encoding is exactly `encoded_bytes` long."""
    overhead = len(orjson.dumps({"blob": ""}))
    value = {"blob": "x" * (encoded_bytes - overhead)}
    assert len(orjson.dumps(value)) == encoded_bytes
    return value


def padded(body: dict[str, Any], total_bytes: int) -> bytes:
    """`body` with an ignored `pad` field so that it encodes to exactly `total_bytes`."""
    base = len(orjson.dumps({**body, "pad": ""}))
    encoded = orjson.dumps({**body, "pad": "p" * (total_bytes - base)})
    assert len(encoded) == total_bytes
    return encoded


def assert_refused(
    response: httpx.Response, status: int, code: str | None = None
) -> dict[str, Any]:
    """A problem+json refusal that says what was refused (`detail`) and where
    (`instance`)."""
    body = assert_problem(response, status, code=code)
    assert "detail" in body, response.text
    assert "instance" in body, response.text
    return body


@dataclass
class Limited:
    """The app with small limits, in open mode, with one idle session that has a turn."""

    client: httpx.AsyncClient
    database: Database
    sid: str

    async def unchanged(
        self,
        method: str,
        url: str,
        *,
        content: bytes | Any = None,
        json: Any = None,
        params: Any = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """Send one request and check that the database did not change."""
        before = await table_rows(self.database)
        assert before["sessions"], "the fixture made a session"
        response = await asyncio.wait_for(
            self.client.request(
                method, url, content=content, json=json, params=params, headers=headers
            ),
            20,
        )
        assert await table_rows(self.database) == before, (
            f"{method} {url} -> {response.status_code} changed the database"
        )
        return response


@pytest.fixture
async def limited(settings: Settings) -> AsyncIterator[Limited]:
    limits = make_settings(settings.database_url, **SMALL_LIMITS)
    async with running_app(limits) as running:
        client = running.client
        sid = await create_session(client, "limits")
        await post_message(client, sid, "hello")
        await wait_idle(client, sid)
        yield Limited(client, running.app.state.app.database, sid)


def body_routes(sid: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Every route that takes a body, with a body it would accept."""
    return [
        ("POST", "/v1/sessions", {"title": "t"}),
        ("POST", "/api/v1/sessions", {"title": "t"}),
        ("PATCH", f"/v1/sessions/{sid}", {"title": "t"}),
        ("POST", f"/v1/sessions/{sid}/messages", text_body()),
        ("POST", f"/api/v1/sessions/{sid}/messages", text_body()),
        ("POST", f"/v1/sessions/{sid}/cancel", {}),
    ]


# ---- 413: body size --------------------------------------------------------------------


async def test_body_over_limit_with_content_length_is_413(limited: Limited) -> None:
    for method, url, body in body_routes(limited.sid):
        content = padded(body, MAX_BODY + 1)
        response = await limited.unchanged(
            method, url, content=content, headers={"Content-Type": "application/json"}
        )
        assert response.request.headers["content-length"] == str(MAX_BODY + 1)
        problem = assert_refused(response, 413, "payload_too_large")
        assert str(MAX_BODY) in problem["detail"]
    # Far over, and declared without any body arriving (a client announcing a huge upload).
    response = await limited.unchanged(
        "POST",
        "/v1/sessions",
        content=b"{}" + b" " * (10 * MAX_BODY),
        headers={"Content-Type": "application/json"},
    )
    assert_refused(response, 413, "payload_too_large")


async def test_body_at_limit_is_accepted(limited: Limited) -> None:
    content = padded({"title": "at limit"}, MAX_BODY)
    response = await limited.client.post(
        "/v1/sessions", content=content, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 201, response.text
    content = padded(text_body("at limit"), MAX_BODY)
    response = await limited.client.post(
        f"/v1/sessions/{limited.sid}/messages",
        content=content,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text


async def chunked(content: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    for start in range(0, len(content), size):
        yield content[start : start + size]


async def test_chunked_body_over_limit_is_413(limited: Limited) -> None:
    for method, url, body in body_routes(limited.sid):
        content = padded(body, MAX_BODY + 1)
        response = await limited.unchanged(
            method,
            url,
            content=chunked(content),
            headers={"Content-Type": "application/json"},
        )
        assert "content-length" not in response.request.headers
        assert response.request.headers["transfer-encoding"] == "chunked"
        problem = assert_refused(response, 413, "payload_too_large")
        assert str(MAX_BODY) in problem["detail"]


async def test_chunked_body_at_limit_is_accepted(limited: Limited) -> None:
    content = padded({"title": "chunked at limit"}, MAX_BODY)
    response = await limited.client.post(
        "/v1/sessions",
        content=chunked(content, 333),
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text
    assert response.json()["title"] == "chunked at limit"


async def test_body_limits_hold_on_a_real_server(
    settings: Settings, tmp_path: Path
) -> None:
    """Through uvicorn: a declared length over the limit and a chunked body that grows
    over it are both 413 and create nothing; a body at the limit is accepted."""
    server = await start_own_server(
        settings.database_url, tmp_path, MAX_BODY_BYTES=str(MAX_BODY)
    )
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:

            async def total() -> int:
                response = await client.get("/v1/sessions")
                assert response.status_code == 200, response.text
                count: int = response.json()["total"]
                return count

            before = await total()
            headers = {"Content-Type": "application/json"}
            over = padded({"title": "over"}, MAX_BODY + 1)
            response = await client.post("/v1/sessions", content=over, headers=headers)
            assert_refused(response, 413, "payload_too_large")
            response = await client.post(
                "/v1/sessions", content=chunked(over, 512), headers=headers
            )
            assert response.request.headers["transfer-encoding"] == "chunked"
            assert_refused(response, 413, "payload_too_large")
            assert await total() == before
            at_limit = padded({"title": "at limit"}, MAX_BODY)
            response = await client.post(
                "/v1/sessions", content=chunked(at_limit, 512), headers=headers
            )
            assert response.status_code == 201, response.text
            assert await total() == before + 1
    finally:
        await asyncio.to_thread(server.stop)


# ---- 415: content type -------------------------------------------------------------------


async def test_non_json_content_type_is_415(limited: Limited) -> None:
    content_types: list[str | None] = [
        None,
        "text/plain",
        "text/json",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "application/xml",
        "application/jsonp",
        "application/octet-stream",
    ]
    for method, url, body in body_routes(limited.sid):
        for content_type in content_types:
            headers = {} if content_type is None else {"Content-Type": content_type}
            response = await limited.unchanged(
                method, url, content=orjson.dumps(body), headers=headers
            )
            if content_type is None:
                assert "content-type" not in response.request.headers
            assert_refused(response, 415, "unsupported_media_type")
        # A chunked body without a JSON content type is refused the same way.
        response = await limited.unchanged(
            method,
            url,
            content=chunked(orjson.dumps(body)),
            headers={"Content-Type": "text/plain"},
        )
        assert_refused(response, 415, "unsupported_media_type")


async def test_json_content_type_spellings_are_accepted(limited: Limited) -> None:
    for content_type in (
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/merge-patch+json",
    ):
        response = await limited.client.post(
            "/v1/sessions",
            content=orjson.dumps({"title": content_type}),
            headers={"Content-Type": content_type},
        )
        assert response.status_code == 201, (content_type, response.text)


async def test_bodyless_requests_need_no_content_type(limited: Limited) -> None:
    """Cancel and create-session take no body: without one there is nothing to refuse."""
    response = await limited.client.post(f"/v1/sessions/{limited.sid}/cancel")
    assert response.status_code == 200, response.text
    response = await limited.client.post("/v1/sessions")
    assert response.status_code == 201, response.text


# ---- 422: message and session shape limits -------------------------------------------


async def test_too_many_content_parts_is_422(limited: Limited) -> None:
    url = f"/v1/sessions/{limited.sid}/messages"
    for count in (MAX_PARTS + 1, MAX_PARTS * 5):
        response = await limited.unchanged("POST", url, json=parts_body(count))
        problem = assert_refused(response, 422, "validation_error")
        assert "message.content" in problem["detail"]
        assert str(MAX_PARTS) in problem["detail"]
    response = await limited.client.post(url, json=parts_body(MAX_PARTS))
    assert response.status_code == 201, response.text
    assert len(response.json()["content"]) == MAX_PARTS


async def test_text_too_long_is_422(limited: Limited) -> None:
    url = f"/v1/sessions/{limited.sid}/messages"
    too_long = "a" * (MAX_TEXT + 1)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"type": "text", "text": too_long}, "message.content.0.text"),
        (
            {"type": "context", "tag": "doc", "context": too_long},
            "message.content.0.context",
        ),
        (
            {"type": "image", "base64": too_long, "media_type": "image/png"},
            "message.content.0.base64",
        ),
    ]
    for part, where in cases:
        response = await limited.unchanged(
            "POST", url, json={"message": {"content": [part]}}
        )
        problem = assert_refused(response, 422, "validation_error")
        assert where in problem["detail"]
        assert str(MAX_TEXT) in problem["detail"]
    # The offending part is named even when it is not the first one.
    response = await limited.unchanged(
        "POST",
        url,
        json={
            "message": {
                "content": [
                    {"type": "text", "text": "fine"},
                    {"type": "text", "text": too_long},
                ]
            }
        },
    )
    assert "message.content.1.text" in assert_refused(response, 422)["detail"]


async def test_text_limit_counts_characters_not_bytes(limited: Limited) -> None:
    url = f"/v1/sessions/{limited.sid}/messages"
    wide = "\N{GRINNING FACE}" * MAX_TEXT  # 4 bytes each in UTF-8
    response = await limited.client.post(url, json=text_body(wide))
    assert response.status_code == 201, response.text
    assert response.json()["content"][0]["text"] == wide
    # The accepted message started a turn: let it finish, so that only the refused
    # request could change the database below.
    await wait_idle(limited.client, limited.sid)
    response = await limited.unchanged("POST", url, json=text_body(wide + "a"))
    assert_refused(response, 422, "validation_error")


def json_field_cases(sid: str) -> list[tuple[str, str, str]]:
    """(url, body kind for `with_json`, the field the error names) per free-form field:
    session metadata and hints, message metadata, controls.hints, external_actor.metadata."""
    messages = f"/v1/sessions/{sid}/messages"
    return [
        ("/v1/sessions", "session.metadata", "metadata"),
        ("/v1/sessions", "session.hints", "hints"),
        (messages, "message.metadata", "metadata"),
        (messages, "message.hints", "controls.hints"),
        (messages, "message.actor", "external_actor.metadata"),
    ]


def with_json(kind: str, value: Any) -> dict[str, Any]:
    if kind == "session.metadata":
        return {"title": "json", "metadata": value}
    if kind == "session.hints":
        return {"title": "json", "hints": value}
    if kind == "message.metadata":
        return text_body(metadata=value)
    if kind == "message.hints":
        return text_body(controls={"hints": value})
    assert kind == "message.actor"
    return text_body(
        external_actor={"actor_id": "u1", "source": "test", "metadata": value}
    )


async def test_json_nested_too_deep_is_422(limited: Limited) -> None:
    for url, kind, label in json_field_cases(limited.sid):
        for value in (
            nested(MAX_DEPTH + 2),
            nested(50),
            {"list": [[[[[[["deep"]]]]]]]},
        ):
            response = await limited.unchanged("POST", url, json=with_json(kind, value))
            problem = assert_refused(response, 422, "validation_error")
            assert problem["detail"].startswith(f"{label}:"), problem
            assert "deeper" in problem["detail"]


async def test_json_too_large_is_422(limited: Limited) -> None:
    for url, kind, label in json_field_cases(limited.sid):
        for value in (sized(MAX_JSON + 1), sized(MAX_BODY // 2)):
            response = await limited.unchanged("POST", url, json=with_json(kind, value))
            problem = assert_refused(response, 422, "validation_error")
            assert problem["detail"].startswith(f"{label}:"), problem
            assert str(MAX_JSON) in problem["detail"]


async def test_json_integer_beyond_64_bits_is_422(limited: Limited) -> None:
    """The stored JSON is encoded with orjson, which holds 64-bit integers only: a
    larger one is refused up front by the validation layer, naming where it is, not a
    500 when it is stored."""
    for url, kind, label in json_field_cases(limited.sid):
        value = {"n": [1, -(2**70)]}
        response = await limited.unchanged("POST", url, json=with_json(kind, value))
        problem = assert_refused(response, 422, "validation_error")
        assert problem["detail"] == (
            f"{label}.n.1: must be a number from {-(2**63)} to {2**63 - 1}"
        ), problem


async def test_json_at_size_limit_is_accepted(limited: Limited) -> None:
    for url, kind, _ in json_field_cases(limited.sid):
        response = await limited.client.post(url, json=with_json(kind, sized(MAX_JSON)))
        assert response.status_code == 201, (kind, response.text)


async def test_json_nested_exactly_at_depth_limit_is_accepted(limited: Limited) -> None:
    """`max_json_depth` levels of containers are allowed whatever the innermost value
    is: {"k1": {"k2": {"k3": {"k4": "leaf"}}}} nests four objects, exactly as
    {"k1": {"k2": {"k3": {}}}} does. A scalar is not a level of nesting."""
    for url, kind, _ in json_field_cases(limited.sid):
        for value in (
            nested_empty(MAX_DEPTH),  # four objects, the innermost empty
            nested(MAX_DEPTH),  # four objects, a string innermost
            {"a": [[["leaf"]]]},  # an object and three lists
            {"flat": 1},  # one object: the most common metadata
        ):
            response = await limited.client.post(url, json=with_json(kind, value))
            assert response.status_code == 201, (kind, value, response.text)


async def test_too_many_tags_is_422(limited: Limited) -> None:
    for method, url, body in (
        ("POST", "/v1/sessions", {}),
        ("PATCH", f"/v1/sessions/{limited.sid}", {}),
        ("POST", f"/v1/sessions/{limited.sid}/messages", text_body()),
    ):
        for tags, where in ((["t"] * 101, "tags:"), (["ok", "x" * 201], "tags.1:")):
            response = await limited.unchanged(method, url, json={**body, "tags": tags})
            problem = assert_refused(response, 422, "validation_error")
            assert problem["detail"].startswith(where), problem


# ---- 400: query values out of range ----------------------------------------------------


def bad_queries(sid: str) -> list[tuple[str, dict[str, Any], dict[str, str], str]]:
    """(path, query, headers, the parameter the error must name)."""
    messages = f"/v1/sessions/{sid}/messages"
    events = f"/v1/sessions/{sid}/events"
    return [
        ("/v1/sessions", {"limit": 0}, {}, "limit"),
        ("/v1/sessions", {"limit": -1}, {}, "limit"),
        ("/v1/sessions", {"limit": 101}, {}, "limit"),
        ("/v1/sessions", {"limit": "ten"}, {}, "limit"),
        ("/v1/sessions", {"offset": -1}, {}, "offset"),
        ("/v1/sessions", {"offset": "x"}, {}, "offset"),
        (messages, {"limit": 0}, {}, "limit"),
        (messages, {"limit": -5}, {}, "limit"),
        (messages, {"limit": "many"}, {}, "limit"),
        (messages, {"before_sequence": 0}, {}, "before_sequence"),
        (messages, {"before_sequence": -1}, {}, "before_sequence"),
        (events, {"limit": 0}, {}, "limit"),
        (events, {"limit": 1001}, {}, "limit"),
        (events, {"after_sequence": -1}, {}, "after_sequence"),
        (events, {"before_sequence": 0}, {}, "before_sequence"),
        (events, {"before_sequence": -3}, {}, "before_sequence"),
        (f"/v1/sessions/{sid}/sse", {"after_sequence": -1}, {}, "after_sequence"),
        (f"/v1/sessions/{sid}/messages/stream", {"after": "-1"}, {}, "after"),
        (f"/v1/sessions/{sid}/messages/stream", {"after": "soon"}, {}, "after"),
        (f"/v1/sessions/{sid}/messages/stream", {}, {"Last-Event-ID": "-1"}, "cursor"),
    ]


async def test_query_values_out_of_range_are_400(limited: Limited) -> None:
    for path, params, headers, name in bad_queries(limited.sid):
        for prefix_path in (path, path.replace("/v1/", "/api/v1/", 1)):
            response = await limited.unchanged(
                "GET", prefix_path, params=params, headers=headers
            )
            problem = assert_refused(response, 400)
            assert name in problem["detail"], (path, params, problem)


async def test_query_values_at_the_edges_are_accepted(limited: Limited) -> None:
    sid = limited.sid
    client = limited.client
    for path, params in [
        ("/v1/sessions", {"limit": 1, "offset": 0}),
        ("/v1/sessions", {"limit": 100, "offset": 1000}),
        (f"/v1/sessions/{sid}/messages", {"limit": 1, "before_sequence": 1}),
        (f"/v1/sessions/{sid}/messages", {"limit": 100_000}),
        (f"/v1/sessions/{sid}/events", {"limit": 1, "after_sequence": 0}),
        (f"/v1/sessions/{sid}/events", {"limit": 1000, "before_sequence": 1}),
    ]:
        response = await client.get(path, params=params)
        assert response.status_code == 200, (path, params, response.text)
    capped = await client.get(f"/v1/sessions/{sid}/messages", params={"limit": 100_000})
    assert len(capped.json()["data"]) <= 200


# ---- 429: rate limits --------------------------------------------------------------------


@dataclass
class RateLimited:
    app: Any
    database: Database
    key_1: str
    key_2: str

    def client(self, address: str = "127.0.0.1") -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.app, client=(address, 50000))
        return httpx.AsyncClient(transport=transport, base_url="http://test")


# A token every five seconds: a test's requests after the burst are refused however
# slowly a loaded machine runs them (at one a second, four requests that took over a
# second got a token back).
RATE_PER_SECOND = 0.2


@asynccontextmanager
async def rate_limited_app(
    settings: Settings, *, with_keys: bool, rate: float = RATE_PER_SECOND
) -> AsyncIterator[RateLimited]:
    app = create_app(
        make_settings(
            settings.database_url,
            rate_limit_per_second=rate,
            rate_limit_burst=3,
        )
    )
    async with app.router.lifespan_context(app):
        database: Database = app.state.app.database
        key_1 = key_2 = ""
        if with_keys:
            async with database.write() as db:
                _, key_1 = await create_key(db, organization_id=ORG_1)
                _, key_2 = await create_key(db, organization_id=ORG_2)
        yield RateLimited(app, database, key_1, key_2)


@pytest.fixture
async def keyed(settings: Settings) -> AsyncIterator[RateLimited]:
    async with rate_limited_app(settings, with_keys=True) as value:
        yield value


@pytest.fixture
async def open_mode(settings: Settings) -> AsyncIterator[RateLimited]:
    # No token comes back within the test (a loaded machine once took the 5 s one
    # token takes at RATE_PER_SECOND between its third and fourth request).
    async with rate_limited_app(settings, with_keys=False, rate=0.001) as value:
        yield value


def assert_rate_limited(response: httpx.Response) -> int:
    retry_after = assert_too_many(response, code="rate_limited")
    problem = assert_refused(response, 429, "rate_limited")
    assert problem.get("retry_after_seconds") == retry_after
    return retry_after


async def test_rate_limit_per_key(keyed: RateLimited) -> None:
    one = auth(keyed.key_1)
    two = auth(keyed.key_2)
    before = await table_rows(keyed.database)
    async with keyed.client() as client:
        for _ in range(3):
            response = await client.get("/v1/sessions", headers=one)
            assert response.status_code == 200, response.text
        retry_after = assert_rate_limited(await client.get("/v1/sessions", headers=one))
        assert retry_after <= 1 / RATE_PER_SECOND  # the wait for one token
        # A refused write writes nothing.
        response = await client.post("/v1/sessions", json={"title": "x"}, headers=one)
        assert_rate_limited(response)
        assert await table_rows(keyed.database) == before
        # Another key, from the same address, has its own bucket.
        for _ in range(3):
            response = await client.get("/v1/sessions", headers=two)
            assert response.status_code == 200, response.text
        # /health is never limited.
        for _ in range(5):
            assert (await client.get("/health", headers=one)).status_code == 200
        # The bucket refills at the configured rate.
        await asyncio.sleep(retry_after + 0.1)
        response = await client.get("/v1/sessions", headers=one)
        assert response.status_code == 200, response.text


async def test_rate_limit_is_per_key_however_the_key_is_spelled(
    keyed: RateLimited,
) -> None:
    """The SDKs send the key bare or as a Bearer token; either way it is the same key
    and the same bucket, so re-spelling the header buys no extra requests."""
    spellings = [
        f"Bearer {keyed.key_1}",
        keyed.key_1,
        f"bearer {keyed.key_1}",
        f"Bearer  {keyed.key_1} ",
    ]
    async with keyed.client() as client:
        statuses = []
        for authorization in spellings:
            response = await client.get(
                "/v1/sessions", headers={"Authorization": authorization}
            )
            statuses.append(response.status_code)
        assert statuses == [200, 200, 200, 429], statuses


async def test_rate_limit_per_client_address_in_open_mode(
    open_mode: RateLimited,
) -> None:
    async with (
        open_mode.client("10.0.0.1") as first,
        open_mode.client("10.0.0.2") as second,
    ):
        for _ in range(3):
            response = await first.get("/v1/sessions")
            assert response.status_code == 200, response.text
        before = await table_rows(open_mode.database)
        assert_rate_limited(await first.get("/v1/sessions"))
        assert_rate_limited(await first.post("/v1/sessions", json={"title": "x"}))
        assert await table_rows(open_mode.database) == before
        for _ in range(3):
            response = await second.get("/v1/sessions")
            assert response.status_code == 200, response.text
        assert_rate_limited(await second.get("/v1/sessions"))


async def test_a_string_too_long_is_named_in_characters(limited: Limited) -> None:
    """A capped string field says how many characters it may have (it said "items")."""
    checks = [
        ("/v1/sessions", {"title": "t" * 1_001}, "at most 1000 characters"),
        ("/v1/sessions", {"tags": ["t" * 201]}, "at most 200 characters"),
    ]
    for url, body, expected in checks:
        response = await limited.client.post(url, json=body)
        problem = assert_problem(response, 422, code="validation_error")
        assert expected in response.text, problem
        assert "items" not in response.text, problem
