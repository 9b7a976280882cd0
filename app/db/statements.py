"""The statements of the checkpoint path, as SQL text written once for both databases
(placeholders `:name`, numbered for each driver by `numbered`), and the mapping of the
rows of app/db/rows.py to their values."""

import re
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from app.db.rows import DuplicateMessage, MessageRow, StaleMessage
from app.db.search import searchable_text
from app.db.session_row import UPDATE_SESSION

# Named placeholders (`:name`), numbered per dialect once (`$n` for asyncpg, `?n` for
# SQLite). `::type` casts are PostgreSQL-only and appear only in PostgreSQL statements.

# A message whose client_message_id the session already has is not inserted
# (DuplicateMessage): the unique constraint is the check, at no extra round trip.
INSERT_MESSAGE = """
INSERT INTO messages (id, session_id, sequence, role, state, visibility, revision,
    turn_id, client_message_id, content, extra, snapshot, changed_sequence,
    created_at, updated_at, search_text)
VALUES (:message_id, :session_id, :sequence, :role, :state, :visibility, :revision,
    :turn_id, :client_message_id, :content, :extra, :snapshot, :changed_sequence,
    :created_at, :updated_at, :search_text)
ON CONFLICT (session_id, client_message_id) DO NOTHING"""

# Every checkpoint bumps the revision by one: a row at any other revision was changed
# by someone else since it was read, and is left alone (StaleMessage).
UPDATE_MESSAGE = """
UPDATE messages SET state = :state, revision = :revision, content = :content,
    extra = :extra, snapshot = :snapshot, changed_sequence = :changed_sequence,
    updated_at = :updated_at, search_text = :search_text
WHERE id = :message_id AND revision = :revision - 1"""

# SQLite: the rows follow, as many `VALUES` tuples of these seven as there are events.
INSERT_EVENTS = """
INSERT INTO events (id, session_id, sequence, type, turn_id, created_at, body)"""

# PostgreSQL: a whole checkpoint in one statement. The CTEs all run, referenced or not;
# the final SELECT says whether the message part matched its row.
PG_INSERT_EVENTS = """
INSERT INTO events (id, session_id, sequence, type, turn_id, created_at, body)
SELECT e.id, :session_id, e.sequence, e.type, e.turn_id, :now, e.body
FROM unnest(:event_ids::uuid[], :event_sequences::integer[], :event_types::text[],
            :event_turn_ids::uuid[], :event_bodies::text[])
    AS e(id, sequence, type, turn_id, body)"""

# The session row and the events are written only if the message was: an insert whose
# client_message_id is taken, or an update of a stale revision, writes nothing at all.
IF_WRITTEN = "EXISTS (SELECT 1 FROM m)"

PG_CHECKPOINT = {
    "insert": f"WITH m AS ({INSERT_MESSAGE} RETURNING 1),"
    f" s AS ({UPDATE_SESSION} AND {IF_WRITTEN}),"
    f" e AS ({PG_INSERT_EVENTS} WHERE {IF_WRITTEN}) SELECT count(*) FROM m",
    "update": f"WITH m AS ({UPDATE_MESSAGE} RETURNING 1),"
    f" s AS ({UPDATE_SESSION} AND {IF_WRITTEN}),"
    f" e AS ({PG_INSERT_EVENTS} WHERE {IF_WRITTEN}) SELECT count(*) FROM m",
    None: f"WITH s AS ({UPDATE_SESSION}), e AS ({PG_INSERT_EVENTS}) SELECT 1",
}

MESSAGE_COLUMNS = """id, session_id, sequence, role, state, visibility, revision,
    turn_id, client_message_id, content, extra, snapshot, changed_sequence,
    created_at, updated_at"""

SELECT_MESSAGE = f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = :message_id"

SELECT_STREAMING = f"""
SELECT {MESSAGE_COLUMNS} FROM messages
WHERE session_id = :session_id AND state = 'streaming'
ORDER BY sequence"""

SELECT_FIRST_INPUT_AFTER = f"""
SELECT {MESSAGE_COLUMNS} FROM messages
WHERE session_id = :session_id AND role = 'user' AND sequence > :after
ORDER BY sequence LIMIT 1"""

SELECT_TURN_INPUT = f"""
SELECT {MESSAGE_COLUMNS} FROM messages
WHERE session_id = :session_id AND turn_id = :turn_id AND role = 'user'
ORDER BY sequence LIMIT 1"""

SELECT_BY_CLIENT_ID = """
SELECT snapshot FROM messages
WHERE session_id = :session_id AND client_message_id = :client_message_id"""

REQUEST_CANCEL = "UPDATE sessions SET cancel_requested_at = :now WHERE id = :session_id"

# A turn waiting for client tool results runs nowhere: it holds no place.
COUNT_RUNNING_TURNS = """
SELECT count(*) FROM sessions
WHERE organization_id = :organization_id AND active_turn_id IS NOT NULL
AND status != 'waitingfortoolresults'"""

LOCK_ORGANIZATION = "SELECT pg_advisory_xact_lock(:lock_class, :lock_id)"
# The advisory-lock class of organization locks ("EVMO").
ORGANIZATION_LOCK = 0x45564D4F


def int4(value: uuid.UUID) -> int:
    """A signed 32-bit key for an advisory lock: the UUID's low bits (organizations that
    collide merely share a lock)."""
    low = value.int & 0xFFFFFFFF
    return low - (1 << 32) if low >= 1 << 31 else low


PLACEHOLDER = re.compile(r"(?<![:\w]):(\w+)")


@dataclass(frozen=True, slots=True)
class Statement:
    text: str
    names: tuple[str, ...]


def numbered(sql: str, style: str) -> Statement:
    """`:name` placeholders as `<style><n>`, the same number for every use of a name."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"{style}{names.index(name) + 1}"

    return Statement(PLACEHOLDER.sub(number, sql), tuple(names))


def message_values(message: MessageRow) -> dict[str, Any]:
    return {
        "message_id": message.id,
        "session_id": message.session_id,
        "sequence": message.sequence,
        "role": message.role,
        "state": message.state,
        "visibility": message.visibility,
        "revision": message.revision,
        "turn_id": message.turn_id,
        "client_message_id": message.client_message_id,
        "content": orjson.dumps(message.content).decode(),
        "extra": orjson.dumps(message.extra).decode(),
        "snapshot": message.snapshot,
        "changed_sequence": message.changed_sequence,
        "created_at": message.created_at,
        "updated_at": message.updated_at,
        "search_text": searchable(message),
    }


def searchable(message: MessageRow) -> str | None:
    return searchable_text(
        message.role, message.state, message.visibility, message.content
    )


def not_written(message: MessageRow, inserted: bool) -> Exception:
    if inserted:
        return DuplicateMessage(
            f"client_message_id {message.client_message_id!r} is already stored"
        )
    return StaleMessage(
        f"message {message.id} is not at revision {message.revision - 1}"
    )


def pg_literal(value: str) -> str:
    # An escape string literal: its meaning does not depend on standard_conforming_strings.
    return "E'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
