"""Create sessions, events, messages and api_keys.

Revision ID: 0001
Revises:
Create Date: 2026-11-30 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_VARIANT = sa.JSON().with_variant(JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("title", sa.String(length=1000), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("tags", JSON_VARIANT, nullable=False),
        sa.Column("attributes", JSON_VARIANT, nullable=False),
        sa.Column("last_sequence", sa.Integer(), nullable=False),
        sa.Column("visible_message_count", sa.Integer(), nullable=False),
        sa.Column("internal_message_count", sa.Integer(), nullable=False),
        sa.Column("active_turn_id", sa.Uuid(), nullable=True),
        sa.Column("cancel_requested_at", TIMESTAMP, nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.Column("last_activity_at", TIMESTAMP, nullable=False),
        sa.Column("started_at", TIMESTAMP, nullable=True),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
    )
    op.create_index(op.f("ix_sessions_organization_id_created_at"), "sessions", ["organization_id", "created_at"])

    op.create_table(
        "events",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("turn_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_events_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sa.UniqueConstraint("session_id", "sequence", name=op.f("uq_events_session_id_sequence")),
    )
    op.create_index(op.f("ix_events_session_id_type"), "events", ["session_id", "type"])

    op.create_table(
        "messages",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("visibility", sa.String(length=16), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("turn_id", sa.Uuid(), nullable=True),
        sa.Column("client_message_id", sa.String(length=200), nullable=True),
        sa.Column("content", JSON_VARIANT, nullable=False),
        sa.Column("extra", JSON_VARIANT, nullable=False),
        sa.Column("snapshot", sa.Text(), nullable=False),
        sa.Column("changed_sequence", sa.Integer(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_messages_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_messages")),
        sa.UniqueConstraint("session_id", "sequence", name=op.f("uq_messages_session_id_sequence")),
        sa.UniqueConstraint(
            "session_id", "client_message_id", name=op.f("uq_messages_session_id_client_message_id")
        ),
    )
    op.create_index(
        op.f("ix_messages_session_id_visibility_sequence"), "messages", ["session_id", "visibility", "sequence"]
    )
    op.create_index(op.f("ix_messages_session_id_changed_sequence"), "messages", ["session_id", "changed_sequence"])
    op.create_index(op.f("ix_messages_state"), "messages", ["state"])

    op.create_table(
        "api_keys",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=24), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("revoked_at", TIMESTAMP, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )


def downgrade() -> None:
    op.drop_table("api_keys")
    op.drop_index(op.f("ix_messages_state"), table_name="messages")
    op.drop_index(op.f("ix_messages_session_id_changed_sequence"), table_name="messages")
    op.drop_index(op.f("ix_messages_session_id_visibility_sequence"), table_name="messages")
    op.drop_table("messages")
    op.drop_index(op.f("ix_events_session_id_type"), table_name="events")
    op.drop_table("events")
    op.drop_index(op.f("ix_sessions_organization_id_created_at"), table_name="sessions")
    op.drop_table("sessions")
