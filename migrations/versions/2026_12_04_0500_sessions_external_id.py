"""sessions.external_id: a frontend's own name for a conversation.

The AI SDK's `useChat` names a chat with an id of its own making (and AG-UI a thread
with its `threadId`); `POST /v1/chat` finds the caller's session by it, creating the
session on first use. Unique per organization, so two requests that use a new id at
once create one session.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 05:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("external_id", sa.String(200), nullable=True))
    op.create_index(
        "ux_sessions_organization_external_id",
        "sessions",
        ["organization_id", "external_id"],
        unique=True,
    )


def downgrade() -> None:
    op.drop_index("ux_sessions_organization_external_id", table_name="sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("external_id")
