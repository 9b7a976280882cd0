"""Property-based fuzzing of every operation in openapi/openapi.json (schemathesis 4).

A real server process per lane (`python -m app serve`); cases come from the committed
schema, so what the fuzzer checks is what clients are told. Checks: schemathesis's
defaults (no 5xx; status codes, content types, headers and bodies as documented;
schema-valid requests accepted, schema-violating ones refused) plus every 4xx/5xx being
problem+json with `title` and `status`.

Bounded for CI and reproducible: `derandomize=True`, 40 examples per operation, 25 for
the two streams, which the server closes after SSE_CYCLE_SECONDS=0.05 so every stream
response ends. Half of the generated cases are pointed at ids that exist (a session with
a finished turn, its messages and events), so they reach past the 400/404 paths.
A finding gets a fix and an explicit test in tests/test_fuzz_regressions.py.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings, strategies as st
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from schemathesis.core.failures import Failure
from schemathesis.specs.openapi.checks import positive_data_acceptance

from app.schemas import MAX_INT32
from tests.support.lanes import LANES, truncate
from tests.support.servers import Server, start_server

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_PATH = ROOT / "openapi" / "openapi.json"
SSE_OPERATIONS = ("stream_sse", "stream_messages")

schema = schemathesis.openapi.from_path(SCHEMA_PATH)
# U+0000 in a string is refused by design (PostgreSQL cannot store it), which the
# schema does not spell out on every string: tests/test_fuzz_regressions.py covers it.
schema.config.generation.update(allow_x00=False)


@schemathesis.serializer("application/jsonl")
def jsonl(ctx: Any, value: Any) -> bytes:
    """`POST /v1/sessions/import`'s body: JSON Lines, generated as one string."""
    return value.encode() if isinstance(value, str) else str(value).encode()


class Known:
    """Ids that exist on the server of the lane under test, so cases reach past lookups."""

    session: str = ""
    deletable: list[str] = []  # noqa: RUF012
    messages: list[str] = []  # noqa: RUF012
    events: list[str] = []  # noqa: RUF012
    models: list[str] = []  # noqa: RUF012


@pytest.fixture(scope="module", params=LANES)
def fuzz_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("fuzz")
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        shutil.copy(template, tmp / "fuzz.db")
        url = f"sqlite+aiosqlite:///{tmp / 'fuzz.db'}"
    else:
        url = request.getfixturevalue("pg_database")
        asyncio.run(truncate(url))
    srv = start_server(
        url,
        tmp,
        SSE_CYCLE_SECONDS="0.05",
        SSE_HEARTBEAT_SECONDS="0.05",
        SCRIPTED_DELAY_MS="1",
        AUTO_MIGRATE="false",
        # 429 is documented everywhere; the fuzzer should spend its examples elsewhere.
        RATE_LIMIT_PER_SECOND="0",
    )
    try:
        _seed(srv.url)
        yield srv
    finally:
        srv.stop()


def _seed(base: str) -> None:
    with httpx.Client(base_url=base + "/v1", timeout=10) as http:
        session = http.post("/sessions", json={"title": "fuzz"}).json()["id"]
        sid = f"/sessions/{session}"
        http.post(
            f"{sid}/messages",
            json={"message": {"content": [{"type": "text", "text": "hello"}]}},
        ).raise_for_status()
        deadline = time.monotonic() + 10
        while http.get(sid).json()["status"] != "idle":
            assert time.monotonic() < deadline, "seed turn did not finish"
            time.sleep(0.05)
        Known.session = session
        Known.messages = [m["id"] for m in http.get(f"{sid}/messages").json()["data"]]
        Known.events = [e["id"] for e in http.get(f"{sid}/events").json()["data"]]
        Known.models = [m["id"] for m in http.get("/models").json()["data"]]
        Known.deletable = [
            http.post("/sessions", json={}).json()["id"] for _ in range(3)
        ]


SESSION_ID = re.compile(r"session_[0-9a-f]{32}")
MESSAGE_ID = re.compile(r"message_[0-9a-f]{32}")
EVENT_ID = re.compile(r"event_[0-9a-f]{32}")


def _matches(pattern: re.Pattern[str], value: Any) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


@schema.hook
def flatmap_path_parameters(
    ctx: schemathesis.HookContext, path_parameters: dict[str, Any] | None
) -> st.SearchStrategy[dict[str, Any] | None]:
    """Half of the cases use ids that exist (a message of that session, for one).
    A malformed id (a negative case) is left alone: it is what the case tests."""
    if not path_parameters or not _matches(
        SESSION_ID, path_parameters.get("session_id")
    ):
        return st.just(path_parameters)
    assert ctx.operation is not None
    sessions = (
        Known.deletable
        if ctx.operation.definition.raw.get("operationId") == "delete_session"
        else [Known.session]
    )
    known = st.sampled_from(sessions).map(
        lambda s: {**path_parameters, "session_id": s}
    )
    if _matches(MESSAGE_ID, path_parameters.get("message_id")):
        known = known.flatmap(
            lambda p: st.sampled_from([p["message_id"], *Known.messages]).map(
                lambda m: {**p, "message_id": m}
            )
        )
    return st.one_of(st.just(path_parameters), known)


MODEL_ID = re.compile(r"model_[0-9a-f]{32}")


def known_model(body: Any) -> Any:
    """A well-formed `model_id` (a session's, or a message's `controls.model_id`) names
    a model of the server's catalog: an unlisted one is a 422 by design, which the
    schema cannot say (the catalog is the operator's). Applied in `_call`, so the
    coverage phase's cases (which skip the hooks) get it too."""
    if not isinstance(body, dict):
        return body
    if _matches(MODEL_ID, body.get("model_id")):
        body = {**body, "model_id": Known.models[0]}
    controls = body.get("controls")
    if isinstance(controls, dict) and _matches(MODEL_ID, controls.get("model_id")):
        body = {**body, "controls": {**controls, "model_id": Known.models[0]}}
    return body


# Events parameters that are valid one by one but refused together (or at all) by
# design, which a schema cannot say: `around` with a cursor or `limit`, `window`
# without `around`, and the filters that have no meaning here.
AROUND_EXCLUDES = ("since_id", "after_sequence", "before_sequence", "limit")
UNSUPPORTED = ("exec_id", "trace_id", "tags")


def refused_by_design(query: dict[str, Any]) -> bool:
    given = {k for k, v in query.items() if v is not None}
    return (
        {"since_id", "after_sequence"} <= given
        or ("around" in given and bool(given & set(AROUND_EXCLUDES)))
        or ("window" in given and "around" not in given)
        or any(query.get(name) for name in UNSUPPORTED)
    )


@schema.hook
def flatmap_query(
    ctx: schemathesis.HookContext, query: dict[str, Any] | None
) -> st.SearchStrategy[dict[str, Any] | None]:
    """A well-formed `since_id` or `around` names an event that exists (an unknown one
    is a 400 by design, which a schema cannot say). `since_id` and `after_sequence` are
    two spellings of one cursor and a 400 together: a valid `after_sequence` is dropped.
    Likewise the cursors and `limit` beside `around`, `window` without it, and the
    filters refused by name (`refused_by_design`)."""
    if not query:
        return st.just(query)
    query = {k: v for k, v in query.items() if k not in UNSUPPORTED}
    if "window" in query and not _matches(EVENT_ID, query.get("around")):
        query.pop("window")
    if _matches(EVENT_ID, query.get("around")):
        kept = {k: v for k, v in query.items() if k not in AROUND_EXCLUDES}
        return st.sampled_from(Known.events).map(lambda e: {**kept, "around": e})
    if not _matches(EVENT_ID, query.get("since_id")):
        return st.just(query)
    after = query.get("after_sequence")
    if type(after) is int and 0 <= after <= MAX_INT32:
        query = {k: v for k, v in query.items() if k != "after_sequence"}
    return st.sampled_from(Known.events).map(lambda e: {**query, "since_id": e})


def body_refused_by_design(case: schemathesis.Case[Any]) -> bool:
    """Bodies valid by the schema that the service refuses by design (422), which a
    schema cannot say: tools with one name twice or `parameters` that are not a JSON
    Schema, and one tool call's result twice in a request."""
    body = case.body if isinstance(case.body, dict) else {}
    tools = body.get("tools")
    if isinstance(tools, list):
        names = [t.get("name") for t in tools if isinstance(t, dict)]
        if len(names) != len(set(map(str, names))):
            return True
        for tool in tools:
            parameters = tool.get("parameters") if isinstance(tool, dict) else None
            if isinstance(parameters, dict):
                try:
                    Draft202012Validator.check_schema(parameters)
                except SchemaError:
                    return True
    results = body.get("tool_results")
    if isinstance(results, list):
        ids = [str(r.get("tool_call_id")) for r in results if isinstance(r, dict)]
        if len(ids) != len(set(ids)):
            return True
    return False


# Operations whose schema-valid requests the service refuses by the conversation's
# state or by content a schema cannot spell, with a 4xx problem: the frontend
# protocols (bodies in AG-UI's and the AI SDK's shapes, whose conformance
# tests/test_ag_ui.py and the SDKs' own clients check), an import (an export's lines as
# one string), an edit (of a user message only) and a regenerate (of an agent message
# only). They are still fuzzed for 5xx, undocumented statuses and problem+json.
STATE_DEPENDENT = frozenset(
    {
        "chat",
        "resume_chat",
        "run_agent",
        "run_session_agent",
        "import_session",
        "edit_message",
        "regenerate_message",
    }
)


def problem_json(
    ctx: Any, response: schemathesis.Response, case: schemathesis.Case[Any]
) -> bool | None:
    """Every 4xx/5xx is RFC 9457 problem+json with `title` and `status`."""
    if response.status_code < 400:
        return None
    media = (response.headers.get("content-type") or [""])[0].split(";")[0].strip()
    if media != "application/problem+json":
        raise Failure(
            operation=case.operation.label,
            title="Error response is not problem+json",
            message=f"{response.status_code} with Content-Type {media!r}",
        )
    try:
        body = response.json()
    except ValueError:
        body = None
    if not (
        isinstance(body, dict)
        and isinstance(body.get("title"), str)
        and body.get("status") == response.status_code
    ):
        raise Failure(
            operation=case.operation.label,
            title="Problem details without title/status",
            message=f"{response.status_code}: {response.text[:300]}",
        )
    return True


def _call(case: schemathesis.Case[Any], server: Server) -> None:
    body = known_model(case.body)
    if body is not case.body:
        case.body = body
    query = case.query or {}
    if case.method == case.operation.method.upper() and refused_by_design(query):
        # Cases of the coverage phase skip the hooks; the schema cannot say "not both".
        response = case.call(base_url=server.url, timeout=10)
        assert response.status_code == 400, response.text
        assert response.headers["content-type"] == ["application/problem+json"]
        return
    if case.method == case.operation.method.upper() and body_refused_by_design(case):
        response = case.call(base_url=server.url, timeout=10)
        # 422 for the body; a malformed path parameter is refused first, with 400.
        assert response.status_code in (400, 422), response.text
        assert response.headers["content-type"] == ["application/problem+json"]
        return
    excluded: list[Any] | None = (
        [positive_data_acceptance]
        if case.operation.definition.raw.get("operationId") in STATE_DEPENDENT
        else None
    )
    try:
        case.call_and_validate(
            base_url=server.url,
            additional_checks=[problem_json],
            excluded_checks=excluded,
            timeout=10,
        )
    except Exception as exc:
        # A 5xx's traceback is in the server's log, not in the response.
        log = server.log.read_text(errors="replace")
        exc.add_note("server log (tail):\n" + log[-4000:])
        raise


@schema.exclude(operation_id=list(SSE_OPERATIONS)).parametrize()
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_fuzz(case: schemathesis.Case, fuzz_server: Server) -> None:
    _call(case, fuzz_server)


@schema.include(operation_id=list(SSE_OPERATIONS)).parametrize()
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_fuzz_streams(case: schemathesis.Case, fuzz_server: Server) -> None:
    _call(case, fuzz_server)
