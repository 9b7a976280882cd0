"""Traces (the otel extra, app/telemetry/traces.py), against real server processes sending
OTLP/HTTP to a small collector of the test's own (a stdlib HTTP server on loopback that
decodes the protobuf it receives): a request with a W3C `traceparent` is a server span
of that trace, the child of the caller's span, on FastAPI's path and the hot one; the
events it wrote carry the trace in their `context`; a turn it started has its turn,
model-step, checkpoint and bus spans in the same trace. Without an endpoint (or without
the extra) nothing of opentelemetry is imported and the application is the untraced
one: FastAPI 0.165 on imports opentelemetry-api itself (a dependency of it),
the service nothing more (no SDK, no exporter, not even the API where FastAPI does
not)."""

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.support.api import create_session, list_events, post_message
from tests.support.lanes import ROOT
from tests.support.servers import start_own_server
from tests.support.waits import wait_idle, wait_until

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
trace_service = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2"
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER


class Collector:
    """An OTLP/HTTP trace receiver on loopback: every span posted to /v1/traces."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.resources: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    collector.receive(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def receive(self, body: bytes) -> None:
        request = trace_service.ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            for resource_spans in request.resource_spans:
                self.resources.append(
                    {
                        a.key: a.value.string_value
                        for a in resource_spans.resource.attributes
                    }
                )
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            {
                                "name": span.name,
                                "kind": span.kind,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_span_id": span.parent_span_id.hex(),
                                "attributes": {
                                    a.key: _value(a.value) for a in span.attributes
                                },
                            }
                        )

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [span for span in self.spans if span["name"] == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    yield found
    found.close()


def traceparent(span_id: str = PARENT_ID) -> dict[str, str]:
    return {"traceparent": f"00-{TRACE_ID}-{span_id}-01"}


async def test_a_traced_request_and_the_turn_it_starts(
    settings: Settings, tmp_path: Path, collector: Collector
) -> None:
    server = await start_own_server(
        settings.database_url,
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.url,
        OTEL_BSP_SCHEDULE_DELAY="50",
        OTEL_SERVICE_NAME="",
        OTEL_RESOURCE_ATTRIBUTES="",
    )
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            sid = await create_session(client, "traced")
            posted = await post_message(client, sid, "hello", headers=traceparent())
            await wait_idle(client, sid)
            hot_parent = "00f067aa0ba902b8"
            page = await client.get(
                f"/v1/sessions/{sid}/messages", headers=traceparent(hot_parent)
            )
            assert page.status_code == 200, page.text
            events = await list_events(client, sid)

            def arrived() -> bool:
                return bool(collector.named("model.step")) and any(
                    span["parent_span_id"] == hot_parent for span in collector.spans
                )

            await wait_until(
                arrived, "the spans of the turn and the page read", within=10
            )
    finally:
        await asyncio.to_thread(server.stop)

    assert {"service.name": "evermirror"}.items() <= collector.resources[0].items()
    # The POST: a server span of the caller's trace, the child of its span.
    posts = collector.named("POST /sessions/{session_id}/messages")
    assert len(posts) == 1, [
        (s["name"], s["attributes"])
        for s in collector.spans
        if s["kind"] == SERVER_KIND
    ]
    post = posts[0]
    assert post["kind"] == SERVER_KIND
    assert (post["trace_id"], post["parent_span_id"]) == (TRACE_ID, PARENT_ID)
    assert post["attributes"]["http.response.status_code"] == 201
    assert post["attributes"]["http.request.method"] == "POST"
    assert post["attributes"]["url.path"] == f"/v1/sessions/{sid}/messages"
    # The hot path's page read likewise.
    (hot,) = [s for s in collector.spans if s["parent_span_id"] == hot_parent]
    assert hot["name"] == "GET /sessions/{session_id}/messages"
    assert (hot["trace_id"], hot["kind"]) == (TRACE_ID, SERVER_KIND)
    assert hot["attributes"]["http.response.status_code"] == 200
    # An untraced request is a trace of its own.
    (created,) = collector.named("POST /sessions")
    assert created["trace_id"] != TRACE_ID
    assert created["parent_span_id"] == ""

    by_id = {span["span_id"]: span for span in collector.spans}
    # The events the POST wrote name its checkpoint's span, the child of the request's.
    written = [
        e for e in events if e["context"].get("input_message_id") == posted["id"]
    ]
    written += [
        e for e in events if e["data"].get("message", {}).get("id") == posted["id"]
    ]
    assert written, events
    for event in events:
        context = event["context"]
        assert context["trace_id"] == TRACE_ID, event
        assert by_id[context["span_id"]]["name"] == "checkpoint", event
        assert by_id[context["span_id"]]["parent_span_id"] == context["parent_span_id"]
    first = written[0]["context"]
    assert by_id[first["span_id"]]["parent_span_id"] == post["span_id"]
    # The turn it started: in the same trace, with its model step, checkpoints and the
    # bus delivery of its commits.
    (turn,) = collector.named("turn")
    assert turn["trace_id"] == TRACE_ID
    assert turn["attributes"]["evermirror.turn.outcome"] == "completed"
    turn_id = turn["attributes"]["evermirror.turn_id"]
    assert any(e["context"].get("turn_id") == turn_id for e in events)
    steps = collector.named("model.step")
    assert steps
    assert all(s["parent_span_id"] == turn["span_id"] for s in steps)
    assert steps[0]["attributes"]["gen_ai.system"] == "scripted"
    turn_checkpoints = [
        s
        for s in collector.named("checkpoint")
        if s["parent_span_id"] == turn["span_id"]
    ]
    assert len(turn_checkpoints) >= 2
    assert {s["trace_id"] for s in turn_checkpoints} == {TRACE_ID}
    assert any(
        by_id.get(s["parent_span_id"], {}).get("name") == "checkpoint"
        for s in collector.named("bus.deliver")
    )
    assert collector.named("bus.publish")
    # Probes are not traced.
    assert not [s for s in collector.spans if s["name"].startswith("GET /health")]


# ---- off: nothing imported ----------------------------------------------------------

PROBE = """
import asyncio, json, sys
import httpx

def otel():
    return {m for m in sys.modules if m.split(".")[0] == "opentelemetry"}

# FastAPI (0.165 on) depends on opentelemetry-api and imports it itself.
import fastapi
framework = otel()
from app.main import Service, TracedService, create_app
from app.settings import Settings

async def main():
    app = create_app(Settings(database_url=sys.argv[1], auto_migrate=False))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            created = await client.post("/v1/sessions", json={"title": "x"})
            sid = created.json()["id"]
            await client.post(
                f"/v1/sessions/{sid}/messages",
                json={"message": {"content": [{"type": "text", "text": "hi"}]}},
                headers={"traceparent": "TRACEPARENT"},
            )
            for _ in range(200):
                session = (await client.get(f"/v1/sessions/{sid}")).json()
                if session["status"] == "idle":
                    break
                await asyncio.sleep(0.05)
            await client.get(f"/v1/sessions/{sid}/messages")
            events = (await client.get(f"/v1/sessions/{sid}/events")).json()["data"]
    print(json.dumps({
        "traced": type(app) is TracedService,
        "plain": type(app) is Service,
        "status": session["status"],
        "contexts": [sorted(e["context"]) for e in events],
        "otel": sorted(otel() - framework),
    }))

asyncio.run(main())
""".replace("TRACEPARENT", f"00-{TRACE_ID}-{PARENT_ID}-01")

BLOCK_OTEL = """
import sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            raise ImportError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, Absent())
"""


def probe(database_url: str, tmp_path: Path, *, blocked: bool, **env: str) -> Any:
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("OTEL_")
    }
    environment.update(env)
    script = (BLOCK_OTEL if blocked else "") + PROBE
    result = subprocess.run(
        [sys.executable, "-c", script, database_url],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1]), result.stderr


async def test_without_an_endpoint_nothing_of_opentelemetry_is_imported(
    settings: Settings, tmp_path: Path
) -> None:
    found, _ = await asyncio.to_thread(
        probe, settings.database_url, tmp_path, blocked=False
    )
    assert found["otel"] == []
    assert found["plain"]
    assert not found["traced"]
    assert found["status"] == "idle"
    assert found["contexts"]
    for context in found["contexts"]:
        assert not {"trace_id", "span_id", "parent_span_id"} & set(context)


async def test_an_endpoint_without_the_extra_is_a_warning(
    settings: Settings, tmp_path: Path
) -> None:
    found, stderr = await asyncio.to_thread(
        probe,
        settings.database_url,
        tmp_path,
        blocked=True,
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
    )
    assert found["otel"] == []
    assert found["plain"]
    assert found["status"] == "idle"
    assert "the otel extra is not installed" in stderr


async def test_the_sdk_disabled_is_off(settings: Settings, tmp_path: Path) -> None:
    found, _ = await asyncio.to_thread(
        probe,
        settings.database_url,
        tmp_path,
        blocked=False,
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_SDK_DISABLED="true",
    )
    assert found["otel"] == []
    assert found["plain"]
