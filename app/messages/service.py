"""Message use-cases: store a user message (start or steer a turn), page through history,
read one snapshot. Reads return stored JSON bytes; nothing is re-serialized per request,
and the newest pages and single messages of sessions are answered from memory."""

import uuid
from dataclasses import dataclass
from typing import Any

from app import wire
from app.db.reads import Reads, SessionHead
from app.db.rows import DuplicateMessage
from app.db.writes import Write
from app.errors import (
    ClientMessageIdConflict,
    InvalidRequest,
    clip,
)
from app.journal import checkpoint
from app.journal.admission import TurnAdmission
from app.journal.sessions import lock_owned_session, message_not_found, owned
from app.live.cache import CachedPage, PageCache
from app.messages import schemas


async def create_message(
    db: Write,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    data: schemas.MessageCreate,
    admission: TurnAdmission | None = None,
) -> bytes:
    """Store a user message and return its snapshot with `delivery`.

    Under the session row lock: a repeated `client_message_id` with the same body
    returns the stored message as `duplicate` and writes nothing (with another body it
    is ClientMessageIdConflict), whatever the caps; otherwise the message starts a turn
    on an idle session (`started`, if `admission` admits the turn it wrote: else
    TooManyTurns, and the unit rolls back) or joins the running one (`steered`)."""
    if data.message.role != "user":
        raise InvalidRequest("Only user messages can be created through this endpoint")
    session = await lock_owned_session(
        db, organization_id=organization_id, session_id=session_id
    )
    content = [part.model_dump(exclude_none=True) for part in data.message.content]
    extra = _extra(data)
    was_running = session.active_turn_id is not None
    try:
        result, _turn_id = await checkpoint.append_user_message(
            db,
            session,
            content=content,
            visibility=data.message.visibility,
            extra=extra,
            client_message_id=data.client_message_id,
            start_turn=True,
        )
    except DuplicateMessage:
        assert data.client_message_id is not None
        stored = await db.snapshot_by_client_id(session_id, data.client_message_id)
        assert stored is not None
        return _duplicate(stored, data.client_message_id, content, data, extra)
    if not was_running:
        if admission is not None:
            await admission.admit(db, session)
        db.outbox.kick(session_id)
    assert result.message is not None
    return wire.with_field(
        result.message.snapshot, "delivery", "steered" if was_running else "started"
    )


def _duplicate(
    stored: str,
    client_message_id: str,
    content: list[dict[str, Any]],
    data: schemas.MessageCreate,
    extra: dict[str, Any],
) -> bytes:
    """The stored message, as the answer to a retry of the request that stored it."""
    _check_same_request(wire.loads(stored), client_message_id, content, data, extra)
    return wire.with_field(stored, "delivery", "duplicate")


def _extra(data: schemas.MessageCreate) -> dict[str, Any]:
    """The stored message fields a request sets besides its content."""
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
    return extra


# What checkpoints add to a user's parts: their identity within the message.
PART_IDENTITY = ("part_id", "sequence")


def _check_same_request(
    stored: dict[str, Any],
    client_message_id: str,
    content: list[dict[str, Any]],
    data: schemas.MessageCreate,
    extra: dict[str, Any],
) -> None:
    """A repeated `client_message_id` is a retry only if the request is the same one:
    the stored message (a user message never changes) must be what this request
    would store. Otherwise 409, naming the fields that differ."""
    stored_content = [
        {k: v for k, v in part.items() if k not in PART_IDENTITY}
        for part in stored["content"]
    ]
    # Tags are stored inside metadata: name whichever of the two differs.
    stored_metadata = dict(stored.get("metadata") or {})
    metadata = dict(extra.get("metadata") or {})
    stored_tags, tags = stored_metadata.pop("tags", None), metadata.pop("tags", None)
    differing = [
        name
        for name, same in (
            ("message.content", stored_content == content),
            ("message.visibility", stored["visibility"] == data.message.visibility),
            ("controls", stored.get("controls") == extra.get("controls")),
            ("metadata", stored_metadata == metadata),
            ("tags", stored_tags == tags),
            (
                "external_actor",
                stored.get("external_actor") == extra.get("external_actor"),
            ),
        )
        if not same
    ]
    if differing:
        raise ClientMessageIdConflict(
            f"client_message_id '{clip(client_message_id, 200)}' was already used "
            f"by message {stored['id']} with a different body ({', '.join(differing)} "
            "differ); send the same body to retry, or a new client_message_id"
        )


def etag_for(last_sequence: int, query: "PageQuery") -> str:
    """Every checkpoint bumps the session's sequence, so it versions every page."""
    return (
        f'W/"{last_sequence}-{query.limit}-{query.before_sequence or 0}'
        f'-{int(query.include_internal)}"'
    )


def etag_matches(etag: str, if_none_match: str | None) -> bool:
    """RFC 9110 §13.1.2: one of the listed ETags, or `*` (any current representation)."""
    return if_none_match is not None and (
        if_none_match == etag
        or etag in (t.strip() for t in if_none_match.split(","))
        or if_none_match.strip() == "*"
    )


@dataclass(frozen=True, slots=True)
class PageQuery:
    limit: int
    before_sequence: int | None = None
    include_internal: bool = False


def cached_page(
    cache: PageCache,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    query: PageQuery,
) -> CachedPage | None:
    """The newest page from memory, if this process holds it for this organization."""
    if query.before_sequence is not None:
        return None
    entry = cache.owned_entry(session_id, organization_id)
    if entry is None:
        return None
    return entry.pages.get((query.limit, query.include_internal))


def render_page(
    head: SessionHead, rows: list[tuple[int, bytes]], query: PageQuery, max_bytes: int
) -> bytes:
    """The page envelope around stored snapshots (`rows` newest first, up to limit+1).
    Snapshots that would take the page past `max_bytes` are left to older pages: the
    page then holds the newest that fit, with `has_more` and `next_before_sequence`."""
    page = rows[: query.limit]
    used = 1
    for index, (_, snapshot) in enumerate(page):
        used += len(snapshot) + 1
        if index and used > max_bytes:
            del page[index:]
            break
    has_more = len(rows) > len(page)
    page.reverse()
    total = head.visible_message_count + (
        head.internal_message_count if query.include_internal else 0
    )
    tail: dict[str, Any] = {"total": total, "has_more": has_more}
    if page:
        tail["start_sequence"] = page[0][0]
        tail["end_sequence"] = page[-1][0]
        if has_more:
            tail["next_before_sequence"] = page[0][0]
    tail["cursor"] = str(head.last_sequence)
    return (
        b'{"data":'
        + wire.join_array(snapshot for _, snapshot in page)
        + b","
        + wire.dumps(tail)[1:]
    )


async def list_messages(
    reads: Reads,
    cache: PageCache,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    query: PageQuery,
    max_bytes: int,
    if_none_match: str | None = None,
) -> tuple[str, bytes | None]:
    """One page of messages, oldest first, the newest page when no cursor is given.
    Returns the page's ETag and body; the body is None when `if_none_match` matches.

    The newest page comes from memory when this process holds it; otherwise one
    statement reads the session head (its `last_sequence` is the page's `cursor` and
    ETag, its counters are `total`) and the rows together, on one snapshot."""
    hit = cached_page(
        cache, organization_id=organization_id, session_id=session_id, query=query
    )
    if hit is not None:
        return hit.etag, None if etag_matches(hit.etag, if_none_match) else hit.body
    result = await reads.page(
        session_id,
        limit=query.limit + 1,
        before_sequence=query.before_sequence,
        include_internal=query.include_internal,
    )
    owned(None if result is None else result.head, organization_id, session_id)
    assert result is not None
    head = result.head
    etag = etag_for(head.last_sequence, query)
    body = render_page(head, result.rows, query, max_bytes)
    if query.before_sequence is None:
        cache.store_page(
            session_id,
            organization_id,
            head.last_sequence,
            (query.limit, query.include_internal),
            CachedPage(etag, body),
        )
    return etag, None if etag_matches(etag, if_none_match) else body


def cached_message(
    cache: PageCache,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    message_id: uuid.UUID,
) -> bytes | None:
    entry = cache.owned_entry(session_id, organization_id)
    if entry is None:
        return None
    return entry.messages.get(message_id)


async def get_message(
    reads: Reads,
    cache: PageCache,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    message_id: uuid.UUID,
) -> bytes:
    hit = cached_message(
        cache,
        organization_id=organization_id,
        session_id=session_id,
        message_id=message_id,
    )
    if hit is not None:
        return hit
    row = await reads.message(session_id, message_id)
    owned(None if row is None else row.head, organization_id, session_id)
    assert row is not None
    if row.snapshot is None:
        raise message_not_found(message_id)
    cache.store_message(
        session_id, organization_id, row.head.last_sequence, message_id, row.snapshot
    )
    return row.snapshot
