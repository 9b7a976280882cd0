"""ORM models: sessions, the durable event log, messages (rendered snapshots), API keys,
the Composer's summaries and feedback on messages."""

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base
from app.db.types import JsonVariant, UtcDateTime


class Session(Base):
    __tablename__ = "sessions"
    __table_args__ = (
        Index(None, "organization_id", "created_at"),
        Index(
            "ux_sessions_organization_external_id",
            "organization_id",
            "external_id",
            unique=True,
        ),
        # The sessions that run a turn: counted per organization at turn admission,
        # searched by the recovery sweep (migration 0011).
        Index(
            "ix_sessions_organization_id_running",
            "organization_id",
            postgresql_where=text("active_turn_id IS NOT NULL"),
            sqlite_where=text("active_turn_id IS NOT NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    organization_id: Mapped[uuid.UUID]
    title: Mapped[str | None] = mapped_column(String(1000))
    status: Mapped[str] = mapped_column(String(32))
    tags: Mapped[list[str]] = mapped_column(JsonVariant)
    # Every other create-time field (locale, goal, hints, model_id, agent_id, metadata, ...),
    # kept as sent so the wire shape can echo it.
    attributes: Mapped[dict[str, Any]] = mapped_column(JsonVariant)
    # The per-session event sequence; bumped under the row lock by every checkpoint.
    last_sequence: Mapped[int] = mapped_column(Integer, default=0)
    # The sequence of the newest user message, kept with the row lock: a runner reads it
    # with the lock to tell whether input arrived that its step did not see.
    last_input_sequence: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0"
    )
    # Message counters kept in the checkpoint transaction, so `total` never needs a COUNT.
    visible_message_count: Mapped[int] = mapped_column(Integer, default=0)
    internal_message_count: Mapped[int] = mapped_column(Integer, default=0)
    active_turn_id: Mapped[uuid.UUID | None]
    # Fenced runner leases: bumped by every runner that takes the session over, checked
    # by each of its checkpoints under the row lock (see app.runner.fence).
    runner_epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Renewed by the node holding the runner lease while a turn runs (PostgreSQL).
    runner_renewed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)
    last_activity_at: Mapped[datetime] = mapped_column(UtcDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # Set by PUT .../pin and .../archive, cleared by their DELETE.
    pinned_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    archived_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # When the purge deletes the session (app/sessions/retention.py); None: never, but
    # for SESSION_RETENTION_DAYS.
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime, index=True)
    # A frontend's own id for the conversation (the AI SDK's chat id), unique per
    # organization: `POST /v1/chat` finds the session by it.
    external_id: Mapped[str | None] = mapped_column(String(200))


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (
        UniqueConstraint("session_id", "sequence"),
        Index(None, "session_id", "type"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    session_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE")
    )
    sequence: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(64))
    turn_id: Mapped[uuid.UUID | None]
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # The wire JSON of the event, rendered once when it is appended.
    body: Mapped[str] = mapped_column(Text)


class Message(Base):
    __tablename__ = "messages"
    __table_args__ = (
        UniqueConstraint("session_id", "sequence"),
        UniqueConstraint("session_id", "client_message_id"),
        Index(None, "session_id", "visibility", "sequence"),
        Index(None, "session_id", "changed_sequence"),
        # A session's streaming messages (the only question asked of `state`): written
        # only while a message streams. PostgreSQL also stores rows of up to a page
        # uncompressed (migration 0010).
        Index(
            "ix_messages_session_id_streaming",
            "session_id",
            postgresql_where=text("state = 'streaming'"),
            sqlite_where=text("state = 'streaming'"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    session_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE")
    )
    # The sequence of the event that created the message; immutable.
    sequence: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    visibility: Mapped[str] = mapped_column(String(16))
    revision: Mapped[int] = mapped_column(Integer)
    turn_id: Mapped[uuid.UUID | None]
    client_message_id: Mapped[str | None] = mapped_column(String(200))
    # Every part, including provider_opaque parts the API never returns.
    content: Mapped[list[dict[str, Any]]] = mapped_column(JsonVariant)
    # Fields of the wire shape that are not columns (controls, metadata, phase, ...).
    extra: Mapped[dict[str, Any]] = mapped_column(JsonVariant)
    # The wire JSON of the message, rendered at every checkpoint and served as stored.
    snapshot: Mapped[str] = mapped_column(Text)
    # The event sequence of the latest checkpoint: the Mutation stream's cursor space.
    changed_sequence: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # The text the message is found by, once it is done and visible (app/db/search.py);
    # each database indexes it its own way, outside these models (migration 0009).
    search_text: Mapped[str | None] = mapped_column(Text, deferred=True)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    organization_id: Mapped[uuid.UUID]
    name: Mapped[str | None] = mapped_column(String(200))
    # SHA-256 of the key: keys are high-entropy random tokens, so a fast hash is enough
    # and lets a lookup be one indexed equality.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(24))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class ComposerSummary(Base):
    """Derived data of the Composer (app/runner/composer.py): a model-written summary of
    a session's messages from `first_sequence` to `last_sequence`, which stands in for
    them when history no longer fits the context. It takes no sequence and is never
    returned by messages, events or streams; it is rebuilt when missing."""

    __tablename__ = "composer_summaries"
    __table_args__ = (UniqueConstraint("session_id", "last_sequence"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    session_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE")
    )
    first_sequence: Mapped[int] = mapped_column(Integer)
    last_sequence: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)


class Feedback(Base):
    """A caller's rating and comment on a message: one per message and API key
    (`key_hash`, empty in open mode)."""

    __tablename__ = "feedback"
    __table_args__ = (Index(None, "session_id", "key_hash"),)

    message_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), primary_key=True
    )
    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE")
    )
    rating: Mapped[str | None] = mapped_column(String(8))
    comment: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)
