"""Actions: what a `PATCH /v1/sessions/{id}` changed in the configuration a turn runs
with, recorded in the conversation by the seed's Action ownership rule.

A change of `model_id`, `approval_mode`, `system_prompt` or `tools` is an `action`
part. While the session's turn has a streaming agent message, the parts join it (same
message, revision + 1); otherwise they are a standalone agent message holding just
them. The new configuration applies from the turn's next step: the runner reads it
before every step. A title or model change is also upstream's durable event
(`session.title.updated`, `session.model.changed`), which the Mutation stream sends as
a `session` frame. All of it is one checkpoint, in the PATCH's transaction."""

from collections.abc import Callable
from typing import Any

from app.db import models
from app.db.writes import Write
from app.journal import checkpoint
from app.journal.actions import action_part, append_actions
from app.journal.events import EventSpec
from app.journal.sessions import lock_session
from app.schemas import ActionType

# Session attribute -> action_type. Only these change what a turn does.
ACTION_TYPES: dict[str, ActionType] = {
    "model_id": "model_changed",
    "approval_mode": "approval_mode_changed",
    "system_prompt": "system_prompt_changed",
    "tools": "tools_changed",
}


def _title(field: str, new: Any, model_name: Callable[[str | None], str]) -> str:
    if field == "model_id":
        return f"Model changed to {model_name(new)}"
    if field == "approval_mode":
        return f"Approval mode set to {new or 'ask'}"
    if field == "system_prompt":
        return "System prompt cleared" if new is None else "System prompt changed"
    names = [tool.get("name") for tool in new or ()]
    return "Tools changed: " + (", ".join(str(n) for n in names) if names else "none")


def _data(field: str, old: Any, new: Any) -> dict[str, Any]:
    """What an action part holds of a change. A tool list by its names (the new list's,
    and those added, removed or redefined), never the definitions: a turn waiting for
    a client may see many PATCHes of a large list, and each would otherwise add two
    whole copies to one message. A system prompt by its new text only (the old one is
    the previous action's)."""
    if field == "tools":
        before = {tool["name"]: tool for tool in old or ()}
        after = {tool["name"]: tool for tool in new or ()}
        return {
            "field": field,
            "names": list(after),
            "added": [name for name in after if name not in before],
            "removed": [name for name in before if name not in after],
            "changed": [
                name
                for name, tool in after.items()
                if name in before and before[name] != tool
            ],
        }
    if field == "system_prompt":
        return {"field": field, "new": new}
    return {"field": field, "old": old, "new": new}


async def record_changes(
    db: Write,
    before: models.Session,
    after: models.Session,
    *,
    model_name: Callable[[str | None], str],
) -> None:
    """One checkpoint for what changed from `before` to `after` (nothing when nothing
    a turn or a stream follows changed). `model_name` names a model ID for a title."""
    parts = []
    events = []
    if after.title != before.title and after.title is not None:
        events.append(
            EventSpec(
                "session.title.updated",
                {"previous_title": before.title, "title": after.title},
            )
        )
    for field, action_type in ACTION_TYPES.items():
        old, new = before.attributes.get(field), after.attributes.get(field)
        if old == new:
            continue
        parts.append(
            action_part(
                action_type, _title(field, new, model_name), _data(field, old, new)
            )
        )
        if field == "model_id":
            events.append(
                EventSpec(
                    "session.model.changed",
                    {"model_id": new, "previous_model_id": old},
                )
            )
    if not parts and not events:
        return
    session = await lock_session(db, after.id)
    assert session is not None, "the PATCH holds the session row"
    if not parts:
        await checkpoint.append_events(db, session, events)
        return
    await append_actions(
        db, session, turn_id=session.active_turn_id, parts=parts, events=events
    )
