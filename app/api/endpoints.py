"""What the hot endpoints do, written once for both doors: the FastAPI routes
(app/api/messages.py) and the hot path in front of them (app/api/hot.py) parse the
request their own way, then call these, so both answer the same bytes."""

import functools
import uuid

from app.api import guards
from app.api.state import AppState
from app.errors import InvalidParameter
from app.messages import schemas, service
from app.settings import Settings


def page_query(
    settings: Settings,
    limit: int | None,
    before_sequence: int | None,
    include_internal: bool,
) -> service.PageQuery:
    """A page query: `limit` defaults to MESSAGES_PAGE_DEFAULT and is capped at
    MESSAGES_PAGE_MAX; below 1 it is refused."""
    if limit is not None and limit < 1:
        raise InvalidParameter("limit: must be at least 1")
    size = min(limit or settings.messages_page_default, settings.messages_page_max)
    return service.PageQuery(size, before_sequence, include_internal)


async def read_page(
    state: AppState,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    query: service.PageQuery,
    if_none_match: str | None,
) -> tuple[str, bytes | None]:
    """The page's ETag and body (None: `If-None-Match` matched, a 304)."""
    return await service.list_messages(
        state.reads,
        state.cache,
        organization_id=organization_id,
        session_id=session_id,
        query=query,
        max_bytes=state.settings.max_list_bytes,
        if_none_match=if_none_match,
    )


async def read_message(
    state: AppState,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    message_id: uuid.UUID,
) -> bytes:
    return await service.get_message(
        state.reads,
        state.cache,
        organization_id=organization_id,
        session_id=session_id,
        message_id=message_id,
    )


def accept_message(state: AppState, data: schemas.MessageCreate) -> None:
    """The checks of a posted message before anything is admitted or written: its
    parts within the size caps, and the model it asks for in the catalog."""
    guards.check_message(data, state.settings)
    if data.controls is not None:
        state.catalog.require(data.controls.model_id, "controls.model_id")


async def store_message(
    state: AppState,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    data: schemas.MessageCreate,
) -> bytes:
    """Store an accepted message in its own unit of work, committed on return: the
    snapshot with its `delivery`."""
    return await state.database.transact(
        functools.partial(
            service.create_message,
            organization_id=organization_id,
            session_id=session_id,
            data=data,
            admission=state.admission,
        )
    )
