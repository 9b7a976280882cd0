"""The session row as the write model sees it: locked for a checkpoint, owned by the
caller or a 404, and its usage added to."""

import uuid
from typing import Any, Protocol, TypeVar

from app.db.rows import LockedSession
from app.db.writes import Write
from app.errors import MessageNotFound, SessionNotFound
from app.ids import format_id


class Owned(Protocol):
    @property
    def organization_id(self) -> uuid.UUID: ...


OwnedT = TypeVar("OwnedT", bound=Owned)


def session_not_found(session_id: uuid.UUID) -> SessionNotFound:
    """The 404 of a session that does not exist, was deleted, or belongs to another
    organization (indistinguishable on purpose)."""
    return SessionNotFound(f"Session {format_id('session', session_id)} not found")


def message_not_found(message_id: uuid.UUID) -> MessageNotFound:
    return MessageNotFound(f"Message {format_id('message', message_id)} not found")


async def lock_session(db: Write, session_id: uuid.UUID) -> LockedSession | None:
    """Take the session's row lock until the unit of work ends (PostgreSQL FOR UPDATE;
    on SQLite the unit holds the database write lock, BEGIN IMMEDIATE) and read what
    checkpoints need of the row. Checkpoints allocate sequences under this lock."""
    return await db.lock_session(session_id)


async def lock_owned_session(
    db: Write, *, organization_id: uuid.UUID, session_id: uuid.UUID
) -> LockedSession:
    """Lock the session, or raise its 404 (also when it belongs to another organization)."""
    return owned(await lock_session(db, session_id), organization_id, session_id)


def owned(
    row: OwnedT | None, organization_id: uuid.UUID, session_id: uuid.UUID
) -> OwnedT:
    """`row` (a session, or what was read of one), if the caller's organization owns
    it; else the session's 404. Another organization's session answers exactly as a
    missing one."""
    if row is None or row.organization_id != organization_id:
        raise session_not_found(session_id)
    return row


def add_usage(
    total: dict[str, Any] | None, usage: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Two TokenUsage values added bucket by bucket (costs too, when either has one)."""
    if not usage:
        return total
    if not total:
        return dict(usage)
    out = dict(total)
    for key, value in usage.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = out.get(key, 0) + value
    return out


async def record_usage(
    db: Write,
    session: LockedSession,
    known: dict[str, Any] | None,
    usage: dict[str, Any] | None,
) -> None:
    """Add a model call's usage to the session's, `known` (as its runner read it: the
    runner is its only writer), inside the caller's checkpoint."""
    total = add_usage(known, usage)
    if usage and total is not None:
        await db.set_usage(session.id, total)
