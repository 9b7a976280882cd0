"""The parts of a message as the journal writes them: their identity (part ids, sequences,
steps), a tool call's part and result, the checks of its life cycle, and the errors of
a checkpoint that would break a message invariant. Pure functions, no database."""

from collections.abc import Sequence
from typing import Any

from app import wire
from app.db.rows import MessageRow
from app.ids import format_id
from app.journal import lifecycle
from app.journal.events import EventSpec


class CheckpointError(Exception):
    """A checkpoint that would break a message invariant (closed message, unknown part)."""


class ToolTransitionError(CheckpointError):
    """A tool state change the life cycle does not allow (app/journal/lifecycle.py)."""


def part_id(role: str, part_type: str, sequence: int) -> str:
    return f"{role}-{part_type}:{sequence}"


def number_parts(
    role: str,
    existing: Sequence[dict[str, Any]],
    parts: Sequence[dict[str, Any]],
    step_id: str | None = None,
) -> list[dict[str, Any]]:
    """Give new parts their stable identity: the next sequences, a part_id and a step_id.
    Parts that arrive with a part_id (announced by the live projection) keep it."""
    taken = {p["part_id"] for p in existing}
    numbered = []
    for offset, part in enumerate(parts, start=len(existing) + 1):
        part = dict(part)
        part.setdefault("part_id", part_id(role, part["type"], offset))
        if part["part_id"] in taken:
            raise CheckpointError(f"duplicate part_id {part['part_id']}")
        taken.add(part["part_id"])
        part["sequence"] = offset
        if step_id is not None:
            part["step_id"] = step_id
        numbered.append(part)
    return numbered


def entering(part: dict[str, Any]) -> dict[str, Any]:
    """A tool call enters a committed step `ready` (or `failed`, when it cannot run at
    all, as with arguments that are not JSON); it is never committed while its input
    streams."""
    if part.get("type") != "tool_call":
        return part
    status = part.get("status") or lifecycle.READY
    if lifecycle.current(status) not in (lifecycle.READY, lifecycle.FAILED):
        raise ToolTransitionError(
            f"tool call {part.get('id')} cannot be committed as {status!r}: a step "
            "commits its tool calls ready (or failed)"
        )
    return {**part, "status": lifecycle.current(status)}


def tool_call(part: dict[str, Any]) -> dict[str, Any]:
    return {"id": part["id"], "name": part["name"], "arguments": part.get("arguments")}


def check_transition(part: dict[str, Any], status: str) -> None:
    if not lifecycle.allowed(part.get("status"), status):
        raise ToolTransitionError(
            f"tool call {part['id']} cannot go from "
            f"{lifecycle.current(part.get('status'))!r} to {status!r}"
        )


def tool_result(tool_call_id: str, result: Any, error: str | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "tool_result", "tool_call_id": tool_call_id}
    if result is not None:
        part["result"] = result
    if error is not None:
        part["error"] = error
    return part


def tool_completed(
    message: MessageRow,
    part: dict[str, Any],
    status: str,
    *,
    result: Any = None,
    error: str | None = None,
    duration_ms: int | None = None,
    extra: dict[str, Any] | None = None,
) -> EventSpec:
    data: dict[str, Any] = {
        "tool_call_id": part["id"],
        "tool_name": part["name"],
        # Upstream's ToolCompleted: status "success"|"error", result as content parts.
        "status": "success" if status == lifecycle.COMPLETED else "error",
        "success": status == lifecycle.COMPLETED,
    }
    if result is not None:
        text = result if isinstance(result, str) else wire.dumps(result).decode()
        data["result"] = [{"type": "text", "text": text}]
    if error is not None:
        data["error"] = error
    if duration_ms is not None:
        data["duration_ms"] = duration_ms
    data.update(extra or {})
    return EventSpec("tool.completed", data, turn_id=message.turn_id)


def find_part(message: MessageRow, **match: Any) -> tuple[int, dict[str, Any]]:
    for index, part in enumerate(message.content):
        if all(part.get(k) == v for k, v in match.items()):
            return index, part
    raise CheckpointError(
        f"no part matching {match} in message {format_id('message', message.id)}"
    )
