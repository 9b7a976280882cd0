"""messages.search_text and its full-text index (app/db/search.py).

`search_text` holds the text of a message's text parts once it is done and visible,
written by the checkpoint. PostgreSQL indexes it as a stored generated `tsvector` with
a GIN index; SQLite as an FTS5 table over `message_texts`, which triggers on `messages`
keep. Messages already stored are indexed here.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 11:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from app.db.search import searchable_text

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL_BATCH = 1000

SQLITE_UP = [
    """CREATE TABLE message_texts (
        rowid INTEGER PRIMARY KEY,
        message_id CHAR(32) NOT NULL UNIQUE
            REFERENCES messages (id) ON DELETE CASCADE,
        session_id CHAR(32) NOT NULL,
        body TEXT NOT NULL)""",
    """CREATE VIRTUAL TABLE message_search USING fts5(
        body, content='message_texts', content_rowid='rowid',
        tokenize='unicode61 remove_diacritics 0')""",
    """CREATE TRIGGER message_texts_ai AFTER INSERT ON message_texts BEGIN
        INSERT INTO message_search (rowid, body) VALUES (new.rowid, new.body);
    END""",
    """CREATE TRIGGER message_texts_ad AFTER DELETE ON message_texts BEGIN
        INSERT INTO message_search (message_search, rowid, body)
        VALUES ('delete', old.rowid, old.body);
    END""",
    """CREATE TRIGGER messages_search_ai AFTER INSERT ON messages
    WHEN new.search_text IS NOT NULL BEGIN
        INSERT INTO message_texts (message_id, session_id, body)
        VALUES (new.id, new.session_id, new.search_text);
    END""",
    """CREATE TRIGGER messages_search_au AFTER UPDATE OF search_text ON messages
    WHEN new.search_text IS NOT old.search_text BEGIN
        DELETE FROM message_texts WHERE message_id = old.id;
        INSERT INTO message_texts (message_id, session_id, body)
        SELECT new.id, new.session_id, new.search_text
        WHERE new.search_text IS NOT NULL;
    END""",
]

SQLITE_DOWN = [
    "DROP TRIGGER messages_search_au",
    "DROP TRIGGER messages_search_ai",
    "DROP TABLE message_search",
    "DROP TABLE message_texts",
]

PG_UP = [
    """ALTER TABLE messages ADD COLUMN search_vector tsvector
        GENERATED ALWAYS AS (to_tsvector('simple', search_text)) STORED""",
    "CREATE INDEX ix_messages_search_vector ON messages USING gin (search_vector)",
]

PG_DOWN = [
    "DROP INDEX ix_messages_search_vector",
    "ALTER TABLE messages DROP COLUMN search_vector",
]


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("search_text", sa.Text(), nullable=True))
    postgresql = op.get_bind().dialect.name == "postgresql"
    for statement in PG_UP if postgresql else SQLITE_UP:
        op.execute(statement)
    _backfill()


def _backfill() -> None:
    """Index the messages already stored, in batches of BACKFILL_BATCH."""
    messages = sa.table(
        "messages",
        sa.column("id", sa.Uuid()),
        sa.column("role", sa.String()),
        sa.column("state", sa.String()),
        sa.column("visibility", sa.String()),
        sa.column("content", sa.JSON().with_variant(JSONB(), "postgresql")),
        sa.column("search_text", sa.Text()),
    )
    bind = op.get_bind()
    after = None
    while True:
        query = (
            sa.select(messages.c.id, messages.c.role, messages.c.content)
            .where(messages.c.state == "done", messages.c.visibility == "visible")
            .order_by(messages.c.id)
            .limit(BACKFILL_BATCH)
        )
        if after is not None:
            query = query.where(messages.c.id > after)
        rows = bind.execute(query).all()
        if not rows:
            return
        for row in rows:
            body = searchable_text(row.role, "done", "visible", row.content or [])
            if body is not None:
                bind.execute(
                    sa.update(messages)
                    .where(messages.c.id == row.id)
                    .values(search_text=body)
                )
        after = rows[-1].id


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for statement in PG_DOWN if postgresql else SQLITE_DOWN:
        op.execute(statement)
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("search_text")
