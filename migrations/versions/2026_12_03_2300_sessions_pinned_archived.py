"""sessions.pinned_at and sessions.archived_at: pin and archive.

Both are set by their routes (`PUT`/`DELETE /v1/sessions/{id}/pin` and `.../archive`)
and cleared by the DELETE. An archived session is left out of `GET /v1/sessions`
unless `include_archived` or `archived_only` asks for it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(
            sa.Column("pinned_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch.add_column(
            sa.Column("archived_at", sa.DateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("archived_at")
        batch.drop_column("pinned_at")
