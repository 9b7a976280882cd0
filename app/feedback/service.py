"""Feedback use-cases. A caller (an API key; every caller is one in open mode) rates and
comments on messages of its organization's sessions and sees only its own feedback.
Services never commit: the caller's unit of work does."""

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Uuid, bindparam, delete, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app import wire
from app.db import models
from app.db.types import UtcDateTime, utcnow
from app.db.writes import Write
from app.feedback import schemas
from app.ids import format_id
from app.journal.sessions import message_not_found, owned

# One statement on both databases: a second rating by the same caller replaces the
# first, however close together the two arrive.
_UPSERT = (
    text(
        "INSERT INTO feedback (message_id, key_hash, session_id, rating, comment,"
        " created_at, updated_at)"
        " VALUES (:message_id, :key_hash, :session_id, :rating, :comment, :now, :now)"
        " ON CONFLICT (message_id, key_hash) DO UPDATE SET rating = excluded.rating,"
        " comment = excluded.comment, updated_at = excluded.updated_at"
        " RETURNING created_at, updated_at"
    )
    .bindparams(
        bindparam("message_id", type_=Uuid()),
        bindparam("session_id", type_=Uuid()),
        bindparam("now", type_=UtcDateTime()),
    )
    .columns(created_at=UtcDateTime(), updated_at=UtcDateTime())
)


def _wire(
    session_id: uuid.UUID,
    message_id: uuid.UUID,
    rating: str | None,
    comment: str | None,
    times: tuple[datetime, datetime] | None,
) -> dict[str, Any]:
    """Feedback as the routes answer it (no times once it was removed)."""
    body: dict[str, Any] = {
        "session_id": format_id("session", session_id),
        "message_id": format_id("message", message_id),
        "rating": rating,
        "comment": comment,
    }
    if times is not None:
        body["created_at"] = wire.timestamp(times[0])
        body["updated_at"] = wire.timestamp(times[1])
    return body


def caller_key(key_hash: str | None) -> str:
    """Whose feedback it is: the caller's key, or the one caller of open mode."""
    return key_hash or ""


async def _check_message(
    conn: Any, organization_id: uuid.UUID, session_id: uuid.UUID, message_id: uuid.UUID
) -> None:
    """The session's 404 unless the organization owns it; the message's 404 unless it
    is one of the session's."""
    row = (
        await conn.execute(
            select(models.Session.organization_id, models.Message.id)
            .select_from(models.Session)
            .outerjoin(
                models.Message,
                (models.Message.session_id == models.Session.id)
                & (models.Message.id == message_id),
            )
            .where(models.Session.id == session_id)
        )
    ).one_or_none()
    if owned(row, organization_id, session_id).id is None:
        raise message_not_found(message_id)


async def rate(
    db: Write,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    message_id: uuid.UUID,
    key: str,
    data: schemas.FeedbackInput,
) -> dict[str, Any]:
    """Store the caller's feedback on the message (or remove it: no rating, no
    comment), and return it as the wire shows it."""
    conn = await db.core()
    await _check_message(conn, organization_id, session_id, message_id)
    if data.rating is None and data.comment is None:
        await conn.execute(
            delete(models.Feedback).where(
                models.Feedback.message_id == message_id,
                models.Feedback.key_hash == key,
            )
        )
        return _wire(session_id, message_id, None, None, None)
    stored = (
        await conn.execute(
            _UPSERT,
            {
                "message_id": message_id,
                "key_hash": key,
                "session_id": session_id,
                "rating": data.rating,
                "comment": data.comment,
                "now": utcnow(),
            },
        )
    ).one()
    return _wire(
        session_id,
        message_id,
        data.rating,
        data.comment,
        (stored.created_at, stored.updated_at),
    )


async def list_feedback(
    db: AsyncSession, *, organization_id: uuid.UUID, session_id: uuid.UUID, key: str
) -> list[dict[str, Any]]:
    """The caller's feedback on the session's messages, in the messages' order."""
    session = (
        await db.execute(
            select(models.Session.organization_id).where(
                models.Session.id == session_id
            )
        )
    ).one_or_none()
    owned(session, organization_id, session_id)
    rows = await db.execute(
        select(
            models.Feedback.message_id,
            models.Feedback.rating,
            models.Feedback.comment,
            models.Feedback.created_at,
            models.Feedback.updated_at,
        )
        .join(models.Message, models.Message.id == models.Feedback.message_id)
        .where(
            models.Feedback.session_id == session_id, models.Feedback.key_hash == key
        )
        .order_by(models.Message.sequence)
    )
    return [
        _wire(
            session_id,
            row.message_id,
            row.rating,
            row.comment,
            (row.created_at, row.updated_at),
        )
        for row in rows
    ]
