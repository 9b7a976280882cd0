"""Message use-cases: store a user message (start or steer a turn), page through history,
read one snapshot. Reads return stored JSON bytes; nothing is re-serialized per request."""

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app import wire
from app.db import models
from app.db.writes import Write
from app.errors import InvalidRequest, MessageNotFound, SessionNotFound
from app.ids import format_id
from app.messages import checkpoint, schemas
from app.sessions import service as sessions_service


async def create_message(
    db: Write,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    data: schemas.MessageCreate,
) -> bytes:
    """Store a user message and return its snapshot with `delivery`.

    Under the session row lock: a repeated `client_message_id` returns the stored message
    as `duplicate` and writes nothing; otherwise the message starts a turn on an idle
    session (`started`) or joins the running one (`steered`)."""
    if data.message.role != "user":
        raise InvalidRequest("Only user messages can be created through this endpoint")
    session = await sessions_service.lock_owned_session(
        db, organization_id=organization_id, session_id=session_id
    )
    if data.client_message_id is not None:
        stored = await db.snapshot_by_client_id(session_id, data.client_message_id)
        if stored is not None:
            return wire.with_field(stored, "delivery", "duplicate")
    extra: dict[str, Any] = {}
    if data.controls is not None:
        extra["controls"] = data.controls.model_dump(exclude_none=True)
    metadata = dict(data.metadata or {})
    if data.tags:
        metadata.setdefault("tags", data.tags)
    if data.client_message_id is not None:
        metadata["everruns_client_message_id"] = data.client_message_id
    if metadata:
        extra["metadata"] = metadata
    if data.external_actor is not None:
        extra["external_actor"] = data.external_actor.model_dump(exclude_none=True)
    was_running = session.active_turn_id is not None
    result, _turn_id = await checkpoint.append_user_message(
        db,
        session,
        content=[part.model_dump(exclude_none=True) for part in data.message.content],
        visibility=data.message.visibility,
        extra=extra,
        client_message_id=data.client_message_id,
        start_turn=True,
    )
    if not was_running:
        db.outbox.kick(session_id)
    assert result.message is not None
    return wire.with_field(
        result.message.snapshot, "delivery", "steered" if was_running else "started"
    )


async def list_messages(
    db: AsyncSession,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    limit: int,
    before_sequence: int | None,
    include_internal: bool,
    if_none_match: str | None = None,
) -> tuple[str, bytes | None]:
    """One page of messages, oldest first, newest page first when no cursor is given.
    Returns the page's ETag and body; the body is None when `if_none_match` matches.

    The session row is read first: its `last_sequence` is the page's `cursor` and its
    counters are `total`. A message that commits between the two reads may appear with
    a newer revision than the cursor, which a client resuming from the cursor merges
    idempotently by revision. Every checkpoint bumps `last_sequence`, so it versions
    the page and a poll that matches costs one primary-key read."""
    session = await sessions_service.find_session(
        db, organization_id=organization_id, session_id=session_id
    )
    if session is None:
        raise SessionNotFound(f"Session {format_id('session', session_id)} not found")
    etag = f'W/"{session.last_sequence}-{limit}-{before_sequence or 0}-{int(include_internal)}"'
    if if_none_match is not None and etag in (
        t.strip() for t in if_none_match.split(",")
    ):
        return etag, None
    total = session.visible_message_count + (
        session.internal_message_count if include_internal else 0
    )
    stmt = select(models.Message.sequence, models.Message.snapshot).where(
        models.Message.session_id == session_id
    )
    if not include_internal:
        stmt = stmt.where(models.Message.visibility == "visible")
    if before_sequence is not None:
        stmt = stmt.where(models.Message.sequence < before_sequence)
    rows = list(
        (
            await db.execute(
                stmt.order_by(models.Message.sequence.desc()).limit(limit + 1)
            )
        ).all()
    )
    has_more = len(rows) > limit
    page = rows[:limit]
    page.reverse()
    body = b'{"data":' + wire.join_array(snapshot for _, snapshot in page)
    tail: dict[str, Any] = {"total": total, "has_more": has_more}
    if page:
        tail["start_sequence"] = page[0][0]
        tail["end_sequence"] = page[-1][0]
        if has_more:
            tail["next_before_sequence"] = page[0][0]
    tail["cursor"] = str(session.last_sequence)
    return etag, body + b"," + wire.dumps(tail)[1:]


async def get_message(
    db: AsyncSession,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    message_id: uuid.UUID,
) -> bytes:
    await sessions_service.get_session(
        db, organization_id=organization_id, session_id=session_id
    )
    snapshot = await db.scalar(
        select(models.Message.snapshot).where(
            models.Message.session_id == session_id, models.Message.id == message_id
        )
    )
    if snapshot is None:
        raise MessageNotFound(f"Message {format_id('message', message_id)} not found")
    return snapshot.encode()
