"""sessions.last_input_sequence: the sequence of the newest user message.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(
            sa.Column(
                "last_input_sequence",
                sa.Integer(),
                nullable=False,
                server_default="0",
            )
        )
    op.execute(
        "UPDATE sessions SET last_input_sequence = COALESCE("
        "(SELECT max(messages.sequence) FROM messages"
        " WHERE messages.session_id = sessions.id AND messages.role = 'user'), 0)"
    )


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("last_input_sequence")
