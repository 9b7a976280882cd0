"""sessions: an index of the sessions that run a turn, by organization.

Two questions are asked of the running sessions only: how many an organization runs
(turn admission, under the organization's lock, at every message that starts a turn)
and which of them lost their runner (the recovery sweep). Without it the first read
every session of the organization and the second every session there is. The index
holds a row only while its session runs a turn.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 19:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNNING = sa.text("active_turn_id IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_sessions_organization_id_running",
        "sessions",
        ["organization_id"],
        postgresql_where=RUNNING,
        sqlite_where=RUNNING,
    )


def downgrade() -> None:
    op.drop_index("ix_sessions_organization_id_running", table_name="sessions")
