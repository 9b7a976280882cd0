"""feedback: a caller's rating and comment on a message.

One row per message and API key (`key_hash`; empty in open mode, where every caller is
one): a caller sees and changes only its own. Deleted with its message and session.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 23:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "feedback",
        sa.Column("message_id", sa.Uuid(), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("rating", sa.String(length=8), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["messages.id"],
            name=op.f("fk_feedback_message_id_messages"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_feedback_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("message_id", "key_hash", name=op.f("pk_feedback")),
    )
    op.create_index(
        op.f("ix_feedback_session_id_key_hash"), "feedback", ["session_id", "key_hash"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_feedback_session_id_key_hash"), table_name="feedback")
    op.drop_table("feedback")
