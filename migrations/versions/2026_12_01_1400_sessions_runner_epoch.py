"""sessions.runner_epoch and sessions.runner_renewed_at: fenced runner leases.

Every runner that takes a session over increments `runner_epoch` in its first
checkpoint, and every later checkpoint of that runner checks it under the row lock, so a
runner that lost its lease can no longer commit. `runner_renewed_at` is renewed by the
node holding the lease while the turn runs; the sweeper judges a runner gone by it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(
            sa.Column("runner_epoch", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("runner_renewed_at", sa.DateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("runner_renewed_at")
        batch.drop_column("runner_epoch")
