"""The committed OpenAPI document, its agreement with upstream's operations, and the
`/api/v1` mount (upstream's and the official SDK's base URL) answering as `/v1` does."""

import asyncio
import difflib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.settings import Settings
from tests.support.servers import Server
from tests.support.waits import wait_idle

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "openapi" / "openapi.json"
UPSTREAM = Path("/work/shared/everruns/openapi-sessions-subset.json")
SHARED_OPERATIONS = {
    "list_sessions",
    "create_session",
    "get_session",
    "update_session",
    "delete_session",
    "list_messages",
    "create_message",
    "list_events",
    "stream_sse",
    "cancel_turn",
}
METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def generated_document(tmp_path: Path) -> dict[str, Any]:
    settings = Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'openapi.db'}")
    document: dict[str, Any] = create_app(settings).openapi()
    return document


def operations(document: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """operationId -> (path, METHOD, operation)."""
    found: dict[str, tuple[str, str, dict[str, Any]]] = {}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in METHODS and "operationId" in operation:
                op_id = operation["operationId"]
                assert op_id not in found, f"duplicate operationId {op_id}"
                found[op_id] = (path, method.upper(), operation)
    return found


def path_parameters(operation: dict[str, Any]) -> set[str]:
    return {
        p["name"]
        for p in operation.get("parameters", [])
        if "name" in p and p.get("in") == "path"
    }


def test_committed_document_matches_the_app(tmp_path: Path) -> None:
    generated = (
        json.dumps(generated_document(tmp_path), indent=2, sort_keys=True) + "\n"
    )
    committed = COMMITTED.read_text()
    if generated != committed:
        diff = "".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(keepends=True),
                    generated.splitlines(keepends=True),
                    "openapi/openapi.json (committed)",
                    "create_app().openapi()",
                )
            )[:60]
        )
        pytest.fail(f"openapi/openapi.json is stale: run `make openapi`\n{diff}")


# Success statuses of upstream's newer code that the published document predates:
# `POST .../messages?wait=true` answers 200 (the turn ended) or 202 (timeout).
NEWER_SUCCESS = {"create_message": {"200", "202"}}


def test_shared_operations_keep_upstream_paths_and_methods(tmp_path: Path) -> None:
    upstream = operations(json.loads(UPSTREAM.read_text()))
    ours = operations(generated_document(tmp_path))
    assert set(upstream) >= SHARED_OPERATIONS
    for op_id in sorted(SHARED_OPERATIONS):
        assert op_id in ours, f"{op_id} is missing"
        up_path, up_method, up_op = upstream[op_id]
        path, method, op = ours[op_id]
        assert (method, path) == (up_method, up_path), op_id
        assert path_parameters(op) == path_parameters(up_op), op_id
        # The success status is upstream's (201 for creates, 204 for delete, ...).
        up_success = {s for s in up_op["responses"] if s.startswith("2")}
        success = {s for s in op["responses"] if s.startswith("2")}
        assert success == up_success | NEWER_SUCCESS.get(op_id, set()), op_id
    # Every operation upstream has at one of our paths is the same operation.
    by_route = {(m, p): op_id for op_id, (p, m, _) in ours.items()}
    for op_id, (path, method, _) in upstream.items():
        if (method, path) in by_route:
            assert by_route[(method, path)] == op_id


def test_documented_errors_are_the_problem_details_we_send(tmp_path: Path) -> None:
    """Bad path and query values are 400 problem+json (DESIGN 2.1); only a request body
    can be 422. The document must not promise FastAPI's default 422 shape."""
    document = generated_document(tmp_path)
    wrong: list[str] = []
    for op_id, (path, method, op) in sorted(operations(document).items()):
        for status, response in op["responses"].items():
            if not status.startswith(("4", "5")):
                continue
            refs = {
                media.get("schema", {}).get("$ref")
                for media in response.get("content", {}).values()
            }
            if refs != {"#/components/schemas/ProblemDetails"}:
                wrong.append(
                    f"{op_id} {method} {path} {status}: {sorted(map(str, refs))}"
                )
            if status == "422" and "requestBody" not in op:
                wrong.append(f"{op_id} {method} {path}: 422 without a request body")
    assert not wrong, "\n".join(wrong)


# ---- /api/v1 answers as /v1 does --------------------------------------------------


def as_api(url: str) -> str:
    head, sep, tail = url.partition("/v1/")
    assert sep, url
    return f"{head}/api/v1/{tail}"


async def sse_replay(http: httpx.AsyncClient, path: str, count: int) -> list[str]:
    """The first `count` durable frames of a replay from the start, as raw text."""
    frames: list[str] = []
    current: list[str] = []

    async def read() -> None:
        async with http.stream("GET", path, params={"after_sequence": 0}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.aiter_lines():
                if line:
                    current.append(line)
                    continue
                if current:
                    frames.append("\n".join(current))
                    current.clear()
                if sum(1 for f in frames if "\nid: " in f) == count:
                    return

    await asyncio.wait_for(read(), 20)
    return [f for f in frames if not f.startswith(":")]


async def test_api_prefix_answers_as_v1(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        # Create through /api/v1, then read through both mounts.
        created = await http.post("/api/v1/sessions", json={"title": "mounts"})
        assert created.status_code == 201, created.text
        session = created.json()
        sid = session["id"]
        assert created.headers["location"] == session["self_url"]
        assert session["self_url"] == f"{server.url}/api/v1/sessions/{sid}"

        posted = await http.post(
            f"/api/v1/sessions/{sid}/messages",
            json={"message": {"content": [{"type": "text", "text": "hello mounts"}]}},
        )
        assert posted.status_code == 201, posted.text
        assert posted.json()["delivery"] == "started"
        await wait_idle(http, sid, 30)
        message_id = posted.json()["id"]

        patched = {}
        for prefix in ("/v1", "/api/v1"):
            response = await http.patch(
                f"{prefix}/sessions/{sid}", json={"title": "mounted"}
            )
            assert response.status_code == 200, response.text
            patched[prefix] = response.json()
        assert patched["/api/v1"]["title"] == patched["/v1"]["title"] == "mounted"

        reads = [
            f"/sessions/{sid}",
            "/sessions?limit=5",
            f"/sessions/{sid}/messages?include_internal=true",
            f"/sessions/{sid}/messages/{message_id}",
            f"/sessions/{sid}/events",
            f"/sessions/{sid}/events?limit=2",
            "/sessions/sess_123",
            f"/sessions/{sid}/messages?limit=0",
        ]
        for path in reads:
            v1 = await http.get(f"/v1{path}")
            api = await http.get(f"/api/v1{path}")
            assert api.status_code == v1.status_code, path
            assert api.headers["content-type"] == v1.headers["content-type"], path
            assert api.headers.get("x-total-count") == v1.headers.get("x-total-count")
            v1_body, api_body = v1.json(), api.json()
            if v1.status_code >= 400:
                assert api_body.pop("instance") == "/api" + v1_body.pop("instance")
            elif path in (f"/sessions/{sid}", "/sessions?limit=5"):
                for item in v1_body.get("data", [v1_body]):
                    item["self_url"] = as_api(item["self_url"])
                for item in api_body.get("data", [api_body]):
                    item.pop("view_url")
                    item.pop("ui_link")
                for item in v1_body.get("data", [v1_body]):
                    item.pop("view_url")
                    item.pop("ui_link")
            assert api_body == v1_body, path

        events = (await http.get(f"/v1/sessions/{sid}/events")).json()["data"]
        v1_frames = await sse_replay(http, f"/v1/sessions/{sid}/sse", len(events))
        api_frames = await sse_replay(http, f"/api/v1/sessions/{sid}/sse", len(events))
        assert v1_frames[0].startswith("event: connected")
        assert api_frames == v1_frames
        assert sum(1 for f in v1_frames if "\nid: " in f) == len(events)

        cancels = [
            (await http.post(f"{prefix}/sessions/{sid}/cancel")).json()
            for prefix in ("/v1", "/api/v1")
        ]
        assert (
            cancels[0]
            == cancels[1]
            == {
                "status": "no_op",
                "message": "No turn was running",
            }
        )

        deleted = await http.delete(f"/api/v1/sessions/{sid}")
        assert deleted.status_code == 204
        for prefix in ("/v1", "/api/v1"):
            gone = await http.get(f"{prefix}/sessions/{sid}")
            assert gone.status_code == 404
            assert gone.headers["content-type"] == "application/problem+json"


async def test_api_prefix_keeps_upstream_ui_links(server: Server) -> None:
    """Upstream: self_url is under the API base (`.../api/v1/sessions/<id>`), view_url
    and ui_link are the UI's (`.../sessions/<id>/chat`, no `/api`), whichever mount
    the client called."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        created = await http.post("/v1/sessions", json={})
        sid = created.json()["id"]
        v1 = (await http.get(f"/v1/sessions/{sid}")).json()
        api = (await http.get(f"/api/v1/sessions/{sid}")).json()
    assert v1["self_url"] == f"{server.url}/v1/sessions/{sid}"
    assert api["self_url"] == f"{server.url}/api/v1/sessions/{sid}"
    assert v1["view_url"] == v1["ui_link"] == f"{server.url}/sessions/{sid}/chat"
    assert api["view_url"] == api["ui_link"] == v1["view_url"]
