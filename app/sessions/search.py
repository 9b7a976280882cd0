"""Search over the text of an organization's messages (`GET /v1/search`): the hits of
the full-text index (app/db/search.py), best first, each with a snippet."""

import html
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import wire
from app.backend import Backend
from app.db import search as search_index
from app.ids import format_id

# A snippet's length in words, and how many of them come before the first match.
SNIPPET_WORDS = 24
LEAD_WORDS = 8


@dataclass(frozen=True, slots=True)
class Snippet:
    """Where a message's text holds the query's words: a window of SNIPPET_WORDS words
    around the first place it holds them as a phrase (or else its first match), with
    the spans of the matches in it."""

    text: str
    marks: tuple[tuple[int, int], ...]

    @property
    def html(self) -> str:
        """The snippet as HTML: its text escaped, each match in `<mark>`."""
        out: list[str] = []
        at = 0
        for begin, end in self.marks:
            out.append(html.escape(self.text[at:begin], quote=False))
            out.append(f"<mark>{html.escape(self.text[begin:end], quote=False)}</mark>")
            at = end
        out.append(html.escape(self.text[at:], quote=False))
        return "".join(out)


def snippet(body: str, words: list[str]) -> Snippet:
    tokens = list(search_index.WORD.finditer(body))
    wanted = [w.lower() for w in words]
    lowered = [t.group().lower() for t in tokens]
    first = next(
        (
            i
            for i in range(len(tokens) - len(wanted) + 1)
            if lowered[i : i + len(wanted)] == wanted
        ),
        next((i for i, t in enumerate(lowered) if t in wanted), 0),
    )
    start = max(0, min(first - LEAD_WORDS, len(tokens) - SNIPPET_WORDS))
    stop = min(len(tokens), start + SNIPPET_WORDS)
    begin = tokens[start].start() if start > 0 else 0
    end = tokens[stop - 1].end() if stop < len(tokens) else len(body)
    prefix = "…" if begin > 0 else ""
    shift = len(prefix) - begin
    marks = tuple(
        (tokens[i].start() + shift, tokens[i].end() + shift)
        for i in range(start, stop)
        if lowered[i] in wanted
    )
    text = prefix + body[begin:end] + ("…" if end < len(body) else "")
    return Snippet(text, marks)


async def search_messages(
    db: AsyncSession,
    backend: Backend,
    *,
    organization_id: uuid.UUID,
    words: list[str],
    offset: int,
    limit: int,
) -> tuple[list[dict[str, Any]], bool]:
    """A page of hits as the route answers them, and whether more follow."""
    rows = (
        await db.execute(
            search_index.hits(
                backend,
                words,
                organization_id=organization_id,
                limit=limit + 1,
                offset=offset,
            )
        )
    ).all()
    return [_hit(row, words) for row in rows[:limit]], len(rows) > limit


def _hit(row: Any, words: list[str]) -> dict[str, Any]:
    found = snippet(row.search_text, words)
    return {
        "session_id": format_id("session", row.session_id),
        "session_title": row.title,
        "message_id": format_id("message", row.id),
        "sequence": row.sequence,
        "role": row.role,
        "created_at": wire.timestamp(row.created_at),
        "snippet": found.text,
        "snippet_html": found.html,
    }
