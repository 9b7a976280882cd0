"""Render a message row to its wire JSON once per checkpoint (render at write, serve at read)."""

from typing import Any

from app import wire
from app.db.rows import MessageRow
from app.ids import format_id

# Kept for replay, never returned by the API.
HIDDEN_PART_TYPES = frozenset({"provider_opaque"})
# Fields of `extra` that appear on the wire, in upstream's order; then `origin`, the
# message a forked session's copy was made from.
EXTRA_FIELDS = (
    "phase",
    "phase_source",
    "controls",
    "metadata",
    "external_actor",
    "origin",
)


def wire_content(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [part for part in content if part.get("type") not in HIDDEN_PART_TYPES]


def message_wire(row: MessageRow) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": format_id("message", row.id),
        "session_id": format_id("session", row.session_id),
        "sequence": row.sequence,
        "role": row.role,
        "content": wire_content(row.content),
    }
    for key in EXTRA_FIELDS:
        value = row.extra.get(key)
        if value is not None:
            body[key] = value
    created = wire.timestamp(row.created_at)
    body["created_at"] = created
    # A new message's two times are one: formatted once.
    body["updated_at"] = (
        created if row.updated_at == row.created_at else wire.timestamp(row.updated_at)
    )
    body["revision"] = row.revision
    body["state"] = row.state
    body["visibility"] = row.visibility
    if row.turn_id is not None:
        body["turn_id"] = format_id("turn", row.turn_id)
    return body


def render(row: MessageRow) -> dict[str, Any]:
    """Refresh the stored snapshot from the row's current fields; returns the wire
    object, which the checkpoint's events carry too."""
    body = message_wire(row)
    row.snapshot = wire.dumps(body).decode()
    return body
