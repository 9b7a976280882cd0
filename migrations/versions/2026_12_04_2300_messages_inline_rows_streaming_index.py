"""messages: rows of up to a page stored as written, and an index of the streaming
messages only.

`toast_tuple_target` (PostgreSQL): a message row passes the default target of about
2 KB as soon as its text is a few hundred bytes (content, snapshot, search text and
its vector each carry it), so every insert compressed snapshot and content and every
read of them decompressed them. Up to a page (8,160 bytes) a row is now stored as it
is: more bytes on disk, no compression on the write path. Rows already stored stay as
they are.

The index on `state` held every message, but it is only ever asked for a session's
streaming messages: a partial index of those, by session, is written only while a
message streams.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STREAMING = sa.text("state = 'streaming'")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE messages SET (toast_tuple_target = 8160)")
    op.drop_index("ix_messages_state", table_name="messages")
    op.create_index(
        "ix_messages_session_id_streaming",
        "messages",
        ["session_id"],
        postgresql_where=STREAMING,
        sqlite_where=STREAMING,
    )


def downgrade() -> None:
    op.drop_index("ix_messages_session_id_streaming", table_name="messages")
    op.create_index("ix_messages_state", "messages", ["state"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE messages RESET (toast_tuple_target)")
