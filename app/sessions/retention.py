"""Retention: sessions past their `expires_at`, or without activity for
SESSION_RETENTION_DAYS, are purged with their messages, events and feedback.

A purge pass deletes in batches of PURGE_BATCH sessions, each batch its own short
transaction, so writers wait for one batch at most, never for the pass. A session whose
turn is running is left for a later pass (its activity is recent anyway, unless its
`expires_at` passed mid-turn). Every process runs the pass every PURGE_INTERVAL_SECONDS;
on PostgreSQL a transaction-level lock makes the batches of two processes take turns,
so one deletes while the other finds nothing left. Each deleted session is announced
like `DELETE /v1/sessions/{id}`: its streams end and every process drops what it holds.

`evermirror purge --dry-run` lists what a pass would delete, and why.
"""

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, Select, delete, or_, select

from app.db import models
from app.db.dialect import lock_for_transaction
from app.db.session import Database
from app.db.types import utcnow
from app.settings import Settings

log = logging.getLogger("app.sessions.retention")


@dataclass(frozen=True)
class Expired:
    session_id: uuid.UUID
    organization_id: uuid.UUID
    # "expires_at" (its own time passed) or "retention" (no activity for the days).
    reason: str


def _expired_query(
    now: datetime, settings: Settings, limit: int | None = None
) -> Select[Any]:
    table = models.Session
    due = [table.expires_at <= now]
    if settings.session_retention_days is not None:
        cutoff = now - timedelta(days=settings.session_retention_days)
        due.append(table.last_activity_at < cutoff)
    return (
        select(table.id, table.organization_id, table.expires_at)
        .where(or_(*due), table.active_turn_id.is_(None))
        .order_by(table.id)
        .limit(limit)
    )


def _expired(rows: Iterable[Row[Any]], now: datetime) -> list[Expired]:
    return [
        Expired(
            row.id,
            row.organization_id,
            "expires_at"
            if row.expires_at is not None and row.expires_at <= now
            else "retention",
        )
        for row in rows
    ]


async def expired(
    database: Database, settings: Settings, *, now: datetime | None = None
) -> list[Expired]:
    """Every session a pass would delete now (the dry run)."""
    now = now or utcnow()
    async with database.read() as db:
        return _expired(await db.execute(_expired_query(now, settings)), now)


async def purge_batch(
    database: Database, settings: Settings, *, now: datetime | None = None
) -> list[Expired]:
    """Delete up to PURGE_BATCH expired sessions in one transaction; what was deleted."""
    now = now or utcnow()
    async with database.write() as db:
        conn = await db.core()
        await lock_for_transaction(conn, "evermirror.purge")
        rows = (
            await conn.execute(_expired_query(now, settings, settings.purge_batch))
        ).all()
        if not rows:
            return []
        ids = [row.id for row in rows]
        await conn.execute(delete(models.Session).where(models.Session.id.in_(ids)))
        for session_id in ids:
            db.outbox.delete(session_id)
    return _expired(rows, now)


async def purge(
    database: Database,
    settings: Settings,
    on_deleted: Callable[[int], None] | None = None,
) -> list[Expired]:
    """One pass: batches until none is left."""
    deleted: list[Expired] = []
    # Looked for on a read first: a pass with nothing to delete takes no write lock.
    async with database.read() as reader:
        due = await reader.execute(_expired_query(utcnow(), settings, 1))
        if due.first() is None:
            return deleted
    while True:
        batch = await purge_batch(database, settings)
        if not batch:
            return deleted
        deleted.extend(batch)
        if on_deleted is not None:
            on_deleted(len(batch))
        if len(batch) < settings.purge_batch:
            return deleted


async def run_purges(
    database: Database,
    settings: Settings,
    on_deleted: Callable[[int], None] | None = None,
) -> None:
    """The process's purge task: a pass every PURGE_INTERVAL_SECONDS, the first soon
    after start-up. A failed pass is logged and tried again at the next interval."""
    await asyncio.sleep(min(5.0, settings.purge_interval_seconds))
    while True:
        try:
            deleted = await purge(database, settings, on_deleted)
            if deleted:
                log.info("purged %d expired sessions", len(deleted))
        except Exception as exc:
            log.warning(
                "purge failed, tried again in %.0f s: %s",
                settings.purge_interval_seconds,
                exc,
            )
        await asyncio.sleep(settings.purge_interval_seconds)
