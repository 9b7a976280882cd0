"""The database as tests see it directly: snapshots of every table, and rows made
through a handle instead of the API."""

import uuid
from typing import Any

from sqlalchemy import select

from app.db import models
from app.db.session import Database
from app.ids import DEFAULT_ORG_ID
from app.sessions import schemas as session_schemas, service as sessions_service

Rows = dict[str, list[tuple[Any, ...]]]


async def table_rows(database: Database) -> Rows:
    """Every row of every table, ordered: equal snapshots mean nothing was written."""
    out: Rows = {}
    async with database.read() as db:
        for model in (
            models.Session,
            models.Message,
            models.Event,
            models.ApiKey,
            models.ComposerSummary,
            models.Feedback,
        ):
            table = model.__table__
            # The runner's lease heartbeat (PostgreSQL) renews `runner_renewed_at`
            # while a turn runs, whatever a request does: not a write of the request.
            columns = [c for c in table.columns if c.name != "runner_renewed_at"]
            keys = [c for c in table.columns if c.primary_key]
            result = await db.execute(select(*columns).order_by(*keys))
            out[model.__tablename__] = [tuple(row) for row in result.all()]
    return out


async def new_session_row(handle: Database) -> uuid.UUID:
    """A session of the default organization, created through `handle` directly."""
    async with handle.write() as db:
        session = await sessions_service.create_session(
            db, organization_id=DEFAULT_ORG_ID, data=session_schemas.SessionCreate()
        )
    return session.id
