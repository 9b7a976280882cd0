"""A client's tool result is found again by its call id whatever characters the id
holds: the lookup is a LIKE over the stored event, whose pattern must escape what
PostgreSQL's LIKE reads as special (its escape character, the backslash, among them)."""

import uuid

import orjson
import pytest
from sqlalchemy import insert

from app.db import models
from app.db.session import Database
from app.db.types import utcnow
from app.tools.service import _recorded
from tests.support.database import new_session_row
from tests.support.in_process import Running


@pytest.mark.parametrize(
    "call_id", ['call_"quoted"', "call_back\\slash", "call_50%_off", "call_plain"]
)
async def test_a_stored_result_is_found_by_any_call_id(
    running: Running, call_id: str
) -> None:
    database: Database = running.app.state.app.database
    session_id = await new_session_row(database)
    data = {"tool_call_id": call_id, "source": "client", "session_status": "active"}
    body = {"type": "tool.completed", "data": data}
    async with database.write() as db:
        conn = await db.core()
        await conn.execute(
            insert(models.Event).values(
                id=uuid.uuid4(),
                session_id=session_id,
                sequence=1000,
                type="tool.completed",
                turn_id=None,
                created_at=utcnow(),
                body=orjson.dumps(body).decode(),
            )
        )
    async with database.write() as db:
        assert await _recorded(db, session_id, call_id) == data
        # An id the stored one matches only as a pattern is not it.
        assert await _recorded(db, session_id, call_id[:-1] + "_") is None
