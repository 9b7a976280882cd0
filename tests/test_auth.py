"""API keys end to end: the `keys` CLI stores only hashes, requests need a key once one
exists, each key sees only its organization, revocation stops a key, and `serve` refuses a
public address while the service would be open."""

import asyncio
import hashlib
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, text

from app.db import models
from app.settings import Settings
from tests.support.api import auth, post_message
from tests.support.cli import KEY_PATTERN, create_cli_key, run_cli
from tests.support.database import Rows, table_rows
from tests.support.in_process import running_app
from tests.support.lanes import ROOT, make_settings
from tests.support.problems import assert_problem
from tests.support.servers import free_port
from tests.support.sse import expect_connected, open_stream
from tests.support.waits import wait_idle, wait_until

ORG_A = "org_" + "a1" * 16
ORG_B = "org_" + "b2" * 16


# ---- the CLI -------------------------------------------------------------------------


async def key_ids(database_url: str) -> dict[str, str]:
    """`keys list`: key id -> the rest of its line."""
    result = await run_cli(database_url, "keys", "list")
    assert result.returncode == 0, result.stderr
    return dict(line.split("\t", 1) for line in result.stdout.splitlines())


# ---- an in-process app that re-checks keys on every request --------------------------


@dataclass
class Service:
    app: Any
    client: httpx.AsyncClient
    database_url: str

    async def request(
        self, method: str, url: str, key: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}))
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        return await self.client.request(method, url, headers=headers, **kwargs)

    async def new_session(self, key: str, title: str) -> dict[str, Any]:
        response = await self.request(
            "POST", "/v1/sessions", key, json={"title": title}
        )
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body

    async def finish_turn(self, key: str, sid: str) -> str:
        """Post a message with `key` and wait for its turn to end; the message id."""
        posted = await post_message(self.client, sid, "hello", headers=auth(key))
        await wait_idle(self.client, sid, headers=auth(key))
        message_id: str = posted["id"]
        return message_id

    async def rows(self) -> Rows:
        return await table_rows(self.app.state.app.database)


@pytest.fixture
async def service(settings: Settings) -> AsyncIterator[Service]:
    fresh = make_settings(settings.database_url, auth_cache_seconds=0.0)
    async with running_app(fresh) as running:
        yield Service(running.app, running.client, settings.database_url)


# ---- keys create / list --------------------------------------------------------------


async def test_keys_create_prints_the_key_once_and_stores_only_its_hash(
    service: Service,
) -> None:
    result = await run_cli(
        service.database_url, "keys", "create", "--org", ORG_A, "--name", "ci"
    )
    assert result.returncode == 0, result.stderr
    key = result.stdout.strip()
    assert result.stdout == key + "\n"
    assert KEY_PATTERN.fullmatch(key)
    assert key not in result.stderr
    assert re.search(r"key_[0-9a-f]{32}", result.stderr)
    second = await create_cli_key(service.database_url, ORG_A)
    assert second != key

    database = service.app.state.app.database
    async with database.read() as db:
        rows = [
            dict(row)
            for row in (await db.execute(text("SELECT * FROM api_keys"))).mappings()
        ]
        # Plain rows, not ORM objects: the read unit of work expires what it loaded.
        stored = {
            row.key_hash: row
            for row in await db.execute(
                select(
                    models.ApiKey.key_hash,
                    models.ApiKey.organization_id,
                    models.ApiKey.name,
                    models.ApiKey.prefix,
                    models.ApiKey.revoked_at,
                )
            )
        }
    assert len(rows) == 2
    for row in rows:
        for column, value in row.items():
            for plain in (key, second):
                assert plain not in str(value), f"api_keys.{column} holds a key"
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert digest in stored, "the stored hash is not SHA-256 of the key"
    assert hashlib.sha256(second.encode()).hexdigest() in stored
    row = stored[digest]
    assert row.organization_id == uuid.UUID(hex=ORG_A.removeprefix("org_"))
    assert row.name == "ci"
    assert row.revoked_at is None
    assert key.startswith(row.prefix)
    assert len(row.prefix) < len(key) // 4


async def test_keys_create_rejects_a_malformed_org(service: Service) -> None:
    for org in ("org_123", "organization_" + "a" * 32, f"org_{'A' * 32}"):
        result = await run_cli(service.database_url, "keys", "create", "--org", org)
        assert result.returncode != 0
        assert "Invalid organization ID" in result.stderr
        assert result.stdout == ""
    async with service.app.state.app.database.read() as db:
        assert await db.scalar(select(func.count()).select_from(models.ApiKey)) == 0


async def test_keys_list_never_prints_a_key(service: Service) -> None:
    keys = [
        await create_cli_key(service.database_url, ORG_A, "alpha"),
        await create_cli_key(service.database_url, ORG_B, "beta"),
    ]
    result = await run_cli(service.database_url, "keys", "list")
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    for key in keys:
        assert key not in output
        assert hashlib.sha256(key.encode()).hexdigest() not in output
        assert key[4:] not in output, "the secret part of a key was printed"
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    for line, org, name in zip(lines, (ORG_A, ORG_B), ("alpha", "beta"), strict=True):
        fields = line.split("\t")
        assert re.fullmatch(r"key_[0-9a-f]{32}", fields[0])
        assert fields[1] == org
        assert fields[3] == "active"
        assert fields[4] == name


# ---- requiring a key -----------------------------------------------------------------


async def test_without_keys_the_service_is_open(service: Service) -> None:
    created = await service.request("POST", "/v1/sessions", json={})
    assert created.status_code == 201
    assert created.json()["organization_id"] == "org_" + uuid.UUID(int=1).hex


async def test_once_a_key_exists_requests_without_one_are_401(
    service: Service,
) -> None:
    open_session = (await service.request("POST", "/v1/sessions", json={})).json()
    key = await create_cli_key(service.database_url, ORG_A)
    sid = open_session["id"]
    before = await service.rows()
    routes: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", "/v1/sessions", None),
        ("POST", "/v1/sessions", {"title": "x"}),
        ("GET", f"/v1/sessions/{sid}", None),
        ("PATCH", f"/v1/sessions/{sid}", {"title": "x"}),
        ("DELETE", f"/v1/sessions/{sid}", None),
        ("POST", f"/v1/sessions/{sid}/cancel", None),
        ("GET", f"/v1/sessions/{sid}/messages", None),
        (
            "POST",
            f"/v1/sessions/{sid}/messages",
            {"message": {"content": [{"type": "text", "text": "x"}]}},
        ),
        ("GET", f"/v1/sessions/{sid}/events", None),
        ("GET", f"/v1/sessions/{sid}/sse", None),
        ("GET", f"/v1/sessions/{sid}/messages/stream", None),
        ("GET", "/api/v1/sessions", None),
    ]
    credentials: list[str | None] = [
        None,
        "",
        "Bearer",
        "Bearer ",
        f"Bearer {key[:-1]}0" if not key.endswith("0") else f"Bearer {key[:-1]}1",
        f"Basic {key}",
        "evm_" + "0" * 64,
        key.upper(),
    ]
    for method, url, body in routes:
        for credential in credentials:
            headers = {} if credential is None else {"Authorization": credential}
            response = await service.client.request(
                method, url, json=body, headers=headers
            )
            problem = assert_problem(response, 401)
            assert problem["code"] == "unauthorized"
            assert key not in response.text
    assert await service.rows() == before
    health = await service.client.get("/health")
    assert health.status_code == 200


async def test_401_carries_www_authenticate(service: Service) -> None:
    """RFC 9110 §15.5.2: a 401 MUST send a WWW-Authenticate challenge."""
    await create_cli_key(service.database_url, ORG_A)
    response = await service.client.get("/v1/sessions")
    assert response.status_code == 401
    assert response.headers.get("www-authenticate", "").lower().startswith("bearer")


async def test_bearer_and_bare_key_both_work(service: Service) -> None:
    key = await create_cli_key(service.database_url, ORG_A)
    created = await service.request("POST", "/v1/sessions", key, json={"title": "a"})
    assert created.status_code == 201
    session = created.json()
    assert session["organization_id"] == ORG_A
    assert session["owner_principal_id"] == "principal_" + ORG_A.removeprefix("org_")
    for authorization in (
        f"Bearer {key}",
        f"bearer {key}",
        f"BEARER {key}",
        f"Bearer   {key}  ",
        key,
        f"  {key} ",
    ):
        response = await service.client.get(
            f"/v1/sessions/{session['id']}", headers={"Authorization": authorization}
        )
        assert response.status_code == 200, (authorization, response.text)
        assert response.json() == session
    listed = await service.client.get(
        "/api/v1/sessions", headers={"Authorization": key}
    )
    assert [s["id"] for s in listed.json()["data"]] == [session["id"]]


# ---- organizations -------------------------------------------------------------------


async def test_a_key_never_sees_another_organizations_sessions(
    service: Service,
) -> None:
    key_a = await create_cli_key(service.database_url, ORG_A)
    key_b = await create_cli_key(service.database_url, ORG_B)
    mine = [await service.new_session(key_a, f"a{i}") for i in range(2)]
    theirs = await service.new_session(key_b, "b")
    mine_message = await service.finish_turn(key_a, mine[0]["id"])
    their_message = await service.finish_turn(key_b, theirs["id"])
    events_b = (
        await service.request("GET", f"/v1/sessions/{theirs['id']}/events", key_b)
    ).json()["data"]

    listed_a = (await service.request("GET", "/v1/sessions", key_a)).json()
    assert sorted(s["id"] for s in listed_a["data"]) == sorted(s["id"] for s in mine)
    assert listed_a["total"] == 2
    assert {s["organization_id"] for s in listed_a["data"]} == {ORG_A}
    listed_b = (await service.request("GET", "/v1/sessions", key_b)).json()
    assert [s["id"] for s in listed_b["data"]] == [theirs["id"]]
    assert listed_b["total"] == 1
    searched = (
        await service.request("GET", "/v1/sessions", key_a, params={"search": "b"})
    ).json()
    assert searched["data"] == []
    assert searched["total"] == 0

    unknown = "session_" + uuid.uuid4().hex
    before = await service.rows()
    for viewer, target, message in (
        (key_a, theirs["id"], their_message),
        (key_b, mine[0]["id"], mine_message),
    ):
        for suffix, method, body in [
            ("", "GET", None),
            ("", "PATCH", {"title": "hijacked"}),
            ("", "DELETE", None),
            ("/cancel", "POST", None),
            ("/messages", "GET", None),
            (
                "/messages",
                "POST",
                {"message": {"content": [{"type": "text", "text": "x"}]}},
            ),
            (f"/messages/{message}", "GET", None),
            ("/events", "GET", None),
            ("/sse", "GET", None),
            ("/messages/stream", "GET", None),
        ]:
            for headers in ({}, {"X-Org-Id": ORG_B if viewer == key_a else ORG_A}):
                response = await service.request(
                    method,
                    f"/v1/sessions/{target}{suffix}",
                    viewer,
                    json=body,
                    headers=headers,
                )
                problem = assert_problem(response, 404)
                assert problem["code"] == "session_not_found"
                assert problem["detail"] == f"Session {target} not found"
                # Indistinguishable from a session that does not exist at all.
                missing = await service.request(
                    method, f"/v1/sessions/{unknown}{suffix}", viewer, json=body
                )
                assert missing.status_code == 404
                assert missing.json()["code"] == problem["code"]
    # Another session's event id is at most a time cursor: it never yields its events.
    since = await service.request(
        "GET",
        f"/v1/sessions/{mine[0]['id']}/events",
        key_a,
        params={"since_id": events_b[0]["id"]},
    )
    if since.status_code == 200:
        assert {e["session_id"] for e in since.json()["data"]} <= {mine[0]["id"]}
    else:
        assert_problem(since, 400)
    assert await service.rows() == before


# ---- revocation ----------------------------------------------------------------------


async def test_revoke_stops_the_key(service: Service) -> None:
    doomed = await create_cli_key(service.database_url, ORG_A, "doomed")
    kept = await create_cli_key(service.database_url, ORG_A, "kept")
    session = await service.new_session(doomed, "a")
    url = f"/v1/sessions/{session['id']}"
    assert (await service.request("GET", url, doomed)).status_code == 200

    result = await run_cli(service.database_url, "keys", "revoke", doomed)
    assert result.returncode == 0, result.stderr
    assert "revoked 1 key(s)" in result.stdout
    assert doomed not in result.stdout + result.stderr
    for credential in (f"Bearer {doomed}", doomed):
        response = await service.client.get(url, headers={"Authorization": credential})
        assert assert_problem(response, 401)["code"] == "unauthorized"
    assert (await service.request("GET", url, kept)).status_code == 200
    listing = await key_ids(service.database_url)
    states = sorted(rest.split("\t")[2] for rest in listing.values())
    assert states == ["active", "revoked"]

    again = await run_cli(service.database_url, "keys", "revoke", doomed)
    assert again.returncode != 0
    assert "revoked 0 key(s)" in again.stdout

    kept_id = next(k for k, rest in listing.items() if rest.endswith("\tkept"))
    by_id = await run_cli(service.database_url, "keys", "revoke", kept_id)
    assert by_id.returncode == 0, by_id.stderr
    assert "revoked 1 key(s)" in by_id.stdout
    assert all(
        rest.split("\t")[2] == "revoked"
        for rest in (await key_ids(service.database_url)).values()
    )


async def test_revoking_the_last_key_does_not_reopen_the_service(
    service: Service,
) -> None:
    """Once keys were configured, revoking them must not turn the service back into an
    open one: a server started on a public address because a key existed would then
    serve anyone, without the start-up refusal ever running again."""
    key = await create_cli_key(service.database_url, ORG_A)
    session = await service.new_session(key, "a")
    result = await run_cli(service.database_url, "keys", "revoke", key)
    assert result.returncode == 0, result.stderr
    revoked = await service.request("GET", f"/v1/sessions/{session['id']}", key)
    assert_problem(revoked, 401)
    anonymous = await service.client.get("/v1/sessions")
    assert_problem(anonymous, 401)


async def test_revocation_takes_effect_within_the_cache_window(
    settings: Settings,
) -> None:
    ttl = 0.5
    cached = make_settings(settings.database_url, auth_cache_seconds=ttl)
    async with running_app(cached) as running:
        doomed = await create_cli_key(settings.database_url, ORG_A)
        await create_cli_key(settings.database_url, ORG_A)
        headers = {"Authorization": doomed}

        async def answers(status: int) -> bool:
            response = await running.client.get("/v1/sessions", headers=headers)
            return response.status_code == status

        await wait_until(lambda: answers(200), "the new key to work", within=ttl + 5)
        revoked_at = time.monotonic()
        result = await run_cli(settings.database_url, "keys", "revoke", doomed)
        assert result.returncode == 0, result.stderr
        await wait_until(
            lambda: answers(401), "the revoked key to stop working", within=ttl + 5
        )
        assert time.monotonic() - revoked_at < ttl + 5


# ---- serve on a public address -------------------------------------------------------


def serve_command(port: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "app", "serve", "--port", str(port), *args]


def serve_environment(database_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "LOG_LEVEL": "warning",
        "SCRIPTED_DELAY_MS": "1",
    }


async def serving(
    database_url: str, tmp_path: Path, *args: str
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `serve` with `args`; return it once /health answers on loopback."""
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    process = spawn(serve_command(port, *args), database_url, log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient(timeout=1) as client:
        while True:
            if process.poll() is not None:
                raise AssertionError(f"serve exited: {log.read_text()}")
            try:
                if (await client.get(f"{url}/health")).status_code == 200:
                    return process, url
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                await asyncio.to_thread(stop, process)
                raise AssertionError(f"serve never answered: {log.read_text()}")
            await asyncio.sleep(0.1)


def spawn(command: list[str], database_url: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=serve_environment(database_url),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


async def test_serve_refuses_a_public_address_without_keys(settings: Settings) -> None:
    port = free_port()
    result = await asyncio.to_thread(
        subprocess.run,
        serve_command(port, "--host", "0.0.0.0"),
        cwd=ROOT,
        env=serve_environment(settings.database_url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "refusing to serve on 0.0.0.0" in result.stderr
    assert "--insecure" in result.stderr
    # Nothing listens on the port: it can be bound. (Connecting to find out can connect
    # the client to itself when the kernel picks the same port as its source.)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


async def test_serve_insecure_starts_on_a_public_address(
    settings: Settings, tmp_path: Path
) -> None:
    process, url = await serving(
        settings.database_url, tmp_path, "--host", "0.0.0.0", "--insecure"
    )
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(f"{url}/v1/sessions")
        assert response.status_code == 200
    finally:
        await asyncio.to_thread(stop, process)
    assert process.returncode is not None


async def test_serve_with_a_key_starts_and_requires_it(
    settings: Settings, tmp_path: Path
) -> None:
    key_a = await create_cli_key(settings.database_url, ORG_A)
    key_b = await create_cli_key(settings.database_url, ORG_B)
    process, url = await serving(settings.database_url, tmp_path, "--host", "0.0.0.0")
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            assert_problem(await client.get("/v1/sessions"), 401)
            created = await client.post(
                "/api/v1/sessions",
                json={"title": "sdk"},
                headers={"Authorization": key_a},
            )
            assert created.status_code == 201
            sid = created.json()["id"]
            assert created.json()["organization_id"] == ORG_A
            sse = f"/v1/sessions/{sid}/sse"
            foreign = await client.get(sse, headers=auth(key_b))
            assert assert_problem(foreign, 404)["code"] == "session_not_found"
            async with open_stream(client, sse, headers=auth(key_a)) as stream:
                assert stream.status_code == 200
                content_type = stream.response.headers["content-type"]
                assert content_type.startswith("text/event-stream")
                await expect_connected(stream)
    finally:
        await asyncio.to_thread(stop, process)
