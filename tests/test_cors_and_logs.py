"""CORS: only the configured browser origins may call the API and open both streams, and
they can read the headers clients need. Logs: a real server's log never holds an API key
or message text at the default level, and errors it logs carry the request id."""

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.auth import create_key
from app.settings import Settings
from tests.support.api import auth, create_session, post_message
from tests.support.cli import create_cli_key, run_cli
from tests.support.in_process import Running, running_app
from tests.support.lanes import make_settings
from tests.support.servers import start_own_server
from tests.support.sse import Frame, open_stream
from tests.support.waits import wait_idle

ORIGIN = "https://app.example"
DISALLOWED = [
    "https://evil.example",
    "http://app.example",  # same host, other scheme
    "https://app.example.evil.example",
    "https://app.example:8443",
    "null",
]
EXPOSED = {"etag", "x-total-count", "location", "x-request-id", "retry-after"}
REQUEST_ID = re.compile(r"[0-9a-f]{32}")


def header_set(response: httpx.Response, name: str) -> set[str]:
    """A comma-separated header as a set of lowercase tokens."""
    value = response.headers.get(name, "")
    return {token.strip().lower() for token in value.split(",") if token.strip()}


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {
        name: value
        for name, value in response.headers.items()
        if name.lower().startswith("access-control-")
    }


def cors_app(
    settings: Settings, **overrides: Any
) -> AbstractAsyncContextManager[Running]:
    """The app in process with CORS allowed for ORIGIN only, in open mode."""
    return running_app(
        make_settings(settings.database_url, cors_origins=[ORIGIN], **overrides)
    )


@pytest.fixture
async def cors_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with cors_app(settings) as running:
        yield running.client


def preflight_headers(origin: str, method: str, request_headers: str) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": request_headers,
    }


# ---- CORS, in process ----------------------------------------------------------------


async def test_preflight_from_allowed_origin_is_allowed(
    cors_client: httpx.AsyncClient,
) -> None:
    sid = await create_session(cors_client, "cors")
    cases = [
        ("POST", f"/v1/sessions/{sid}/messages", "authorization, content-type"),
        ("POST", f"/api/v1/sessions/{sid}/messages", "Authorization,Content-Type"),
        ("PATCH", f"/v1/sessions/{sid}", "authorization, content-type, x-org-id"),
        ("DELETE", f"/v1/sessions/{sid}", "authorization"),
        ("POST", f"/v1/sessions/{sid}/cancel", "authorization"),
        ("GET", f"/v1/sessions/{sid}/sse", "authorization, last-event-id"),
        ("GET", f"/v1/sessions/{sid}/messages/stream", "authorization, last-event-id"),
        # A conditional page read, by a bearer token that names its organization.
        (
            "GET",
            f"/v1/sessions/{sid}/messages",
            "authorization, if-none-match, x-org-id",
        ),
        (
            "GET",
            f"/v1/sessions/{sid}/messages/stream",
            "Authorization,Content-Type,If-None-Match,Last-Event-ID,X-Org-Id",
        ),
    ]
    for method, url, requested in cases:
        response = await cors_client.options(
            url, headers=preflight_headers(ORIGIN, method, requested)
        )
        context = f"{method} {url}: {response.status_code} {response.headers}"
        assert response.status_code == 200, context
        assert response.headers["access-control-allow-origin"] == ORIGIN, context
        assert method.lower() in header_set(response, "access-control-allow-methods"), (
            context
        )
        allowed = header_set(response, "access-control-allow-headers")
        for name in requested.split(","):
            assert name.strip().lower() in allowed, context
        assert "origin" in header_set(response, "vary"), context
        assert int(response.headers["access-control-max-age"]) > 0, context


async def test_preflight_needs_no_key_and_is_not_rate_limited(
    settings: Settings,
) -> None:
    """Browsers send preflights without credentials: with keys configured and a tiny rate
    limit, every preflight is still answered."""
    async with cors_app(
        settings, rate_limit_per_second=1.0, rate_limit_burst=1
    ) as running:
        client = running.client
        async with running.app.state.app.database.write() as db:
            await create_key(db, organization_id=uuid.uuid4())
        sid = f"session_{uuid.uuid4().hex}"
        for _ in range(5):
            response = await client.options(
                f"/v1/sessions/{sid}/messages",
                headers=preflight_headers(
                    ORIGIN, "POST", "authorization, content-type"
                ),
            )
            assert response.status_code == 200, response.text
            assert response.headers["access-control-allow-origin"] == ORIGIN


async def test_simple_responses_expose_the_headers_clients_read(
    cors_client: httpx.AsyncClient,
) -> None:
    headers = {"Origin": ORIGIN}
    created = await cors_client.post(
        "/v1/sessions", json={"title": "exposed"}, headers=headers
    )
    assert created.status_code == 201, created.text
    assert created.headers["access-control-allow-origin"] == ORIGIN
    assert "location" in created.headers
    assert header_set(created, "access-control-expose-headers") >= EXPOSED
    sid = created.json()["id"]
    for url, params in [
        ("/v1/sessions", None),
        (f"/v1/sessions/{sid}", None),
        (f"/v1/sessions/{sid}/events", {"limit": 10}),
        (f"/api/v1/sessions/{sid}/messages", None),
    ]:
        response = await cors_client.get(url, params=params, headers=headers)
        assert response.status_code == 200, response.text
        assert response.headers["access-control-allow-origin"] == ORIGIN
        assert header_set(response, "access-control-expose-headers") >= EXPOSED
        assert "x-request-id" in response.headers
    events = await cors_client.get(
        f"/v1/sessions/{sid}/events", params={"limit": 10}, headers=headers
    )
    assert "x-total-count" in events.headers


async def test_a_cross_origin_page_revalidates_with_its_etag(
    cors_client: httpx.AsyncClient,
) -> None:
    """A browser page reads the messages page's ETag (exposed) and sends it back in
    If-None-Match (allowed by the preflight): the 304 carries the CORS headers too, or
    the browser would hide it from the page."""
    sid = await create_session(cors_client, "etag")
    url = f"/v1/sessions/{sid}/messages"
    first = await cors_client.get(url, headers={"Origin": ORIGIN})
    assert first.status_code == 200, first.text
    assert first.headers["access-control-allow-origin"] == ORIGIN
    assert "etag" in header_set(first, "access-control-expose-headers")
    etag = first.headers["etag"]
    preflight = await cors_client.options(
        url, headers=preflight_headers(ORIGIN, "GET", "if-none-match")
    )
    assert preflight.status_code == 200, preflight.text
    assert "if-none-match" in header_set(preflight, "access-control-allow-headers")
    again = await cors_client.get(
        url, headers={"Origin": ORIGIN, "If-None-Match": etag}
    )
    assert again.status_code == 304
    assert again.headers["etag"] == etag
    assert again.headers["access-control-allow-origin"] == ORIGIN
    assert "etag" in header_set(again, "access-control-expose-headers")


async def test_error_responses_carry_cors_headers(
    cors_client: httpx.AsyncClient,
) -> None:
    """A browser app must be able to read problem+json errors, including the ones the
    guards answer before routing."""
    headers = {"Origin": ORIGIN}
    ghost = f"session_{uuid.uuid4().hex}"
    responses = [
        await cors_client.get(f"/v1/sessions/{ghost}", headers=headers),
        await cors_client.get("/v1/sessions/sess_123", headers=headers),
        await cors_client.get("/v1/sessions", params={"limit": 0}, headers=headers),
        await cors_client.post(
            "/v1/sessions",
            content=b"title=x",
            headers={**headers, "Content-Type": "application/x-www-form-urlencoded"},
        ),
        await cors_client.post(
            "/v1/sessions",
            content=b"{}" + b" " * 2_000_000,
            headers={**headers, "Content-Type": "application/json"},
        ),
    ]
    assert [r.status_code for r in responses] == [404, 400, 400, 415, 413]
    for response in responses:
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.headers["access-control-allow-origin"] == ORIGIN
        assert "x-request-id" in header_set(response, "access-control-expose-headers")


async def test_rate_limited_responses_carry_cors_headers(settings: Settings) -> None:
    # A token every 20 s: the second request is refused however slowly it follows.
    async with cors_app(
        settings, rate_limit_per_second=0.05, rate_limit_burst=1
    ) as running:
        client = running.client
        first = await client.get("/v1/sessions", headers={"Origin": ORIGIN})
        assert first.status_code == 200, first.text
        limited = await client.get("/v1/sessions", headers={"Origin": ORIGIN})
        assert limited.status_code == 429, limited.text
        assert limited.headers["access-control-allow-origin"] == ORIGIN
        assert "retry-after" in limited.headers
        assert "retry-after" in header_set(limited, "access-control-expose-headers")


async def test_disallowed_origins_get_no_cors_headers(
    cors_client: httpx.AsyncClient,
) -> None:
    sid = await create_session(cors_client, "cors")
    for origin in DISALLOWED:
        response = await cors_client.get("/v1/sessions", headers={"Origin": origin})
        assert response.status_code == 200, response.text
        assert "access-control-allow-origin" not in response.headers, origin
        # (Starlette adds Access-Control-Expose-Headers to every simple response; without
        # Access-Control-Allow-Origin a browser exposes nothing, so that is harmless.)
        assert "access-control-allow-credentials" not in response.headers, origin
        preflight = await cors_client.options(
            f"/v1/sessions/{sid}/messages",
            headers=preflight_headers(origin, "POST", "authorization, content-type"),
        )
        assert preflight.status_code >= 400, (origin, preflight.status_code)
        assert "access-control-allow-origin" not in preflight.headers, origin
    # A method or header outside the allowlist is refused for the allowed origin, too.
    for method, requested in [("PUT", "content-type"), ("POST", "x-custom-secret")]:
        preflight = await cors_client.options(
            f"/v1/sessions/{sid}/messages",
            headers=preflight_headers(ORIGIN, method, requested),
        )
        assert preflight.status_code == 400, (method, requested, preflight.text)


async def test_default_settings_send_no_cors_headers(running: Running) -> None:
    assert running.app.state.app.settings.cors_origins == []
    client = running.client
    sid = await create_session(client, "cors")
    responses = [
        await client.get("/v1/sessions", headers={"Origin": ORIGIN}),
        await client.post(
            "/v1/sessions", json={"title": "x"}, headers={"Origin": ORIGIN}
        ),
        await client.get(f"/v1/sessions/{sid}/events", headers={"Origin": ORIGIN}),
        await client.get(
            f"/v1/sessions/session_{uuid.uuid4().hex}", headers={"Origin": ORIGIN}
        ),
        await client.options(
            f"/v1/sessions/{sid}/messages",
            headers=preflight_headers(ORIGIN, "POST", "authorization, content-type"),
        ),
    ]
    assert [r.status_code for r in responses[:4]] == [200, 201, 200, 404]
    assert responses[4].status_code != 200
    for response in responses:
        assert cors_headers(response) == {}, (response.request.url, response.headers)


# ---- CORS on both streams, through a real server -----------------------------------------


async def stream_first_frame(
    client: httpx.AsyncClient, url: str, origin: str, params: dict[str, Any]
) -> tuple[httpx.Response, Frame]:
    """Open a stream, read its first event within 10 s, and close it."""
    async with open_stream(
        client, url, params=params, headers={"Origin": origin}
    ) as stream:
        assert stream.status_code == 200, stream.response.text
        frame = await stream.next(10)
        # The Mutation stream opens with a `retry:` block, which is no event.
        while frame is not None and frame.is_comment:
            frame = await stream.next(10)
    assert frame is not None, "the stream ended before its first frame"
    return stream.response, frame


async def test_both_streams_answer_the_allowed_origin(
    settings: Settings, tmp_path: Path
) -> None:
    server = await start_own_server(
        settings.database_url, tmp_path, CORS_ORIGINS=ORIGIN
    )
    try:
        async with httpx.AsyncClient(
            base_url=server.url, timeout=httpx.Timeout(10, read=None)
        ) as client:
            sid = await create_session(client, "cors")
            await post_message(client, sid, "hi")
            await wait_idle(client, sid)
            streams: list[tuple[str, dict[str, Any], str]] = [
                (f"/v1/sessions/{sid}/sse", {}, "connected"),
                (f"/api/v1/sessions/{sid}/sse", {"after_sequence": 0}, "connected"),
                (f"/v1/sessions/{sid}/messages/stream", {"after": "0"}, "message"),
                (f"/api/v1/sessions/{sid}/messages/stream", {"after": "0"}, "message"),
            ]
            for url, params, first_event in streams:
                response, frame = await stream_first_frame(client, url, ORIGIN, params)
                assert response.headers["content-type"].startswith("text/event-stream")
                assert response.headers["access-control-allow-origin"] == ORIGIN, url
                assert "x-request-id" in header_set(
                    response, "access-control-expose-headers"
                )
                assert frame.event == first_event, (url, frame)
            for url, params, _ in streams[:1] + streams[2:3]:
                response, _ = await stream_first_frame(
                    client, url, "https://evil.example", params
                )
                assert "access-control-allow-origin" not in response.headers, url
    finally:
        await asyncio.to_thread(server.stop)
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log, log


# ---- logs ------------------------------------------------------------------------------


async def test_cli_shows_a_key_once_and_never_lists_it(settings: Settings) -> None:
    url = settings.database_url
    key = await create_cli_key(url, f"org_{uuid.uuid4().hex}", "logs")
    listed = await run_cli(url, "keys", "list")
    assert listed.returncode == 0, listed.stderr
    assert key[:12] in listed.stdout
    assert key not in listed.stdout + listed.stderr
    assert key[12:] not in listed.stdout + listed.stderr
    revoked = await run_cli(url, "keys", "revoke", key)
    assert revoked.returncode == 0, revoked.stderr
    assert key not in revoked.stdout + revoked.stderr
    listed = await run_cli(url, "keys", "list")
    assert "revoked" in listed.stdout
    assert key not in listed.stdout + listed.stderr


async def test_server_log_holds_no_keys_or_message_text(
    settings: Settings, tmp_path: Path
) -> None:
    url = settings.database_url
    org = f"org_{uuid.uuid4().hex}"
    key = await create_cli_key(url, org, "logs")
    revoked = await create_cli_key(url, org, "logs")
    result = await run_cli(url, "keys", "revoke", revoked)
    assert result.returncode == 0, result.stderr
    wrong = "evm_" + uuid.uuid4().hex + uuid.uuid4().hex
    secret_text = f"secret-message-text-{uuid.uuid4().hex}"
    secret_title = f"secret-title-{uuid.uuid4().hex}"
    default_level = Settings.model_fields["log_level"].default
    assert default_level == "info"
    server = await start_own_server(url, tmp_path, LOG_LEVEL=default_level)
    bearer = auth(key)
    bare = {"Authorization": key}
    results: list[tuple[str, int, str]] = []  # (label, status, request id)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:

            async def record(label: str, response: httpx.Response) -> httpx.Response:
                results.append(
                    (
                        label,
                        response.status_code,
                        response.headers.get("x-request-id", ""),
                    )
                )
                return response

            created = await record(
                "create",
                await client.post(
                    "/v1/sessions", json={"title": secret_title}, headers=bearer
                ),
            )
            sid = (
                created.json()["id"]
                if created.status_code == 201
                else f"session_{uuid.uuid4().hex}"
            )
            posted = await record(
                "post",
                await client.post(
                    f"/v1/sessions/{sid}/messages",
                    json={
                        "message": {"content": [{"type": "text", "text": secret_text}]}
                    },
                    headers=bare,
                ),
            )
            if posted.status_code == 201:
                await wait_idle(client, sid, headers=bearer)
            await record(
                "list",
                await client.get(f"/v1/sessions/{sid}/messages", headers=bearer),
            )
            await record(
                "events", await client.get(f"/v1/sessions/{sid}/events", headers=bare)
            )
            # Errors, none of them a 500.
            await record(
                "unknown session",
                await client.get(
                    f"/v1/sessions/session_{uuid.uuid4().hex}", headers=bearer
                ),
            )
            await record(
                "malformed id", await client.get("/v1/sessions/sess_1", headers=bearer)
            )
            await record(
                "invalid body",
                await client.post(
                    f"/v1/sessions/{sid}/messages",
                    json={
                        "message": {
                            "content": [
                                {"type": "text", "text": secret_text},
                                {"type": "hologram", "text": secret_text},
                            ]
                        }
                    },
                    headers=bearer,
                ),
            )
            await record(
                "refused role",
                await client.post(
                    f"/v1/sessions/{sid}/messages",
                    json={
                        "message": {
                            "role": "agent",
                            "content": [{"type": "text", "text": secret_text}],
                        }
                    },
                    headers=bearer,
                ),
            )
            await record(
                "malformed json",
                await client.post(
                    f"/v1/sessions/{sid}/messages",
                    content=f'{{"message": "{secret_text}'.encode(),
                    headers={**bearer, "Content-Type": "application/json"},
                ),
            )
            await record(
                "wrong key",
                await client.get("/v1/sessions", headers=auth(wrong)),
            )
            await record(
                "revoked key",
                await client.get("/v1/sessions", headers={"Authorization": revoked}),
            )
            await record("no key", await client.get("/v1/sessions"))
    finally:
        await asyncio.to_thread(server.stop)
    log = server.log.read_text(errors="replace")
    # No terminal and no LOG_FORMAT: one JSON object a line (tests/test_logs.py).
    records = [json.loads(line) for line in log.splitlines()]
    our_request_ids = {request_id for _, _, request_id in results}
    # The log is the server's, at info level: it has the access log of our requests.
    assert any(
        r["logger"] == "uvicorn.access"
        and r["method"] == "GET"
        and r["path"] == "/v1/sessions"
        and r["request_id"] in our_request_ids
        for r in records
    ), log
    # No key, in any form, and no part of the secret half of one.
    for credential in (key, revoked, wrong):
        assert credential not in log, "an API key reached the log"
        assert credential[12:] not in log, (
            "the secret part of an API key reached the log"
        )
    # No message text (nor the session title) at the default level.
    assert secret_text not in log, "message text reached the log"
    assert secret_title not in log, "a session title reached the log"
    # Every error the app logged names the request id the client got back.
    for entry in records:
        if entry["logger"] == "app.errors":
            assert entry.get("request_id") in our_request_ids, (
                f"logged error without our request id: {entry}"
            )
    # And the requests did what they should: none of them was a 500.
    statuses = {label: status for label, status, _ in results}
    # Upstream refuses a non-user role with 400; a schema check would say 422.
    assert statuses.pop("refused role") in (400, 422), results
    assert statuses == {
        "create": 201,
        "post": 201,
        "list": 200,
        "events": 200,
        "unknown session": 404,
        "malformed id": 400,
        "invalid body": 422,
        "malformed json": 400,
        "wrong key": 401,
        "revoked key": 401,
        "no key": 401,
    }, statuses
    assert all(REQUEST_ID.fullmatch(request_id) for request_id in our_request_ids)
