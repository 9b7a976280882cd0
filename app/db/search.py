"""Full-text search over message text: what of a message is indexed, and the two
databases' statements that find it.

A message's searchable text (`messages.search_text`) is the text of its text parts,
set by the checkpoint that leaves it done and visible, so the index changes in the
checkpoint's own transaction and a message is found once, and only once, it is
complete. Each database indexes that column its own way (migration 0009):

- PostgreSQL: a stored generated `search_vector tsvector` (the `simple` configuration:
  lower-cased words, no stemming, no stop words, the same in every language) with a GIN
  index.
- SQLite: an FTS5 table `message_search` (the `unicode61` tokenizer, diacritics kept, so
  both databases match the same words) over `message_texts`, a table that triggers on
  `messages` keep (its INTEGER PRIMARY KEY is the FTS5 rowid, which VACUUM leaves as
  it is); deleting a message or its session deletes its row and its index entries.

A query is its words (letters and digits); a message matches if it holds every word.
Hits that hold them as one phrase, in order, rank first, then by relevance (PostgreSQL
`ts_rank_cd`, SQLite `bm25`), then newest first.
"""

import re
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Integer, String, Text, Uuid, bindparam, text
from sqlalchemy.sql.selectable import TextualSelect

from app.backend import Backend
from app.db.types import UtcDateTime

# The index's own objects, which only the migrations know (not the models): the
# PostgreSQL column and index, the SQLite tables (FTS5's shadow tables are named
# `message_search_*`).
INDEX_OBJECTS = frozenset(
    {"search_vector", "ix_messages_search_vector", "message_texts", "message_search"}
)


def is_index_object(name: str | None) -> bool:
    return name is not None and (
        name in INDEX_OBJECTS or name.startswith("message_search_")
    )


MAX_WORDS = 16
# Letters and digits: what both databases' tokenizers take for a word (an underscore,
# like other punctuation, separates words).
WORD = re.compile(r"[^\W_]+")


def searchable_text(
    role: str, state: str, visibility: str, content: Sequence[dict[str, Any]]
) -> str | None:
    """The text a message is found by: its text parts, once it is done and visible.
    None (not indexed) for a message still streaming, an internal one, or one with no
    text."""
    if state != "done" or visibility != "visible" or role not in ("user", "agent"):
        return None
    body = "\n".join(
        p["text"] for p in content if p.get("type") == "text" and p.get("text")
    )
    return body if body.strip() else None


def words(query: str) -> list[str]:
    """The words of a query (at most MAX_WORDS)."""
    return WORD.findall(query)[:MAX_WORDS]


def _fts5_all(query_words: Sequence[str]) -> str:
    # Each word quoted: FTS5 reads it as a string, never as an operator.
    return " ".join('"' + w.replace('"', '""') + '"' for w in query_words)


def _fts5_phrase(query_words: Sequence[str]) -> str:
    return '"' + " ".join(query_words).replace('"', '""') + '"'


_PG_HITS = """
SELECT m.id, m.session_id, s.title, m.sequence, m.role, m.created_at, m.search_text
FROM messages AS m JOIN sessions AS s ON s.id = m.session_id
WHERE m.search_vector @@ plainto_tsquery('simple', :words)
    AND s.organization_id = :organization_id
ORDER BY m.search_vector @@ phraseto_tsquery('simple', :words) DESC,
    ts_rank_cd(m.search_vector, plainto_tsquery('simple', :words)) DESC,
    m.created_at DESC, m.id DESC
LIMIT :limit OFFSET :offset"""

_SQLITE_HITS = """
SELECT m.id, m.session_id, s.title, m.sequence, m.role, m.created_at,
    t.body AS search_text
FROM message_search
JOIN message_texts AS t ON t.rowid = message_search.rowid
JOIN messages AS m ON m.id = t.message_id
JOIN sessions AS s ON s.id = t.session_id
WHERE message_search MATCH :words AND s.organization_id = :organization_id
ORDER BY message_search.rowid IN (
        SELECT rowid FROM message_search WHERE message_search MATCH :phrase) DESC,
    message_search.rank, m.created_at DESC, m.id DESC
LIMIT :limit OFFSET :offset"""

_PG_SESSIONS = """
SELECT m.session_id FROM messages AS m
WHERE m.search_vector @@ plainto_tsquery('simple', :search_words)"""

_SQLITE_SESSIONS = """
SELECT t.session_id FROM message_search
JOIN message_texts AS t ON t.rowid = message_search.rowid
WHERE message_search MATCH :search_words"""


def hits(
    backend: Backend,
    query_words: Sequence[str],
    *,
    organization_id: uuid.UUID,
    limit: int,
    offset: int,
) -> TextualSelect:
    """The organization's messages that hold every word, best first: id, session_id,
    title (the session's), sequence, role, created_at, search_text."""
    if backend is Backend.POSTGRESQL:
        clause = text(_PG_HITS).bindparams(words=" ".join(query_words))
    else:
        clause = text(_SQLITE_HITS).bindparams(
            words=_fts5_all(query_words), phrase=_fts5_phrase(query_words)
        )
    return clause.bindparams(
        bindparam("organization_id", organization_id, type_=Uuid()),
        limit=limit,
        offset=offset,
    ).columns(
        id=Uuid(),
        session_id=Uuid(),
        title=Text(),
        sequence=Integer(),
        role=String(),
        created_at=UtcDateTime(),
        search_text=Text(),
    )


def sessions_with_text(backend: Backend, query_words: Sequence[str]) -> TextualSelect:
    """The ids of the sessions with a message that holds every word (any
    organization's: the caller filters)."""
    if backend is Backend.POSTGRESQL:
        clause = text(_PG_SESSIONS).bindparams(search_words=" ".join(query_words))
    else:
        clause = text(_SQLITE_SESSIONS).bindparams(search_words=_fts5_all(query_words))
    return clause.columns(session_id=Uuid())
