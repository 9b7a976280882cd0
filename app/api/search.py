"""Search route: HTTP only; the service does the work."""

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Response

from app import wire
from app.api.deps import BaseUrl, OrgId, ReadDb, SettingsDep
from app.db.search import MAX_WORDS, words
from app.errors import InvalidParameter, problem_responses
from app.sessions import schemas
from app.sessions.search import search_messages

router = APIRouter(tags=["search"])

# Ranked hits are paged by offset; deeper pages rank every earlier hit again.
MAX_OFFSET = 1000


@router.get(
    "/search",
    response_model=schemas.SearchPage,
    responses=problem_responses(400, 401),
)
async def search(
    db: ReadDb,
    org: OrgId,
    base: BaseUrl,
    settings: SettingsDep,
    q: Annotated[
        str,
        Query(
            min_length=1,
            max_length=200,
            description=f"Words (at most {MAX_WORDS}); a message matches if its text "
            "holds all of them.",
            json_schema_extra={"pattern": "^[^\\u0000]*$"},
        ),
    ],
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    limit: Annotated[int, Query(ge=1, le=50)] = 20,
) -> Response:
    """Search the text of the organization's messages (done and visible ones, user
    and agent): hits that hold the words as one phrase first, then by relevance, then
    newest first, each with a snippet of where they occur."""
    if "\x00" in q:
        raise InvalidParameter("q: must not contain NUL (U+0000)")
    found = words(q)
    if not found:
        raise InvalidParameter("q: needs a word (letters or digits)")
    hits, more = await search_messages(
        db,
        settings.backend,
        organization_id=org,
        words=found,
        offset=offset,
        limit=limit,
    )
    body: dict[str, object] = {"data": hits, "offset": offset, "limit": limit}
    if more and offset + limit <= MAX_OFFSET:
        query = urlencode({"q": q, "offset": offset + limit, "limit": limit})
        body["next_url"] = f"{base}/v1/search?{query}"
    return wire.json_response(wire.dumps(body))
