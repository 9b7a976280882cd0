"""Interaction use-cases: list a session's interactions, resolve a pending approval.
Services never commit: the caller's unit of work does."""

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app import wire
from app.db import models
from app.db.rows import MessageRow
from app.db.types import utcnow
from app.db.writes import Write
from app.errors import Conflict, NotFound, Unprocessable
from app.ids import format_id
from app.interactions import schemas
from app.journal import lifecycle
from app.journal.sessions import lock_owned_session
from app.journal.tool_calls import tool_transition
from app.sessions import service as sessions_service


class InteractionNotFound(NotFound):
    code = "interaction_not_found"


class InteractionResolved(Conflict):
    code = "interaction_resolved"


def interaction_view(part: dict[str, Any], message_id: uuid.UUID) -> dict[str, Any]:
    view = {
        key: part[key]
        for key in (
            "interaction_id",
            "interaction_type",
            "status",
            "tool_call_id",
            "request",
            "response",
            "resolved_at",
            "cancel_reason",
        )
        if part.get(key) is not None
    }
    view.setdefault("interaction_type", part.get("kind") or "approval")
    view["message_id"] = format_id("message", message_id)
    return view


def _interaction_parts(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in content if p.get("type") == "interaction"]


async def list_interactions(
    db: AsyncSession,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    status: str | None,
) -> list[dict[str, Any]]:
    """The session's interactions, oldest first; with `status`, only those in it."""
    await sessions_service.get_session(
        db, organization_id=organization_id, session_id=session_id
    )
    rows = await db.execute(
        select(models.Message.id, models.Message.snapshot)
        .where(
            models.Message.session_id == session_id,
            models.Message.snapshot.contains('"type":"interaction"'),
        )
        .order_by(models.Message.sequence)
    )
    found = []
    for message_id, snapshot in rows.all():
        for part in _interaction_parts(wire.loads(snapshot)["content"]):
            if status is None or part.get("status") == status:
                found.append(interaction_view(part, message_id))
    return found


async def _message_of(
    db: Write, session_id: uuid.UUID, interaction_id: str
) -> MessageRow | None:
    conn = await db.core()
    ids = await conn.scalars(
        select(models.Message.id).where(
            models.Message.session_id == session_id,
            models.Message.snapshot.contains(f'"interaction_id":"{interaction_id}"'),
        )
    )
    for message_id in ids.all():
        message = await db.message(message_id)
        if message is not None:
            return message
    return None


async def resolve_many(
    db: Write,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    decisions: list[schemas.ToolDecision],
) -> list[dict[str, Any]]:
    """`POST .../tool-approvals`: each decision as `resolve` makes it, in the caller's
    unit of work, so a decision that fails (unknown, already decided, or named twice)
    leaves the others unwritten too."""
    # The session first: another organization's, or none, is a 404 whatever the body.
    await lock_owned_session(db, organization_id=organization_id, session_id=session_id)
    resolved: list[dict[str, Any]] = []
    seen: set[str] = set()
    for decision in decisions:
        interaction_id = decision.interaction_id or await _interaction_of_call(
            db, session_id, decision.tool_call_id or ""
        )
        if interaction_id in seen:
            raise Unprocessable(f"Interaction {interaction_id} is decided twice")
        seen.add(interaction_id)
        resolved.append(
            await resolve(
                db,
                organization_id=organization_id,
                session_id=session_id,
                interaction_id=interaction_id,
                data=decision,
            )
        )
    return resolved


async def _interaction_of_call(
    db: Write, session_id: uuid.UUID, tool_call_id: str
) -> str:
    """The approval that holds back a tool call in the session (404 when there is
    none); the caller holds the session row."""
    conn = await db.core()
    snapshots = await conn.scalars(
        select(models.Message.snapshot).where(
            models.Message.session_id == session_id,
            models.Message.state == "streaming",
            models.Message.snapshot.contains('"type":"interaction"'),
        )
    )
    for snapshot in snapshots.all():
        for part in _interaction_parts(wire.loads(snapshot).get("content") or []):
            if part.get("tool_call_id") == tool_call_id and part.get("interaction_id"):
                return str(part["interaction_id"])
    raise InteractionNotFound(
        f"No pending approval holds back tool call {tool_call_id}"
    )


async def resolve(
    db: Write,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    interaction_id: str,
    data: schemas.Decision,
) -> dict[str, Any]:
    """Approve or deny a pending approval: the interaction part (`status`,
    `response`, `resolved_at`) and its tool's move (`running`, or `failed` with the
    denial, which the model sees) commit in one checkpoint, and the runner waiting for
    it goes on. An unknown or foreign interaction is 404; one already resolved or
    cancelled is 409; neither writes anything."""
    session = await lock_owned_session(
        db, organization_id=organization_id, session_id=session_id
    )
    message = await _message_of(db, session.id, interaction_id)
    part = next(
        (
            p
            for p in _interaction_parts(message.content if message else [])
            if p.get("interaction_id") == interaction_id
        ),
        None,
    )
    if message is None or part is None:
        raise InteractionNotFound(f"Interaction {interaction_id} not found")
    if part.get("status") != "pending" or message.state != "streaming":
        raise InteractionResolved(
            f"Interaction {interaction_id} is already {part.get('status')}"
        )
    approved = data.decision == "approve"
    response: dict[str, Any] = {"decision": data.decision}
    if data.reason is not None:
        response["reason"] = data.reason
    resolved = {
        "interaction_id": interaction_id,
        "status": "approved" if approved else "denied",
        "response": response,
        "resolved_at": wire.timestamp(utcnow()),
    }
    denial = "The user denied this tool call" + (
        f": {data.reason}" if data.reason else ""
    )
    await tool_transition(
        db,
        session,
        message,
        tool_call_id=part["tool_call_id"],
        status=lifecycle.RUNNING if approved else lifecycle.FAILED,
        error=None if approved else denial,
        interaction=resolved,
    )
    return interaction_view({**part, **resolved}, message.id)
