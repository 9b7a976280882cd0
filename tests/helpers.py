"""What the test modules share besides the SSE client (tests/sse_client.py): the session
API as plain calls, waits with a deadline, problem+json checks, database snapshots, the
app in process, the CLI, and server processes (one per test, or one per lane shared by
the tests of a module)."""

import asyncio
import functools
import inspect
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.db import models
from app.db.session import Database
from app.ids import DEFAULT_ORG_ID
from app.live.items import TextDelta
from app.sessions import schemas as session_schemas, service as sessions_service
from tests.conftest import (
    LANES,
    ROOT,
    Server,
    start_server,
    truncate,
)

PROBLEM_JSON = "application/problem+json"
ERROR_TYPE_BASE = "https://docs.everruns.com/errors/"
KEY_PATTERN = re.compile(r"evm_[0-9a-f]{64}")

# The durable events of a plain turn, and of one that calls a tool, in upstream's order.
TURN_EVENTS = [
    "input.message",
    "session.activated",
    "turn.started",
    "output.message.started",
    "output.message.completed",
    "turn.completed",
    "session.idled",
]
TOOL_TURN_EVENTS = [
    *TURN_EVENTS[:5],
    "tool.started",
    "tool.completed",
    *TURN_EVENTS[4:],
]


# ---- bodies, headers and ids ----------------------------------------------------------

# Text whose length in UTF-16 code units (the unit of stream offsets, JavaScript's
# `String.length`) differs from its code point count in every way a browser meets: an
# emoji (one astral code point, two units), a ZWJ family (seven code points, eleven
# units, one glyph), a flag (two regional indicators), a combining mark (two code
# points, one glyph, no astral), CJK (one unit each), an emoji with a variation
# selector, and mathematical letters (astral). The scripted model echoes it word by
# word, one delta a word.
ASTRAL_TEXT = (
    "hi \U0001f600 then \U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family "
    "\U0001f1fa\U0001f1e6 flag e\u0301 combining \u6f22\u5b57 CJK \u2764\ufe0f heart "
    "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522 done"
)


def utf16_units(text: str) -> int:
    """What JavaScript's `String.length` is for `text` (measured independently of the
    server's own helper)."""
    return len(text.encode("utf-16-le")) // 2


def text_body(text: str = "hello", **extra: Any) -> dict[str, Any]:
    """A message request body with one text part; `extra` are top-level fields."""
    return {"message": {"content": [{"type": "text", "text": text}]}, **extra}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def uuid_of(wire_id: str) -> uuid.UUID:
    """The UUID of a prefixed wire id (`session_<32 hex>`, `event_<32 hex>`, ...)."""
    return uuid.UUID(hex=wire_id.partition("_")[2])


def text_of(message: dict[str, Any]) -> str:
    """The text parts of a message, joined."""
    return "".join(p.get("text", "") for p in message["content"] if p["type"] == "text")


# ---- waiting --------------------------------------------------------------------------


async def wait_until(
    check: Callable[[], bool | Awaitable[bool]],
    what: str,
    within: float = 15.0,
    interval: float = 0.05,
) -> None:
    """Poll `check` (plain or async) until it holds; AssertionError after `within` s."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(interval)


# ---- the session API ------------------------------------------------------------------


async def create_session(
    client: httpx.AsyncClient,
    title: str = "test",
    *,
    headers: dict[str, str] | None = None,
) -> str:
    response = await client.post("/v1/sessions", json={"title": title}, headers=headers)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


async def get_session(
    client: httpx.AsyncClient,
    session_id: str,
    *,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    response = await client.get(f"/v1/sessions/{session_id}", headers=headers)
    assert response.status_code == 200, response.text
    session: dict[str, Any] = response.json()
    return session


async def post_message(
    client: httpx.AsyncClient,
    session_id: str,
    text: str,
    *,
    headers: dict[str, str] | None = None,
    **message: Any,
) -> dict[str, Any]:
    """POST a text message (`message` adds fields to it, e.g. `visibility`); the 201
    body."""
    response = await client.post(
        f"/v1/sessions/{session_id}/messages",
        json={"message": {"content": [{"type": "text", "text": text}], **message}},
        headers=headers,
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def list_messages(
    client: httpx.AsyncClient, session_id: str, **params: Any
) -> dict[str, Any]:
    """The messages page (up to 200 messages unless `params` say otherwise)."""
    response = await client.get(
        f"/v1/sessions/{session_id}/messages", params={"limit": 200, **params}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def all_messages(
    client: httpx.AsyncClient, session_id: str, **params: Any
) -> list[dict[str, Any]]:
    """Every message, oldest first, walking back page by page (a page also ends early
    at MAX_LIST_BYTES)."""
    messages: list[dict[str, Any]] = []
    while True:
        page = await list_messages(client, session_id, **params)
        messages[:0] = page["data"]
        if not page["has_more"]:
            return messages
        params = {**params, "before_sequence": page["next_before_sequence"]}


async def list_events(
    client: httpx.AsyncClient, session_id: str
) -> list[dict[str, Any]]:
    """Every durable event, oldest first, following the cursor of a list that
    MAX_LIST_BYTES ended early."""
    events: list[dict[str, Any]] = []
    params: dict[str, Any] = {}
    while True:
        response = await client.get(f"/v1/sessions/{session_id}/events", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        events.extend(body["data"])
        if not body.get("has_more"):
            return events
        params = {"after_sequence": body["next_after_sequence"]}


async def wait_idle(
    client: httpx.AsyncClient,
    session_id: str,
    within: float = 20.0,
    *,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Poll the session until no turn runs; returns the session."""
    deadline = time.monotonic() + within
    while True:
        session = await get_session(client, session_id, headers=headers)
        if session["status"] == "idle":
            return session
        assert time.monotonic() < deadline, (
            f"session {session_id} still {session['status']} after {within}s"
        )
        await asyncio.sleep(0.05)


# ---- problem+json ---------------------------------------------------------------------


def find_nulls(value: Any, path: str = "$") -> list[str]:
    """The JSON paths of every null in `value`."""
    if value is None:
        return [path]
    if isinstance(value, dict):
        return [n for k, v in value.items() for n in find_nulls(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [n for i, v in enumerate(value) for n in find_nulls(v, f"{path}[{i}]")]
    return []


def assert_problem(
    response: httpx.Response,
    status: int,
    *,
    detail: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """The response is problem+json with `title`, `status`, `code`, `type` and the
    `error` extension member, no null fields, and the optional members consistent
    with each other."""
    context = f"{response.request.method} {response.request.url} -> {response.status_code} {response.text}"
    assert response.status_code == status, context
    media_type = response.headers["content-type"].split(";")[0].strip()
    assert media_type == PROBLEM_JSON, context
    body = response.json()
    assert isinstance(body, dict), context
    assert body["title"] == HTTPStatus(status).phrase, context
    assert body["status"] == status, context
    assert find_nulls(body) == [], context
    assert "Traceback" not in response.text, context
    if "detail" in body:
        assert isinstance(body["detail"], str) and body["detail"], context
    # Every problem has a code and its type, and the `error` member the SDKs read.
    assert re.fullmatch(r"[a-z][a-z0-9_]*", body["code"]), context
    assert body["type"] == ERROR_TYPE_BASE + body["code"], context
    assert body["error"] == {
        "code": body["code"],
        "message": body.get("detail", body["title"]),
    }, context
    if "instance" in body:
        assert body["instance"] == response.request.url.path, context
    if detail is not None:
        assert body.get("detail") == detail, context
    if code is not None:
        assert body.get("code") == code, context
    assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"]), context
    return body


def assert_too_many(
    response: httpx.Response, *, detail: str | None = None, code: str | None = None
) -> int:
    """A 429 problem with a positive whole number of seconds in Retry-After; returns
    them."""
    assert_problem(response, 429, detail=detail, code=code)
    retry_after = response.headers.get("retry-after")
    assert retry_after is not None and retry_after.isdigit(), response.headers
    assert int(retry_after) >= 1, response.headers
    return int(retry_after)


# ---- the database ---------------------------------------------------------------------

Rows = dict[str, list[tuple[Any, ...]]]


async def table_rows(database: Database) -> Rows:
    """Every row of every table, ordered: equal snapshots mean nothing was written."""
    out: Rows = {}
    async with database.read() as db:
        for model in (
            models.Session,
            models.Message,
            models.Event,
            models.ApiKey,
            models.ComposerSummary,
        ):
            table = model.__table__
            result = await db.execute(select(*table.columns).order_by(table.c.id))
            out[model.__tablename__] = [tuple(row) for row in result.all()]
    return out


# ---- the app in process ---------------------------------------------------------------


# ---- the CLI --------------------------------------------------------------------------


async def run_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m app <args>` on `database_url`, with its stdout and stderr."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def create_cli_key(database_url: str, org: str, name: str | None = None) -> str:
    """`keys create`: stdout is exactly the new key, which stderr never shows."""
    extra = ["--name", name] if name else []
    result = await run_cli(database_url, "keys", "create", "--org", org, *extra)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, f"stdout must hold exactly the key: {result.stdout!r}"
    key = lines[0]
    assert KEY_PATTERN.fullmatch(key), key
    assert key not in result.stderr
    return key


# ---- server processes -----------------------------------------------------------------


@asynccontextmanager
async def server_process(
    database_url: str, tmp_path: Path, *, kill: bool = False, **env: str
) -> AsyncIterator[Server]:
    """A real server (see `start_server`) for the block: stopped after it, or killed
    with `kill`."""
    server = await asyncio.to_thread(start_server, database_url, tmp_path, **env)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.kill if kill else server.stop)


async def start_own_server(database_url: str, tmp_path: Path, **env: str) -> Server:
    """`start_server` at info level, confirmed to be our process: its /health probe is
    answered by whatever holds the port, and a free port can be taken by another
    process (another test run on this machine) before our server binds it. Only our
    server logs that it bound the port; if it could not, start another."""
    env = {"LOG_LEVEL": "info", **env}
    for _ in range(3):
        server = await asyncio.to_thread(
            functools.partial(start_server, database_url, tmp_path, None, **env)
        )
        bound = f"Uvicorn running on {server.url}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and server.process.poll() is None:
            if bound in server.log.read_text(errors="replace"):
                return server
            await asyncio.sleep(0.05)
        await asyncio.to_thread(server.stop)
    raise AssertionError(f"no server of our own started: {server.log.read_text()}")


def lane_database_url(request: pytest.FixtureRequest, directory: Path) -> str:
    """A migrated database on the lane `request.param` ("sqlite" or "postgresql"), for
    a server shared by the tests of one module (each test uses sessions of its own)."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = directory / "live.db"
        shutil.copy(template, path)
        return f"sqlite+aiosqlite:///{path}"
    url: str = request.getfixturevalue("pg_database")
    # Start from an empty database: keys or sessions left by earlier modules would change
    # what this server answers (a key makes every request need one).
    asyncio.run(truncate(url))
    return url


def live_server_fixture(name: str, **env: str) -> Any:
    """A module's `live_server` fixture: one real server process per lane, shared by
    the module's tests (each uses sessions of its own). `env` configures the server.

        live_server = live_server_fixture("live-turn")
    """

    @pytest.fixture(scope="module", params=LANES)
    def live_server(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Server]:
        directory = tmp_path_factory.mktemp(name)
        server = start_server(lane_database_url(request, directory), directory, **env)
        yield server
        server.stop()

    return live_server


DEFAULT_ORG = "org_00000000000000000000000000000001"


@dataclass
class KeyedServer:
    """A server whose database holds one API key: every request needs it."""

    server: Server
    api_key: str

    @property
    def url(self) -> str:
        return self.server.url


def keyed_server_fixture(name: str, **env: str) -> Any:
    """A module's `keyed_server` fixture: like `live_server_fixture`, with an API key
    of the default organization created before the server starts (the client tests
    prove every call carries it).

        keyed_server = keyed_server_fixture("python-client", SSE_CYCLE_SECONDS="1")
    """
    from tests.scratch_db import create_key

    @pytest.fixture(scope="module", params=LANES)
    def keyed_server(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[KeyedServer]:
        directory = tmp_path_factory.mktemp(name)
        database_url = lane_database_url(request, directory)
        key = asyncio.run(create_key(database_url, DEFAULT_ORG))
        server = start_server(database_url, directory, **env)
        yield KeyedServer(server, key)
        server.stop()

    return keyed_server


def api_fixture() -> Any:
    """A module's `api` fixture (`api = api_fixture()`): an HTTP client of its
    `live_server`."""

    @pytest.fixture
    async def api(live_server: Server) -> AsyncIterator[httpx.AsyncClient]:
        async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as client:
            yield client

    return api


def frame_names(chunk: bytes) -> list[str]:
    """The event names of the SSE frames in one chunk a stream wrote (a chunk holds
    every frame that was queued when it was written)."""
    return [
        frame.split(b"\n", 1)[0].decode().removeprefix("event: ")
        for frame in chunk.split(b"\n\n")
        if frame.startswith(b"event: ")
    ]


def text_delta(
    session_id: uuid.UUID,
    message_id: uuid.UUID,
    offset: int,
    text: str,
    part_id: str = "agent-text:1",
) -> TextDelta:
    """A live text delta of revision 1, as a runner publishes it."""
    return TextDelta(
        session_id,
        message_id,
        1,
        None,
        part_id,
        offset,
        text,
        "output.message.delta",
        f"event_{uuid.uuid4().hex}",
        "2026-01-01T00:00:00.000Z",
    )


async def new_session_row(handle: Database) -> uuid.UUID:
    """A session of the default organization, created through `handle` directly."""
    async with handle.write() as db:
        session = await sessions_service.create_session(
            db, organization_id=DEFAULT_ORG_ID, data=session_schemas.SessionCreate()
        )
    return session.id
