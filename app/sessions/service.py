"""Session use-cases. Services never commit: the caller's unit of work does."""

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import and_, delete, func, insert, or_, select, true, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from app import wire
from app.backend import Backend
from app.db import models, search as search_index
from app.db.dialect import json_text
from app.db.types import utcnow
from app.db.writes import Write
from app.ids import IdParseError, format_id, parse_id, uuid7
from app.journal.sessions import lock_owned_session, session_not_found
from app.sessions import schemas

DEFAULT_HARNESS_ID = "harness_" + uuid.UUID(int=1).hex
# Create-time fields echoed on the wire but not otherwise interpreted.
ATTRIBUTE_FIELDS = (
    "agent_id",
    "model_id",
    "locale",
    "goal",
    "system_prompt",
    "hints",
    "metadata",
    "max_iterations",
    "source",
    "tools",
    "approval_mode",
    "forked_from_session_id",
    "forked_from_sequence",
    "forked_from_message_id",
)
# Upstream's SessionActivity filter values, mapped onto our status.
STATUS_FILTERS = {
    "started": "started",
    "active": "active",
    "running": "active",
    "idle": "idle",
    "waitingfortoolresults": "waitingfortoolresults",
}


def session_wire(session: models.Session, base_url: str) -> dict[str, Any]:
    sid = format_id("session", session.id)
    attrs = session.attributes
    body: dict[str, Any] = {
        "id": sid,
        "organization_id": format_id("org", session.organization_id),
        "harness_id": attrs.get("harness_id") or DEFAULT_HARNESS_ID,
        "owner_principal_id": format_id("principal", session.organization_id),
        "workspace_id": format_id("wsp", session.id),
        "status": session.status,
    }
    if session.title is not None:
        body["title"] = session.title
    body["tags"] = session.tags
    for key in ATTRIBUTE_FIELDS:
        if attrs.get(key) is not None:
            body[key] = attrs[key]
    if attrs.get("usage"):
        # Cumulative token usage of every model call in the session (upstream's
        # TokenUsage), kept by the runner's checkpoints.
        body["usage"] = attrs["usage"]
    body["created_at"] = wire.timestamp(session.created_at)
    body["updated_at"] = wire.timestamp(session.updated_at)
    if session.started_at is not None:
        body["started_at"] = wire.timestamp(session.started_at)
    if session.finished_at is not None:
        body["finished_at"] = wire.timestamp(session.finished_at)
    body["is_pinned"] = session.pinned_at is not None
    if session.archived_at is not None:
        body["archived_at"] = wire.timestamp(session.archived_at)
    if session.expires_at is not None:
        body["expires_at"] = wire.timestamp(session.expires_at)
    body["self_url"] = f"{base_url}/v1/sessions/{sid}"
    # The UI is not under the API's `/api` mount (upstream: `.../sessions/<id>/chat`).
    ui_root = base_url.removesuffix("/api")
    body["view_url"] = body["ui_link"] = f"{ui_root}/sessions/{sid}/chat"
    return body


async def create_session(
    db: Write,
    *,
    organization_id: uuid.UUID,
    data: schemas.SessionCreate,
    external_id: str | None = None,
) -> models.Session:
    fields = data.model_dump(exclude_unset=True, exclude_none=True)
    if data.tools is not None:
        # Whole definitions, defaults included (`type` is `client_side` unless sent).
        fields["tools"] = [tool.model_dump(exclude_none=True) for tool in data.tools]
    return await insert_session(
        db,
        organization_id=organization_id,
        title=data.title,
        tags=data.tags or [],
        attributes={
            k: v for k, v in fields.items() if k not in ("title", "tags", "expires_at")
        },
        expires_at=data.expires_at,
        external_id=external_id,
    )


async def insert_session(
    db: Write,
    *,
    organization_id: uuid.UUID,
    title: str | None,
    tags: list[str],
    attributes: dict[str, Any],
    expires_at: datetime | None = None,
    external_id: str | None = None,
) -> models.Session:
    """A new session row, with no messages yet."""
    now = utcnow()
    values: dict[str, Any] = {
        "id": uuid7(),
        "organization_id": organization_id,
        "title": title,
        "status": "started",
        "tags": tags,
        "attributes": attributes,
        "expires_at": expires_at,
        "last_sequence": 0,
        "last_input_sequence": 0,
        "visible_message_count": 0,
        "internal_message_count": 0,
        "created_at": now,
        "updated_at": now,
        "last_activity_at": now,
        "external_id": external_id,
    }
    conn = await db.core()
    await conn.execute(insert(models.Session).values(values))
    return models.Session(**values)


async def move_external_id(db: Write, *, source: uuid.UUID, target: uuid.UUID) -> None:
    """The frontend's id for a conversation now names `target` (a fork of `source`)."""
    conn = await db.core()
    external_id = await conn.scalar(
        select(models.Session.external_id).where(models.Session.id == source)
    )
    if external_id is None:
        return
    await conn.execute(
        update(models.Session)
        .where(models.Session.id == source)
        .values(external_id=None)
    )
    await conn.execute(
        update(models.Session)
        .where(models.Session.id == target)
        .values(external_id=external_id)
    )


async def session_for_chat(
    db: Write, *, organization_id: uuid.UUID, chat_id: str, create: bool
) -> uuid.UUID | None:
    """The session a frontend's chat id names: a session id of the organization's
    (else 404), or the session created for that id on its first use (`create`; else
    None when there is none yet). Two first uses at once: one insert fails on the
    unique index, and its unit of work is run again by the caller."""
    if chat_id.startswith("session_"):
        try:
            session_id = parse_id("session", chat_id)
        except IdParseError:
            session_id = None
        if session_id is not None:
            conn = await db.core()
            found = await conn.scalar(
                select(models.Session.id).where(
                    models.Session.id == session_id,
                    models.Session.organization_id == organization_id,
                )
            )
            if found is None:
                raise session_not_found(session_id)
            return session_id
    conn = await db.core()
    existing: uuid.UUID | None = await conn.scalar(
        select(models.Session.id).where(
            models.Session.organization_id == organization_id,
            models.Session.external_id == chat_id,
        )
    )
    if existing is not None or not create:
        return existing
    created = await create_session(
        db,
        organization_id=organization_id,
        data=schemas.SessionCreate(source="chat"),
        external_id=chat_id,
    )
    return created.id


async def find_session(
    db: AsyncSession, *, organization_id: uuid.UUID, session_id: uuid.UUID
) -> models.Session | None:
    session: models.Session | None = await db.scalar(
        select(models.Session).where(
            models.Session.id == session_id,
            models.Session.organization_id == organization_id,
        )
    )
    return session


async def get_session(
    db: AsyncSession, *, organization_id: uuid.UUID, session_id: uuid.UUID
) -> models.Session:
    """The session, or SessionNotFound (also when it belongs to another organization)."""
    session = await find_session(
        db, organization_id=organization_id, session_id=session_id
    )
    if session is None:
        raise session_not_found(session_id)
    return session


@dataclass
class SessionQuery:
    offset: int
    limit: int
    search: str | None = None
    statuses: tuple[str, ...] = ()
    created_after: datetime | None = None
    created_before: datetime | None = None
    order: str = "created_at"
    # Archived sessions: left out ("exclude"), listed with the others, or alone.
    archived: Literal["exclude", "include", "only"] = "exclude"
    # Only the branches of this session (its wire id).
    forked_from: str | None = None


async def list_sessions(
    db: AsyncSession,
    *,
    organization_id: uuid.UUID,
    query: SessionQuery,
    backend: Backend,
) -> tuple[list[models.Session], int]:
    stmt = select(models.Session).where(
        models.Session.organization_id == organization_id
    )
    if query.search:
        stmt = stmt.where(_matches(query.search, backend))
    if query.statuses:
        stmt = stmt.where(models.Session.status.in_(query.statuses))
    if query.archived == "exclude":
        stmt = stmt.where(models.Session.archived_at.is_(None))
    elif query.archived == "only":
        stmt = stmt.where(models.Session.archived_at.is_not(None))
    if query.forked_from is not None:
        # No index: the organization's sessions are read (docs/api.md, Fork).
        stmt = stmt.where(
            json_text(models.Session.attributes, "forked_from_session_id")
            == query.forked_from
        )
    if query.created_after is not None:
        stmt = stmt.where(models.Session.created_at > query.created_after)
    if query.created_before is not None:
        stmt = stmt.where(models.Session.created_at < query.created_before)
    total = int(await db.scalar(select(func.count()).select_from(stmt.subquery())) or 0)
    column = (
        models.Session.last_activity_at
        if query.order == "last_activity"
        else models.Session.created_at
    )
    rows = await db.scalars(
        stmt.order_by(column.desc(), models.Session.id.desc())
        .offset(query.offset)
        .limit(query.limit)
    )
    return list(rows.all()), total


def _matches(search: str, backend: Backend) -> ColumnElement[bool]:
    """A session matches a search if its title holds every token (as a substring), or
    one of its messages holds every word (the full-text index, app/db/search.py)."""
    title = and_(
        true(),
        *(
            # Match the token literally: % and _ are LIKE wildcards otherwise.
            models.Session.title.ilike(f"%{_like_literal(token)}%", escape="\\")
            for token in search.split()
        ),
    )
    found = search_index.words(search)
    if not found:
        return title
    in_text = models.Session.id.in_(search_index.sessions_with_text(backend, found))
    return or_(title, in_text)


def _like_literal(token: str) -> str:
    return token.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def update_session(
    db: Write,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    data: schemas.SessionUpdate,
) -> tuple[models.Session, models.Session]:
    """Apply the fields sent; returns the session before and after."""
    conn = await db.core()
    table = models.Session.__table__
    row = (
        (
            await conn.execute(
                select(table)
                .where(table.c.id == session_id)
                .where(table.c.organization_id == organization_id)
                # Changes merge into `attributes`: no other update may interleave.
                .with_for_update()
            )
        )
        .mappings()
        .one_or_none()
    )
    if row is None:
        raise session_not_found(session_id)
    before = models.Session(**row)
    session = models.Session(**row)
    changes = data.model_dump(exclude_unset=True)
    if "tools" in changes and changes["tools"] is not None:
        changes["tools"] = [
            tool.model_dump(exclude_none=True) for tool in data.tools or []
        ]
    if "title" in changes:
        session.title = changes["title"]
    if "tags" in changes:
        session.tags = changes["tags"] or []
    if "expires_at" in changes:
        session.expires_at = data.expires_at
    attributes = dict(session.attributes)
    for key in (
        "goal",
        "locale",
        "tools",
        "approval_mode",
        "model_id",
        "system_prompt",
    ):
        if key in changes:
            attributes[key] = changes[key]
    session.attributes = attributes
    session.updated_at = utcnow()
    await conn.execute(
        update(models.Session)
        .where(models.Session.id == session_id)
        .values(
            title=session.title,
            tags=session.tags,
            attributes=session.attributes,
            expires_at=session.expires_at,
            updated_at=session.updated_at,
        )
    )
    return before, session


async def mark_session(
    db: Write,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    mark: Literal["pinned_at", "archived_at"],
    on: bool,
) -> None:
    """Pin or archive the session (`on`), or undo it. Idempotent: marking a marked
    session keeps the time it was first marked. Neither touches `updated_at`: they
    are the organization's view of the session, not a change of it."""
    column = getattr(models.Session, mark)
    conn = await db.core()
    changed = await conn.execute(
        update(models.Session)
        .where(
            models.Session.id == session_id,
            models.Session.organization_id == organization_id,
        )
        .values({mark: func.coalesce(column, utcnow()) if on else None})
    )
    if changed.rowcount == 0:
        raise session_not_found(session_id)


async def delete_session(
    db: Write, *, organization_id: uuid.UUID, session_id: uuid.UUID
) -> None:
    """Delete the session with its messages and events (ON DELETE CASCADE); every
    process drops what it holds of it once the deletion commits."""
    conn = await db.core()
    deleted = await conn.execute(
        delete(models.Session).where(
            models.Session.id == session_id,
            models.Session.organization_id == organization_id,
        )
    )
    if deleted.rowcount == 0:
        raise session_not_found(session_id)
    db.outbox.delete(session_id)


async def cancel_turn(
    db: Write, *, organization_id: uuid.UUID, session_id: uuid.UUID
) -> bool:
    """Ask the running turn to stop, wherever its runner lives: the request is durable
    (`cancel_requested_at`) and a wake-up reaches the runner through the bus. Returns
    False (no_op) when no turn runs. Idempotent."""
    session = await lock_owned_session(
        db, organization_id=organization_id, session_id=session_id
    )
    if session.active_turn_id is None:
        return False
    if not session.cancel_requested:
        await db.request_cancel(session.id, utcnow())
        db.outbox.wake(session.id, session.last_sequence)
    if session.status == "waitingfortoolresults":
        # No runner holds a turn that waits for client tool results: start one here
        # to end it.
        db.outbox.kick(session.id)
    return True
