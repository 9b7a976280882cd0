"""The sessions list envelope (upstream's `PaginatedResponse`): offset links, and a byte
budget that ends a page early instead of building an unbounded response."""

from collections.abc import Sequence
from urllib.parse import urlencode

from app import wire
from app.db import models
from app.sessions import service


def _filters(query: service.SessionQuery) -> dict[str, str]:
    """The query's filters, repeated in `next_url` and `prev_url`."""
    params = {"order": query.order}
    if query.search:
        params["search"] = query.search
    if query.statuses:
        params["status"] = ",".join(query.statuses)
    if query.created_after is not None:
        params["created_after"] = query.created_after.isoformat()
    if query.created_before is not None:
        params["created_before"] = query.created_before.isoformat()
    return params


def render(
    rows: Sequence[models.Session],
    *,
    total: int,
    query: service.SessionQuery,
    base: str,
    max_bytes: int,
) -> bytes:
    """`{data,total,offset,limit,next_url?,prev_url?}`. When the sessions of a page
    would pass `max_bytes`, the page ends before the one that would, `limit` says how
    many it holds and `next_url` continues right after it: paging by `next_url` or by
    `offset + limit` both visit every session once."""
    items = wire.within_budget(
        (wire.dumps(service.session_wire(s, base)) for s in rows), max_bytes
    )
    served = len(items)
    limit = query.limit if served == len(rows) else served
    tail: dict[str, object] = {"total": total, "offset": query.offset, "limit": limit}
    filters = _filters(query)
    if served and query.offset + served < total:
        tail["next_url"] = f"{base}/v1/sessions?" + urlencode(
            {**filters, "offset": query.offset + served, "limit": query.limit}
        )
    if query.offset > 0:
        tail["prev_url"] = f"{base}/v1/sessions?" + urlencode(
            {
                **filters,
                "offset": max(0, query.offset - query.limit),
                "limit": query.limit,
            }
        )
    return b'{"data":' + wire.join_array(items) + b"," + wire.dumps(tail)[1:]
