"""composer_summaries: the Composer's summaries of older history (derived data).

A summary stands in for a session's messages up to `last_sequence` when its history no
longer fits the model's context. It is derived from the messages, so it takes no
sequence, never appears in messages, events or streams, is rebuilt when missing, and
goes with its session (ON DELETE CASCADE).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 20:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "composer_summaries",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("first_sequence", sa.Integer(), nullable=False),
        sa.Column("last_sequence", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_composer_summaries_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_composer_summaries")),
        sa.UniqueConstraint(
            "session_id",
            "last_sequence",
            name=op.f("uq_composer_summaries_session_id_last_sequence"),
        ),
    )


def downgrade() -> None:
    op.drop_table("composer_summaries")
