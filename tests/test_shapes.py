"""Wire shapes: Sessions, Messages, content parts, Events and the list envelopes, checked
against upstream's OpenAPI schemas (openapi-sessions-subset.json) and, for Message, the
seed's data-wrapped shape, over real turns of every scripted scenario."""

import copy
import json
import os
import re
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from sqlalchemy import select

from app.catalog.registry import derived_id
from app.db import models
from app.ids import uuid7
from app.journal import checkpoint
from app.journal.sessions import lock_session
from tests.support.api import list_events, post_message, uuid_of
from tests.support.in_process import Running
from tests.support.lanes import ROOT
from tests.support.problems import find_nulls
from tests.support.waits import wait_idle, wait_until

# The pinned copy of upstream's published OpenAPI subset (see openapi/README.md).
SPEC_PATH = Path(os.environ.get("EVERRUNS_SPEC", ROOT / "openapi" / "upstream.json"))
SPEC_URI = "urn:everruns:openapi-sessions-subset"

RESOURCE_TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z$")
EVENT_TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
HEX32 = "0123456789abcdef0123456789abcdef"
# The catalog's one model when no MODELS_FILE is set.
SCRIPTED_MODEL_ID = derived_id("scripted", "scripted")

# ---- the seed's Message (list-messages-api.txt + DESIGN 2.3) -------------------------
# Optional fields are omitted, never null, so no `null` is allowed anywhere here.

STR: dict[str, Any] = {"type": "string"}
NON_EMPTY: dict[str, Any] = {"type": "string", "minLength": 1}
NOT_NULL: dict[str, Any] = {"not": {"type": "null"}}
TIMESTAMP: dict[str, Any] = {"type": "string", "pattern": RESOURCE_TS.pattern}


def typed_id(prefix: str) -> dict[str, Any]:
    return {"type": "string", "pattern": f"^{prefix}_[0-9a-f]{{32}}$"}


def part(kind: str, required: list[str], props: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", "part_id", "sequence", *required],
        "additionalProperties": False,
        "properties": {
            "type": {"const": kind},
            "part_id": NON_EMPTY,
            "sequence": {"type": "integer", "minimum": 1},
            "step_id": NON_EMPTY,
            **props,
        },
    }


def closed(required: list[str], props: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": props,
    }


ANNOTATION = closed(
    ["start", "end", "origin", "source"],
    {
        "start": {"type": "integer", "minimum": 0},
        "end": {"type": "integer", "minimum": 0},
        "origin": NON_EMPTY,
        "external_id": STR,
        "source": closed(
            ["uri"],
            {"uri": NON_EMPTY, "title": STR, "snippet": STR, "location": NOT_NULL},
        ),
        "verified": closed(
            ["status"],
            {
                "status": {"enum": ["entailed", "unsupported", "uncertain"]},
                "score": {"type": "number", "minimum": 0, "maximum": 1},
            },
        ),
    },
)
NATIVE_TOOL_CALL = {
    "oneOf": [
        closed(
            ["type", "call_id", "name", payload],
            {
                "type": {"const": kind},
                "call_id": STR,
                "name": STR,
                payload: STR,
                "async": {"type": "boolean"},
            },
        )
        for kind, payload in [
            ("function_call", "arguments"),
            ("custom_tool_call", "input"),
        ]
    ]
}
REASONING_TEXT = {
    "oneOf": [
        closed(["kind", "text"], {"kind": {"const": "plain"}, "text": STR}),
        closed(
            ["kind", "parts"],
            {"kind": {"const": "summary"}, "parts": {"type": "array", "items": STR}},
        ),
        closed(["kind"], {"kind": {"const": "redacted"}}),
    ]
}
SEED_PARTS: dict[str, dict[str, Any]] = {
    "text": part(
        "text",
        ["text"],
        {"text": STR, "annotations": {"type": "array", "items": ANNOTATION}},
    ),
    "image": part("image", [], {"base64": STR, "media_type": STR, "url": STR}),
    "image_file": part(
        "image_file", ["image_id"], {"image_id": typed_id("img"), "filename": STR}
    ),
    "file": part("file", ["file_id"], {"file_id": typed_id("file"), "filename": STR}),
    "tool_call": part(
        "tool_call",
        ["id", "name", "arguments"],
        {
            "id": NON_EMPTY,
            "name": NON_EMPTY,
            "arguments": NOT_NULL,
            "native": NATIVE_TOOL_CALL,
            "status": {
                "enum": [
                    "ready",
                    "awaiting_approval",
                    "awaiting_client",
                    "running",
                    "completed",
                    "failed",
                ]
            },
        },
    ),
    "tool_result": part(
        "tool_result",
        ["tool_call_id"],
        {"tool_call_id": NON_EMPTY, "result": NOT_NULL, "error": STR},
    ),
    # Opaque replay state (signature, encrypted) is stripped on the wire: not allowed here.
    "reasoning": part(
        "reasoning",
        ["provider"],
        {
            "provider": NON_EMPTY,
            "text": REASONING_TEXT,
            "item_id": STR,
            "bound_tool_call_id": STR,
            "tokens": {"type": "integer", "minimum": 0},
        },
    ),
    "context": part("context", ["tag", "context"], {"tag": NON_EMPTY, "context": STR}),
    "interaction": part(
        "interaction",
        ["interaction_id", "kind", "status"],
        {
            "interaction_id": NON_EMPTY,
            "kind": NON_EMPTY,
            "status": NON_EMPTY,
            "tool_call_id": STR,
            "prompt": STR,
            "response": NOT_NULL,
        },
    ),
    "action": part(
        "action", ["action"], {"action": NON_EMPTY, "data": {"type": "object"}}
    ),
    "error": part("error", ["code", "message"], {"code": NON_EMPTY, "message": STR}),
}
SEED_CONTENT_PART = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"enum": sorted(SEED_PARTS)}},
    "allOf": [
        {"if": {"properties": {"type": {"const": kind}}}, "then": schema}
        for kind, schema in SEED_PARTS.items()
    ],
}
SEED_MESSAGE = closed(
    [
        "id",
        "session_id",
        "sequence",
        "role",
        "content",
        "created_at",
        "updated_at",
        "revision",
        "state",
        "visibility",
    ],
    {
        "id": typed_id("message"),
        "session_id": typed_id("session"),
        "sequence": {"type": "integer", "minimum": 1},
        "role": {"enum": ["user", "agent"]},
        "content": {
            "type": "array",
            "items": {"$ref": "#/components/schemas/SeedContentPart"},
        },
        "phase": {"enum": ["commentary", "final_answer"]},
        "phase_source": {"enum": ["provider", "derived", "communication"]},
        "controls": {"$ref": "#/components/schemas/Controls"},
        "metadata": {"type": "object"},
        "external_actor": {"$ref": "#/components/schemas/ExternalActor"},
        "created_at": TIMESTAMP,
        "updated_at": TIMESTAMP,
        "revision": {"type": "integer", "minimum": 1},
        "state": {"enum": ["streaming", "done"]},
        "visibility": {"enum": ["visible", "internal"]},
        "turn_id": typed_id("turn"),
        "delivery": {"enum": ["started", "steered", "resumed", "duplicate"]},
    },
)
# DESIGN 2.3: the seed's page around upstream's `data`.
SEED_MESSAGE_PAGE = closed(
    ["data", "total", "has_more", "cursor"],
    {
        "data": {"type": "array", "items": {"$ref": "#/components/schemas/Message"}},
        "total": {"type": "integer", "minimum": 0},
        "has_more": {"type": "boolean"},
        "start_sequence": {"type": "integer", "minimum": 1},
        "end_sequence": {"type": "integer", "minimum": 1},
        "next_before_sequence": {"type": "integer", "minimum": 1},
        "cursor": {"type": "string", "pattern": "^[0-9]+$"},
    },
)

# Payload schema per durable event type a scripted turn emits (UPSTREAM-NOTES §4).
PAYLOADS = {
    "input.message": "InputMessageData",
    "session.activated": "SessionActivatedData",
    "turn.started": "TurnStartedData",
    "output.message.started": "OutputMessageStartedData",
    "output.message.completed": "OutputMessageCompletedData",
    "tool.started": "ToolStartedData",
    # `result` is left to test_tool_completed_payload_is_upstreams, so the other
    # scenarios report their own problems.
    "tool.completed": "ToolCompletedDataSansResult",
    "turn.completed": "TurnCompletedData",
    "turn.failed": "TurnFailedData",
    "turn.cancelled": "TurnCancelledData",
    "session.idled": "SessionIdledData",
}
CONTEXT_KEYS = {
    "turn_id",
    "input_message_id",
    "exec_id",
    "trace_id",
    "span_id",
    "parent_span_id",
}
TURN_PREFIX = [
    "input.message",
    "session.activated",
    "turn.started",
    "output.message.started",
]


# ---- upstream's schemas --------------------------------------------------------------


@cache
def spec() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(SPEC_PATH.read_text())
    return document


@cache
def registry(seed_content_parts: bool) -> Registry[Any]:
    """Upstream's document as a registry, with the components UPSTREAM-NOTES calls
    clobbered (utoipa name collisions) replaced by what the wire really carries.
    With `seed_content_parts`, `ContentPart` is the seed's (reasoning, context, ...)."""
    document = copy.deepcopy(spec())
    schemas = document["components"]["schemas"]
    tool_completed = copy.deepcopy(schemas["ToolCompletedData"])
    del tool_completed["properties"]["result"]
    schemas.update(
        {
            "SessionStatus": {
                "type": "string",
                "enum": ["started", "active", "idle", "waitingfortoolresults"],
            },
            "ExecutionPhase": {
                "type": "string",
                "enum": ["commentary", "final_answer"],
            },
            "Message": SEED_MESSAGE,
            "SeedContentPart": SEED_CONTENT_PART,
            "SeedMessagePage": SEED_MESSAGE_PAGE,
            "EventData": {"type": "object"},
            "ToolCompletedDataSansResult": tool_completed,
        }
    )
    if seed_content_parts:
        schemas["ContentPart"] = SEED_CONTENT_PART
    resource = Resource.from_contents(document, default_specification=DRAFT202012)
    built: Registry[Any] = Registry().with_resource(SPEC_URI, resource)
    return built


def validate(instance: Any, name: str, *, seed_content_parts: bool = False) -> None:
    """Validate against `#/components/schemas/<name>`, reporting every violation."""
    validator = Draft202012Validator(
        {"$ref": f"{SPEC_URI}#/components/schemas/{name}"},
        registry=registry(seed_content_parts),
    )
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, f"{name}: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path)) or '$'}: {e.message}"
        for e in errors[:10]
    )


@pytest.fixture(autouse=True)
def upstream_spec() -> None:
    if not SPEC_PATH.exists():
        pytest.skip(
            f"upstream OpenAPI subset not found at {SPEC_PATH} (set EVERRUNS_SPEC)"
        )


# ---- helpers -------------------------------------------------------------------------


def parse_ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def check_message(message: dict[str, Any], *, created: bool = False) -> None:
    validate(message, "Message")
    assert find_nulls(message) == [], find_nulls(message)
    assert ("delivery" in message) is created
    assert uuid_of(message["id"]).version == 4, "message ids are UUIDv4, as upstream"
    assert "provider_opaque" not in {p["type"] for p in message["content"]}
    part_ids = [p["part_id"] for p in message["content"]]
    assert len(set(part_ids)) == len(part_ids), f"duplicate part_id in {part_ids}"
    sequences = [p["sequence"] for p in message["content"]]
    assert sequences == sorted(set(sequences)), f"parts out of order: {sequences}"
    assert parse_ts(message["updated_at"]) >= parse_ts(message["created_at"])
    if message["role"] == "user":
        assert message["state"] == "done"
        assert message["revision"] == 1
        for key in ("phase", "phase_source"):
            assert key not in message, f"user messages carry no {key}"
    if "turn_id" in message:
        assert uuid_of(message["turn_id"]).version == 7


def check_session(session: dict[str, Any], base: str = "http://test/v1") -> None:
    validate(session, "WithUrls_Session")
    assert find_nulls(session) == [], find_nulls(session)
    for key in ("created_at", "updated_at", "started_at", "finished_at"):
        if key in session:
            assert RESOURCE_TS.match(session[key]), session[key]
    assert re.fullmatch(r"session_[0-9a-f]{32}", session["id"])
    assert uuid_of(session["id"]).version == 7, "session ids are UUIDv7"
    assert re.fullmatch(r"org_[0-9a-f]{32}", session["organization_id"])
    assert re.fullmatch(r"harness_[0-9a-f]{32}", session["harness_id"])
    assert re.fullmatch(r"principal_[0-9a-f]{32}", session["owner_principal_id"])
    assert re.fullmatch(r"wsp_[0-9a-f]{32}", session["workspace_id"])
    assert session["self_url"] == f"{base}/sessions/{session['id']}"
    assert session["view_url"] == session["ui_link"]
    assert session["view_url"].endswith(f"/sessions/{session['id']}/chat")
    assert isinstance(session["tags"], list)


def check_event(event: dict[str, Any], session_id: str) -> None:
    validate(event, "Event")
    assert find_nulls(event) == [], f"{event['type']}: nulls at {find_nulls(event)}"
    assert re.fullmatch(r"event_[0-9a-f]{32}", event["id"])
    assert uuid_of(event["id"]).version == 7, "event ids are UUIDv7"
    assert EVENT_TS.match(event["ts"]), f"ts {event['ts']!r} is not ms precision + Z"
    assert event["session_id"] == session_id
    assert isinstance(event["sequence"], int)
    assert event["sequence"] >= 1
    assert set(event["context"]) <= CONTEXT_KEYS, event["context"]
    if "turn_id" in event["context"]:
        assert re.fullmatch(r"turn_[0-9a-f]{32}", event["context"]["turn_id"])
    if "input_message_id" in event["context"]:
        assert re.fullmatch(
            r"message_[0-9a-f]{32}", event["context"]["input_message_id"]
        )
    assert event["type"] in PAYLOADS, f"unexpected durable event {event['type']}"
    validate(event["data"], PAYLOADS[event["type"]])


async def new_session(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    response = await client.post("/v1/sessions", json=fields)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def run_turn(
    client: httpx.AsyncClient, sid: str, content: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """POST a user message and wait until its turn is over; returns the 201 body."""
    response = await client.post(
        f"/v1/sessions/{sid}/messages", json={"message": {"content": content}, **extra}
    )
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    check_message(created, created=True)
    assert created["delivery"] == "started"
    await wait_idle(client, sid)
    return created


async def read_messages(
    client: httpx.AsyncClient, sid: str, **params: Any
) -> list[dict[str, Any]]:
    """The session's messages, checked: the page envelope, each Message, and that
    GET .../messages/{id} returns exactly the listed snapshot."""
    response = await client.get(f"/v1/sessions/{sid}/messages", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    page = response.json()
    validate(page, "SeedMessagePage")
    # Upstream's ListResponse<Message>, for clients that read only `data`.
    validate(page, "ListResponse_Message", seed_content_parts=True)
    messages: list[dict[str, Any]] = page["data"]
    if messages:
        assert page["start_sequence"] == messages[0]["sequence"]
        assert page["end_sequence"] == messages[-1]["sequence"]
    else:
        assert "start_sequence" not in page
        assert "end_sequence" not in page
    assert ("next_before_sequence" in page) is page["has_more"]
    for message in messages:
        check_message(message)
        assert message["session_id"] == sid
        one = await client.get(f"/v1/sessions/{sid}/messages/{message['id']}")
        assert one.status_code == 200, one.text
        assert one.json() == message
    return messages


async def read_events(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/sessions/{sid}/events")
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"data"}
    validate(body, "ListResponse_Event")
    events: list[dict[str, Any]] = body["data"]
    for event in events:
        check_event(event, sid)
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1)), (
        "event sequences are dense from 1"
    )
    assert len({e["id"] for e in events}) == len(events)
    return events


def check_turn_consistency(
    messages: list[dict[str, Any]], events: list[dict[str, Any]]
) -> None:
    """Messages are projections of the log: a message's sequence is the sequence of the
    event that created it, its revision counts its checkpoints, and the newest
    checkpoint event carries exactly the snapshot the API serves."""
    by_id = {m["id"]: m for m in messages}
    for event in events:
        data = event["data"]
        if event["type"] == "input.message":
            message = by_id[data["message"]["id"]]
            assert message["sequence"] == event["sequence"]
            assert data["message"] == message
            assert event["context"]["input_message_id"] == message["id"]
        elif event["type"] == "output.message.started":
            assert by_id[data["message_id"]]["sequence"] == event["sequence"]
    for message in messages:
        if message["role"] != "agent":
            continue
        completed = [
            e["data"]["message"]
            for e in events
            if e["type"] == "output.message.completed"
            and e["data"]["message"]["id"] == message["id"]
        ]
        assert completed, f"no output.message.completed for {message['id']}"
        assert completed[-1] == message, "the last checkpoint event differs from GET"
        assert [m["revision"] for m in completed] == sorted(
            {m["revision"] for m in completed}
        )
        turn_events = [
            e
            for e in events
            if e["context"].get("turn_id") == message["turn_id"]
            and e["type"]
            in (
                "output.message.started",
                "output.message.completed",
                "tool.started",
                "tool.completed",
            )
        ]
        assert message["revision"] == len(turn_events), (
            "revision is +1 at every durable checkpoint"
        )
        assert message["state"] == "done"


def agent_message(messages: list[dict[str, Any]]) -> dict[str, Any]:
    agents = [m for m in messages if m["role"] == "agent"]
    assert len(agents) == 1, f"expected one agent message, got {len(agents)}"
    return agents[0]


# ---- scenarios -----------------------------------------------------------------------


SCENARIOS: dict[str, list[str]] = {
    "echo": ["output.message.completed", "turn.completed", "session.idled"],
    "tool": [
        "output.message.completed",
        "tool.started",
        "tool.completed",
        "output.message.completed",
        "turn.completed",
        "session.idled",
    ],
    "reasoning": ["output.message.completed", "turn.completed", "session.idled"],
    "citations": ["output.message.completed", "turn.completed", "session.idled"],
    "fail": ["output.message.completed", "turn.failed", "session.idled"],
    "long": ["output.message.completed", "turn.completed", "session.idled"],
}
PROMPTS = {
    "echo": "hello shapes world",
    "tool": "/scenario tool",
    "reasoning": "/scenario reasoning",
    "citations": "/scenario citations",
    "fail": "/scenario fail",
    "long": "/scenario long 25",
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_scenario_turn_shapes(client: httpx.AsyncClient, scenario: str) -> None:
    session = await new_session(client, title=f"shapes {scenario}")
    sid = session["id"]
    prompt = PROMPTS[scenario]
    created = await run_turn(client, sid, [{"type": "text", "text": prompt}])
    assert created["content"] == [
        {
            "type": "text",
            "text": prompt,
            "part_id": created["content"][0]["part_id"],
            "sequence": 1,
        }
    ]

    messages = await read_messages(client, sid)
    events = await read_events(client, sid)
    assert [e["type"] for e in events] == TURN_PREFIX + SCENARIOS[scenario]
    check_turn_consistency(messages, events)
    user, agent = messages
    assert {k: v for k, v in created.items() if k != "delivery"} == user
    assert agent["turn_id"] == user["turn_id"]
    assert agent["sequence"] > user["sequence"]
    turn_id = user["turn_id"]
    assert {e["context"].get("turn_id") for e in events} == {turn_id}

    content = agent["content"]
    kinds = [p["type"] for p in content]
    if scenario == "fail":
        assert kinds == ["text", "error"], (
            "what the step streamed is kept, an error part closes"
        )
        assert content[0]["text"] == "Starting an answer that will not"
        assert content[0]["step_id"] == "step_1"
        assert content[1]["code"] == "model_error"
        assert "phase" not in agent
        failed = next(e for e in events if e["type"] == "turn.failed")["data"]
        assert failed["turn_id"] == turn_id
        assert failed["error_code"] == "model_error"
        completed = [e for e in events if e["type"] == "output.message.completed"]
        assert completed[-1]["data"]["error_code"] == "model_error"
        return

    assert agent["phase"] == "final_answer"
    assert agent["phase_source"] == "provider"
    assert all(p["step_id"].startswith("step_") for p in content)
    done = next(e for e in events if e["type"] == "turn.completed")["data"]
    assert done["turn_id"] == turn_id
    assert done["final_message_id"] == agent["id"]
    if scenario == "echo":
        assert kinds == ["text"]
        assert content[0]["text"] == prompt
        assert "annotations" not in content[0]
    elif scenario == "long":
        assert kinds == ["text"]
        assert content[0]["text"] == "".join(f"chunk{i} " for i in range(25))
    elif scenario == "reasoning":
        assert kinds == ["reasoning", "text"]
        assert content[0]["text"] == {
            "kind": "plain",
            "text": "Thinking about the question.",
        }
        assert content[0]["provider"]
        assert content[1]["text"] == "Here is a considered answer."
    elif scenario == "citations":
        assert kinds == ["text"]
        text = content[0]["text"]
        annotations = content[0]["annotations"]
        assert len(annotations) == 1
        for annotation in annotations:
            validate(annotation, "TextAnnotation")
            assert 0 <= annotation["start"] < annotation["end"] <= len(text)
        assert annotations[0]["verified"]["status"] == "entailed"
    elif scenario == "tool":
        check_tool_message(agent, events)


def check_tool_message(agent: dict[str, Any], events: list[dict[str, Any]]) -> None:
    """The tool's transitions updated its one tool_call part in place and appended one
    tool_result: no duplicate request/result parts or messages."""
    content = agent["content"]
    assert [p["type"] for p in content] == ["text", "tool_call", "tool_result", "text"]
    call, result = content[1], content[2]
    assert call["id"] == "call_lookup_1"
    assert call["name"] == "lookup"
    assert call["arguments"] == {"query": "the answer"}
    assert call["status"] == "completed"
    assert result["tool_call_id"] == call["id"]
    assert result["result"] == {"query": "the answer", "answer": 42}
    assert "error" not in result
    assert [p["step_id"] for p in content] == ["step_1"] * 3 + ["step_2"]
    # Every earlier snapshot's parts keep their part_id, sequence and type.
    snapshots = [
        e["data"]["message"] for e in events if e["type"] == "output.message.completed"
    ]
    first = snapshots[0]
    assert first["state"] == "streaming"
    assert first["phase"] == "commentary"
    assert [p["status"] for p in first["content"] if p["type"] == "tool_call"] == [
        "ready"
    ]
    for earlier in snapshots:
        for old, new in zip(earlier["content"], content, strict=False):
            assert (old["part_id"], old["sequence"], old["type"]) == (
                new["part_id"],
                new["sequence"],
                new["type"],
            )
    started = next(e for e in events if e["type"] == "tool.started")["data"]
    validate(started["tool_call"], "ToolCall")
    assert started["tool_call"] == {
        "id": call["id"],
        "name": call["name"],
        "arguments": call["arguments"],
    }
    completed = next(e for e in events if e["type"] == "tool.completed")["data"]
    assert completed["tool_call_id"] == call["id"]
    assert completed["tool_name"] == "lookup"
    assert completed["success"] is True


async def test_tool_completed_payload_is_upstreams(client: httpx.AsyncClient) -> None:
    """Upstream's ToolCompletedData: `status` is "success"|"error"|"timeout"|"cancelled"
    and `result` is an array of ContentPart (e.g. `[{"type":"text","text":...}]`)."""
    sid = (await new_session(client))["id"]
    await run_turn(client, sid, [{"type": "text", "text": "/scenario tool"}])
    events = await read_events(client, sid)
    completed = next(e for e in events if e["type"] == "tool.completed")["data"]
    assert completed["status"] in {"success", "error", "timeout", "cancelled"}, (
        completed
    )
    validate(completed, "ToolCompletedData")


async def test_cancelled_turn_shapes(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["id"]
    await post_message(client, sid, "/scenario long 5000")

    async def streaming() -> bool:
        events = await list_events(client, sid)
        return any(e["type"] == "output.message.started" for e in events)

    await wait_until(streaming, "output.message.started", within=20, interval=0.02)
    cancelled = await client.post(f"/v1/sessions/{sid}/cancel")
    assert cancelled.status_code == 200
    validate(cancelled.json(), "CancelTurnResponse")
    assert cancelled.json()["status"] == "cancelled"
    await wait_idle(client, sid)
    again = await client.post(f"/v1/sessions/{sid}/cancel")
    assert again.json() == {"status": "no_op", "message": "No turn was running"}

    messages = await read_messages(client, sid)
    events = await read_events(client, sid)
    assert [e["type"] for e in events][-2:] == ["turn.cancelled", "session.idled"]
    assert "turn.completed" not in [e["type"] for e in events]
    check_turn_consistency(messages, events)
    agent = agent_message(messages)
    assert agent["content"][-1]["type"] == "error"
    assert agent["content"][-1]["code"] == "cancelled"


async def test_user_parts_round_trip(client: httpx.AsyncClient) -> None:
    sent: list[dict[str, Any]] = [
        {"type": "text", "text": "look at these"},
        {
            "type": "image",
            "url": "https://example.com/a.png",
            "media_type": "image/png",
        },
        {"type": "image", "base64": "iVBORw0KGgo=", "media_type": "image/png"},
        {"type": "image_file", "image_id": f"img_{HEX32}", "filename": "chart.png"},
        {"type": "image_file", "image_id": f"img_{HEX32[::-1]}"},
        {"type": "file", "file_id": f"file_{HEX32}", "filename": "report.pdf"},
        {"type": "file", "file_id": f"file_{HEX32[::-1]}", "filename": None},
        {"type": "context", "tag": "reference", "context": "Earlier message"},
        {"type": "text", "text": "and this", "unknown_field": {"ignored": True}},
    ]
    sid = (await new_session(client))["id"]
    created = await run_turn(client, sid, sent)
    expected = [
        {
            **{k: v for k, v in p.items() if v is not None and k != "unknown_field"},
            "part_id": created["content"][i]["part_id"],
            "sequence": i + 1,
        }
        for i, p in enumerate(sent)
    ]
    assert created["content"] == expected
    messages = await read_messages(client, sid)
    user = messages[0]
    assert user["content"] == expected
    agent = agent_message(messages)
    assert [p["type"] for p in agent["content"]] == ["text"]
    assert agent["content"][0]["text"] == "look at these and this"
    check_turn_consistency(messages, await read_events(client, sid))


async def test_message_level_fields(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["id"]
    controls = {
        "model_id": SCRIPTED_MODEL_ID,
        "reasoning": {"effort": "low"},
        "locale": "uk-UA",
        "hints": {"rich_media": True},
        "error_disclosure": "generic",
        "verbosity": "high",
    }
    actor = {"actor_id": "U0123", "source": "slack", "actor_name": "Alice"}
    created = await run_turn(
        client,
        sid,
        [{"type": "text", "text": "hi"}],
        controls=controls,
        metadata={"k": "v"},
        tags=["a", "b"],
        external_actor=actor,
        client_message_id="cmid-1",
        addressed_participant_id="part_ignored",
    )
    assert created["controls"] == controls
    validate(created["controls"], "Controls")
    assert created["external_actor"] == actor
    validate(created["external_actor"], "ExternalActor")
    assert created["metadata"] == {
        "k": "v",
        "tags": ["a", "b"],
        "everruns_client_message_id": "cmid-1",
    }
    listed = (await read_messages(client, sid))[0]
    assert {k: v for k, v in created.items() if k != "delivery"} == listed

    # A retry of the same request (unknown fields aside) is the stored message.
    duplicate = await client.post(
        f"/v1/sessions/{sid}/messages",
        json={
            "message": {"content": [{"type": "text", "text": "hi"}]},
            "controls": controls,
            "metadata": {"k": "v"},
            "tags": ["a", "b"],
            "external_actor": actor,
            "client_message_id": "cmid-1",
        },
    )
    assert duplicate.status_code == 201, duplicate.text
    check_message(duplicate.json(), created=True)
    assert duplicate.json() == {**listed, "delivery": "duplicate"}


async def test_internal_visibility(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["id"]
    await run_turn(client, sid, [{"type": "text", "text": "visible"}])
    internal = await post_message(client, sid, "audit", visibility="internal")
    check_message(internal, created=True)
    assert internal["visibility"] == "internal"
    await wait_idle(client, sid)
    visible = await read_messages(client, sid)
    assert internal["id"] not in {m["id"] for m in visible}
    assert {m["visibility"] for m in visible} == {"visible"}
    everything = await read_messages(client, sid, include_internal="true")
    assert internal["id"] in {m["id"] for m in everything}


async def test_provider_opaque_parts_are_never_returned(running: Running) -> None:
    """Kept in the database for replay; absent from every API response and event."""
    client = running.client
    sid = (await new_session(client))["id"]
    session_id = uuid_of(sid)
    opaque = {"type": "provider_opaque", "provider": "openai", "content": {"rs": "x"}}
    database = running.app.state.app.database
    async with database.write() as db:
        session = await lock_session(db, session_id)
        assert session is not None
        opened = await checkpoint.open_agent_message(db, session, turn_id=uuid7())
        assert opened.message is not None
        await checkpoint.commit_step(
            db,
            session,
            opened.message,
            step_id="step_1",
            parts=[
                {"type": "text", "text": "before"},
                opaque,
                {"type": "text", "text": "after"},
            ],
            phase="final_answer",
            close=True,
        )
        message_id = opened.message.id
    async with database.read() as db:
        stored = await db.scalar(
            select(models.Message.content).where(models.Message.id == message_id)
        )
    assert stored is not None
    assert [p["type"] for p in stored] == ["text", "provider_opaque", "text"]

    messages = await read_messages(client, sid)
    assert [p["type"] for p in messages[0]["content"]] == ["text", "text"]
    assert [p["text"] for p in messages[0]["content"]] == ["before", "after"]
    events = (await client.get(f"/v1/sessions/{sid}/events")).json()["data"]
    assert events
    assert "provider_opaque" not in json.dumps(events)
    assert "provider_opaque" not in json.dumps(messages)


# ---- sessions ------------------------------------------------------------------------


async def test_session_create_get_patch_shapes(client: httpx.AsyncClient) -> None:
    fields = {
        "title": "Quarterly plan",
        "tags": ["q3", "draft"],
        "locale": "uk-UA",
        "goal": "Plan the quarter",
        "hints": {"rich_media": True},
        "metadata": {"team": "core"},
        "model_id": SCRIPTED_MODEL_ID,
        "agent_id": f"agent_{HEX32}",
        "max_iterations": 5,
        "source": "api",
        "capabilities": [{"ref": "ignored"}],
    }
    response = await client.post("/v1/sessions", json=fields)
    assert response.status_code == 201
    session = response.json()
    check_session(session)
    assert response.headers["location"] == session["self_url"]
    assert session["status"] == "started"
    assert session["created_at"] == session["updated_at"]
    for key, value in fields.items():
        if key != "capabilities":
            assert session[key] == value, key
    assert "started_at" not in session
    assert "finished_at" not in session

    got = await client.get(f"/v1/sessions/{session['id']}")
    assert got.status_code == 200
    assert got.json() == session
    follow = await client.get(response.headers["location"])
    assert follow.json() == session

    bare = await new_session(client)
    check_session(bare)
    assert "title" not in bare
    assert bare["tags"] == []

    patched = await client.patch(
        f"/v1/sessions/{session['id']}", json={"title": "Renamed", "tags": []}
    )
    assert patched.status_code == 200
    check_session(patched.json())
    assert patched.json()["title"] == "Renamed"
    assert patched.json()["tags"] == []
    assert parse_ts(patched.json()["updated_at"]) >= parse_ts(session["updated_at"])

    cancel = await client.post(f"/v1/sessions/{session['id']}/cancel")
    assert cancel.status_code == 200
    validate(cancel.json(), "CancelTurnResponse")
    assert cancel.json() == {"status": "no_op", "message": "No turn was running"}


async def test_session_after_a_turn(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["id"]
    await run_turn(client, sid, [{"type": "text", "text": "hi"}])
    session = (await client.get(f"/v1/sessions/{sid}")).json()
    check_session(session)
    assert session["status"] == "idle"
    assert parse_ts(session["started_at"]) <= parse_ts(session["finished_at"])


async def test_session_shapes_under_api_prefix(client: httpx.AsyncClient) -> None:
    response = await client.post("/api/v1/sessions", json={"title": "sdk"})
    assert response.status_code == 201
    session = response.json()
    check_session(session, base="http://test/api/v1")
    assert response.headers["location"] == session["self_url"]
    listed = (await client.get("/api/v1/sessions", params={"limit": 1})).json()
    validate(listed, "PaginatedResponse_WithUrls_Session")
    assert listed["data"][0] == session


async def test_session_list_envelope(client: httpx.AsyncClient) -> None:
    ids = [(await new_session(client, title=f"s{i}"))["id"] for i in range(3)]
    full = await client.get("/v1/sessions")
    assert full.status_code == 200
    body = full.json()
    validate(body, "PaginatedResponse_WithUrls_Session")
    assert find_nulls(body) == []
    assert (body["total"], body["offset"], body["limit"]) == (3, 0, 20)
    assert "next_url" not in body
    assert "prev_url" not in body
    assert [s["id"] for s in body["data"]] == ids[::-1], "newest first"
    for session in body["data"]:
        check_session(session)

    pages = []
    for offset in range(3):
        page = (
            await client.get("/v1/sessions", params={"offset": offset, "limit": 1})
        ).json()
        validate(page, "PaginatedResponse_WithUrls_Session")
        assert find_nulls(page) == []
        assert (page["total"], page["offset"], page["limit"]) == (3, offset, 1)
        assert ("prev_url" in page) is (offset > 0)
        assert ("next_url" in page) is (offset < 2)
        pages.append(page)
    assert [p["data"][0]["id"] for p in pages] == ids[::-1]
    following = (await client.get(pages[0]["next_url"])).json()
    assert following == pages[1]
    back = (await client.get(pages[2]["prev_url"])).json()
    assert back == pages[1]

    empty = (await client.get("/v1/sessions", params={"offset": 10})).json()
    validate(empty, "PaginatedResponse_WithUrls_Session")
    assert empty["data"] == []
    assert empty["total"] == 3


# ---- events --------------------------------------------------------------------------


async def test_event_list_envelope_and_limit(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["id"]
    empty = await client.get(f"/v1/sessions/{sid}/events")
    assert empty.json() == {"data": []}
    await run_turn(client, sid, [{"type": "text", "text": "one"}])
    events = await read_events(client, sid)
    response = await client.get(f"/v1/sessions/{sid}/events", params={"limit": 2})
    assert response.status_code == 200
    body = response.json()
    validate(body, "ListResponse_Event")
    assert body["data"] == events[-2:]
    assert response.headers["x-total-count"] == str(len(events))
    filtered = (
        await client.get(
            f"/v1/sessions/{sid}/events",
            params=[("types", "turn.started"), ("types", "session.idled")],
        )
    ).json()
    assert [e["type"] for e in filtered["data"]] == ["turn.started", "session.idled"]
    after = (
        await client.get(
            f"/v1/sessions/{sid}/events", params={"since_id": events[2]["id"]}
        )
    ).json()
    assert after["data"] == events[3:]


async def test_event_payloads_omit_absent_fields_instead_of_null(
    client: httpx.AsyncClient,
) -> None:
    """Upstream serializes optional payload fields with skip_serializing_if: a turn
    started by a message without text has no `input_content`, rather than null."""
    sid = (await new_session(client))["id"]
    await run_turn(client, sid, [{"type": "image", "url": "https://example.com/a.png"}])
    events = (await client.get(f"/v1/sessions/{sid}/events")).json()["data"]
    for event in events:
        assert find_nulls(event) == [], f"{event['type']}: nulls at {find_nulls(event)}"
    started = next(e for e in events if e["type"] == "turn.started")["data"]
    validate(started, "TurnStartedData")
    assert "input_content" not in started
