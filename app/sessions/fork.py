"""Fork, edit and regenerate: a new session holding a session's committed history up
to a message, and the two ways of asking a question again built on it. The source is
never changed: a branch is a session of its own, each copied message keeping its
`origin`, the new session its `forked_from_*`.

A fork is allowed while a turn runs (upstream answers 409): it copies what is
committed up to the boundary, each message as its latest snapshot, finished (`done`),
outside any turn, with pending approvals left out (nothing in the fork would decide
them). Each copied message is a checkpoint of the new session, with the event the
message would have had (`input.message` for the user's, `output.message.completed`
for the agent's), so its log, pages and streams are those of any session."""

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, select

from app import wire
from app.db import models
from app.db.rows import LockedSession
from app.db.types import utcnow
from app.db.writes import Write
from app.errors import InvalidParameter, Unprocessable
from app.ids import format_id
from app.journal import checkpoint, render
from app.journal.admission import TurnAdmission
from app.journal.events import EventSpec
from app.journal.sessions import lock_session, message_not_found, session_not_found
from app.sessions import service


@dataclass(frozen=True)
class Forked:
    session: models.Session
    # The message posted in the fork (edit, regenerate): its snapshot with
    # `delivery`, and the turn it started.
    message: bytes | None = None


async def fork(
    db: Write,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    message_id: uuid.UUID | None,
    include_message: bool,
    title: str | None = None,
    tags: list[str] | None = None,
) -> models.Session:
    """A new session with the source's messages up to `message_id` (with it, or up to
    the one before it), or all of them."""
    conn = await db.core()
    source = (
        await conn.execute(
            select(models.Session).where(
                models.Session.id == session_id,
                models.Session.organization_id == organization_id,
            )
        )
    ).first()
    if source is None:
        raise session_not_found(session_id)
    upto: int | None = None
    if message_id is not None:
        boundary = await conn.scalar(
            select(models.Message.sequence).where(
                models.Message.session_id == session_id,
                models.Message.id == message_id,
            )
        )
        if boundary is None:
            raise message_not_found(message_id)
        upto = boundary if include_message else boundary - 1
    stmt = select(models.Message).where(models.Message.session_id == session_id)
    if upto is not None:
        stmt = stmt.where(models.Message.sequence <= upto)
    copied = (await conn.execute(stmt.order_by(models.Message.sequence))).all()
    attributes = {k: v for k, v in source.attributes.items() if k != "usage"}
    attributes["forked_from_session_id"] = format_id("session", session_id)
    attributes["forked_from_sequence"] = copied[-1].sequence if copied else 0
    if message_id is not None:
        attributes["forked_from_message_id"] = format_id("message", message_id)
    else:
        attributes.pop("forked_from_message_id", None)
    created = await service.insert_session(
        db,
        organization_id=organization_id,
        title=title if title is not None else source.title,
        tags=tags if tags is not None else list(source.tags),
        attributes=attributes,
    )
    locked = await lock_session(db, created.id)
    assert locked is not None
    for row in copied:
        await _copy(db, locked, row)
    return created


async def _copy(db: Write, session: LockedSession, row: Row[Any]) -> None:
    """One message of the source as a checkpoint of the fork."""
    origin = {
        "session_id": format_id("session", row.session_id),
        "message_id": format_id("message", row.id),
    }
    if row.turn_id is not None:
        origin["turn_id"] = format_id("turn", row.turn_id)
    await append_copy(
        db,
        session,
        role=row.role,
        visibility=row.visibility,
        content=row.content,
        extra=row.extra,
        client_message_id=row.client_message_id,
        origin=origin,
    )


async def append_copy(
    db: Write,
    session: LockedSession,
    *,
    role: str,
    visibility: str,
    content: list[dict[str, Any]],
    extra: dict[str, Any],
    client_message_id: str | None,
    origin: dict[str, Any],
) -> None:
    """A copy of a message (forked or imported) as a checkpoint of `session`:
    finished, in no turn, without pending approvals, with its `origin`, and with the
    event it would have had."""
    now = utcnow()
    message = checkpoint.new_message(
        session,
        now,
        sequence=session.last_sequence + 1,
        role=role,
        state="done",
        visibility=visibility,
        turn_id=None,
        content=[
            part
            for part in content
            if not (
                part.get("type") == "interaction" and part.get("status") == "pending"
            )
        ],
        extra={**extra, "origin": origin},
        client_message_id=client_message_id,
    )
    checkpoint.count(session, visibility)
    if role == "user":
        spec = EventSpec(
            "input.message",
            {"message": render.render(message)},
            input_message_id=message.id,
        )
        session.last_input_sequence = message.sequence
    else:
        spec = checkpoint.completed(message)
    await checkpoint.commit(db, session, now, message, [spec], inserted=True)


async def ask_again(
    db: Write,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    message_id: uuid.UUID,
    content: list[dict[str, Any]] | None,
    admission: TurnAdmission | None,
) -> Forked:
    """Edit (`content` given: a user message's new parts) or regenerate (`content`
    None: the question of an agent message's turn, asked again): fork before the
    user message and post the question there, starting a turn. The source is
    untouched."""
    conn = await db.core()
    target = (
        await conn.execute(
            select(models.Message).where(
                models.Message.session_id == session_id,
                models.Message.id == message_id,
            )
        )
    ).first()
    owner = await conn.scalar(
        select(models.Session.organization_id).where(models.Session.id == session_id)
    )
    if owner != organization_id:
        raise session_not_found(session_id)
    if target is None:
        raise message_not_found(message_id)
    if content is None:
        question = await _question_of(db, target)
        content = [_input_part(p) for p in question.content]
        extra = question.extra
    else:
        if target.role != "user":
            raise Unprocessable(
                "Only a user message can be edited; regenerate an answer"
            )
        question, extra = target, target.extra
    created = await fork(
        db,
        organization_id=organization_id,
        session_id=session_id,
        message_id=question.id,
        include_message=False,
    )
    locked = await lock_session(db, created.id)
    assert locked is not None
    result, _turn = await checkpoint.append_user_message(
        db,
        locked,
        content=content,
        visibility=question.visibility,
        extra={k: v for k, v in extra.items() if k != "origin"},
        client_message_id=None,
        start_turn=True,
    )
    if admission is not None:
        await admission.admit(db, locked)
    db.outbox.kick(created.id)
    assert result.message is not None
    return Forked(
        created, wire.with_field(result.message.snapshot, "delivery", "started")
    )


async def _question_of(db: Write, answer: Row[Any]) -> Row[Any]:
    """The user message that started an agent message's turn."""
    if answer.role != "agent" or answer.turn_id is None:
        raise InvalidParameter(
            "message_id: only an agent message of a turn can be regenerated"
        )
    conn = await db.core()
    question = (
        await conn.execute(
            select(models.Message)
            .where(
                models.Message.session_id == answer.session_id,
                models.Message.turn_id == answer.turn_id,
                models.Message.role == "user",
            )
            .order_by(models.Message.sequence)
            .limit(1)
        )
    ).first()
    if question is None:
        raise InvalidParameter(
            "message_id: the question of this answer's turn is not in the session"
        )
    return question


# A stored part's fields that are the service's, not the sender's.
_STORED_FIELDS = ("part_id", "sequence", "step_id")


def _input_part(part: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in part.items() if k not in _STORED_FIELDS}
