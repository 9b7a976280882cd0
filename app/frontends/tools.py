"""The tools a frontend offers (AG-UI's `RunAgentInput.tools`): the session's
client-side tools become the frontend's, its built-in ones stay. A change is made as
`PATCH /v1/sessions/{id}` makes it, so it appears in the conversation as an Action;
the same tools offered again change nothing."""

import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from app.db import models
from app.db.writes import Write
from app.errors import Unprocessable
from app.journal.sessions import session_not_found
from app.sessions import actions, service
from app.sessions.schemas import SessionUpdate
from app.tools.schemas import ToolDefinition


async def offer(
    db: Write,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    tools: list[ToolDefinition],
    model_name: Callable[[str | None], str],
) -> bool:
    """Whether the session's tools changed."""
    conn = await db.core()
    attributes: dict[str, Any] | None = await conn.scalar(
        select(models.Session.attributes).where(
            models.Session.id == session_id,
            models.Session.organization_id == organization_id,
        )
    )
    if attributes is None:
        raise session_not_found(session_id)
    current: list[dict[str, Any]] = attributes.get("tools") or []
    builtin = [t for t in current if t.get("type") == "builtin"]
    taken = {t["name"] for t in builtin} & {tool.name for tool in tools}
    if taken:
        raise Unprocessable(
            f"tools: {', '.join(sorted(taken))} is the name of a server tool of "
            "this session; a frontend tool needs a name of its own"
        )
    wanted = builtin + [tool.model_dump(exclude_none=True) for tool in tools]
    if wanted == current:
        return False
    before, after = await service.update_session(
        db,
        organization_id=organization_id,
        session_id=session_id,
        data=SessionUpdate(tools=[ToolDefinition.model_validate(t) for t in wanted]),
    )
    await actions.record_changes(db, before, after, model_name=model_name)
    return True
