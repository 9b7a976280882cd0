"""What the hot endpoints do, written once for both doors: the FastAPI routes
(app/api/messages.py) and the hot path in front of them (app/api/hot.py) parse the
request their own way, then call these, so both answer the same bytes."""

import asyncio
import functools
import uuid

from starlette.types import Receive

from app import wire
from app.api import guards
from app.api.state import AppState
from app.auth import Caller
from app.errors import InvalidParameter
from app.ids import parse_id
from app.live.wait import (
    Waiting,
    completed_body,
    timeout_body,
    wait_for_turn,
    waiting_body,
)
from app.messages import schemas, service
from app.settings import Settings

# `?wait=true`: how long a request may wait for its turn (milliseconds).
WAIT_DEFAULT_MS = 120_000
WAIT_MAX_MS = 600_000


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


class Wait:
    """A `?wait=true`, opened before its message is stored: its stream slot (admitted
    before anything is written; TooManyRequests otherwise) and its subscription to the
    session, open before the message commits so that its turn's end is in it. Closed
    by its opener, whatever happened."""

    def __init__(self, state: AppState, caller: Caller, session_id: uuid.UUID) -> None:
        self.state = state
        self.caller = caller
        self.session_id = session_id
        self.slot = state.limits.acquire(session_id, "wait")
        self.sub = state.fanout.subscribe(
            session_id, caller.key_hash, durable_only=True
        )

    def close(self) -> None:
        self.state.fanout.unsubscribe(self.sub)
        self.slot.release()

    async def answer(
        self, body: bytes, timeout_ms: int | None, receive: Receive
    ) -> tuple[int, bytes]:
        """The answer to the stored message (`body`, its snapshot): its status and
        body, once its turn ends or waits for the client, or at `timeout_ms`. Ended as
        soon as the client disconnects (`receive`, the request body read): nobody
        reads the answer, and the wait's stream slot is freed at once instead of at
        its timeout."""
        wait = asyncio.ensure_future(self._wait(body, timeout_ms))
        # The body has been read: the next ASGI message is the disconnect (or the end
        # of the response, by which time this has returned).
        gone = asyncio.ensure_future(receive())
        try:
            await asyncio.wait((wait, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not wait.done():
                wait.cancel()
        if wait.cancelled():
            return 202, timeout_body(body)
        return wait.result()

    async def _wait(self, body: bytes, timeout_ms: int | None) -> tuple[int, bytes]:
        stored = wire.loads(body)
        turn = stored.get("turn_id")
        ended = None
        if turn is not None:
            ended = await wait_for_turn(
                self.state.reads,
                self.state.fanout,
                self.session_id,
                parse_id("turn", turn),
                (timeout_ms or WAIT_DEFAULT_MS) / 1000,
                self.caller.key_hash,
                # A message stored before (a duplicate) may have a turn that ended
                # before the subscription opened: read first.
                None if stored.get("delivery") == "duplicate" else self.sub,
            )
        if ended is None:
            return 202, timeout_body(body)
        if isinstance(ended, Waiting):
            return 202, waiting_body(body, ended)
        return 200, completed_body(body, ended)
