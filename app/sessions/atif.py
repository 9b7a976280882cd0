"""A session as an ATIF trajectory (`GET /v1/sessions/{id}/export?format=atif`): the
Agent Trajectory Interchange Format, v1.4, one JSON document.

Steps in the session's order: the system prompt (when the session has one), then each
user message as a `user` step and each model step of an agent message (its parts
grouped by `step_id`) as an `agent` step: its text as `message`, its reasoning as
`reasoning_content`, its tool calls, and their results as the step's `observation`.
Every step's `extra` names the message it comes from. `final_metrics` holds the
session's cumulative token usage (ATIF's `prompt_tokens` include cached reads, so
they are `input_tokens` plus `cache_read_tokens`). Read and streamed as the JSON Lines
export is: in batches, up to the sequence the session had when the export began.
"""

import uuid
from collections.abc import AsyncIterator, Iterator
from importlib import metadata
from typing import Any

from app import wire
from app.db.reads import Reads
from app.sessions.export import EXPORT_BATCH

SCHEMA_VERSION = "ATIF-v1.4"


def _version() -> str:
    try:
        return metadata.version("evermirror")
    except metadata.PackageNotFoundError:
        return "0"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else wire.dumps(value).decode()


def _joined(parts: list[dict[str, Any]], kind: str) -> str:
    out = []
    for part in parts:
        if part.get("type") != kind:
            continue
        text = part.get("text")
        if isinstance(text, dict):
            text = text.get("text") or "\n\n".join(map(str, text.get("parts") or ()))
        if isinstance(text, str):
            out.append(text)
    return "".join(out)


def _agent_step(message: dict[str, Any], parts: list[dict[str, Any]]) -> dict[str, Any]:
    step: dict[str, Any] = {
        "timestamp": message["created_at"],
        "source": "agent",
        "message": _joined(parts, "text"),
    }
    reasoning = _joined(parts, "reasoning")
    if reasoning:
        step["reasoning_content"] = reasoning
    calls = [
        {
            "tool_call_id": p["id"],
            "function_name": p["name"],
            "arguments": a
            if isinstance(a := p.get("arguments"), dict)
            else {"value": a},
        }
        for p in parts
        if p.get("type") == "tool_call"
    ]
    if calls:
        step["tool_calls"] = calls
    results = [
        {
            "source_call_id": p["tool_call_id"],
            "content": f"error: {p['error']}"
            if p.get("error") is not None
            else _text(p.get("result")),
        }
        for p in parts
        if p.get("type") == "tool_result"
    ]
    if results:
        step["observation"] = {"results": results}
    return step


def steps_of(message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A stored message's ATIF steps (without their `step_id`)."""
    extra: dict[str, Any] = {"message_id": message["id"]}
    if message.get("visibility") == "internal":
        extra["visibility"] = "internal"
    content: list[dict[str, Any]] = message.get("content", [])
    if message.get("role") == "user":
        yield {
            "timestamp": message["created_at"],
            "source": "user",
            "message": _joined(content, "text"),
            "extra": extra,
        }
        return
    groups: list[list[dict[str, Any]]] = []
    current: object = None
    for part in content:
        step_id = part.get("step_id")
        if not groups or (step_id is not None and step_id != current):
            groups.append([])
            current = step_id if step_id is not None else current
        groups[-1].append(part)
    for parts in groups:
        yield {**_agent_step(message, parts), "extra": extra}


def _final_metrics(session: dict[str, Any], steps: int) -> dict[str, Any]:
    metrics: dict[str, Any] = {"total_steps": steps}
    usage = session.get("usage")
    if isinstance(usage, dict):
        cached = usage.get("cache_read_tokens") or 0
        metrics["total_prompt_tokens"] = usage.get("input_tokens", 0) + cached
        metrics["total_completion_tokens"] = usage.get("output_tokens", 0)
        metrics["total_cached_tokens"] = cached
        if usage.get("actual_cost_usd") is not None:
            metrics["total_cost_usd"] = usage["actual_cost_usd"]
    return metrics


async def trajectory(
    reads: Reads, session_id: uuid.UUID, upto: int, session: dict[str, Any]
) -> AsyncIterator[bytes]:
    agent: dict[str, Any] = {"name": "evermirror", "version": _version()}
    if session.get("model_id"):
        agent["model_name"] = session["model_id"]
    head = {
        "schema_version": SCHEMA_VERSION,
        "session_id": session["id"],
        "agent": agent,
    }
    yield wire.dumps(head)[:-1] + b',"steps":['
    count = 0
    if session.get("system_prompt"):
        count += 1
        system = {
            "step_id": count,
            "source": "system",
            "message": session["system_prompt"],
        }
        yield wire.dumps(system)
    after = 0
    while True:
        rows = await reads.rows_after(
            "messages", session_id, after=after, upto=upto, limit=EXPORT_BATCH
        )
        out = bytearray()
        for _, body in rows:
            for step in steps_of(wire.loads(body)):
                count += 1
                out += (b"," if count > 1 else b"") + wire.dumps(
                    {"step_id": count, **step}
                )
        if out:
            yield bytes(out)
        if len(rows) < EXPORT_BATCH:
            break
        after = rows[-1][0]
    yield b'],"final_metrics":' + wire.dumps(_final_metrics(session, count)) + b"}"
