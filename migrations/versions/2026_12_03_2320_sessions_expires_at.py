"""sessions.expires_at: when a session is purged, whatever its activity.

Set on create and by PATCH (null: never, unless SESSION_RETENTION_DAYS says so).
Indexed: the purge finds the expired sessions by it. `last_activity_at` is not
indexed for SESSION_RETENTION_DAYS: every checkpoint updates it, and an index on it
would make each of those updates write the index too.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 23:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(
            sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True)
        )
    op.create_index(op.f("ix_sessions_expires_at"), "sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_sessions_expires_at"), table_name="sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("expires_at")
