"""The rows the write path works with: the session row as a unit of work locked it
(`LockedSession`), a message and an event as checkpoints write them, an optimistic
checkpoint deferred to the batch, the session heads this process committed last, and
the ways a checkpoint can find its row changed."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(slots=True)
class LockedSession:
    """What the checkpoint path needs of a session row it holds the lock of. Checkpoints
    update it as they go, so several of them can share one unit of work."""

    id: uuid.UUID
    organization_id: uuid.UUID
    status: str
    last_sequence: int
    # The sequence of the newest user message: input a running turn has not seen yet.
    last_input_sequence: int
    active_turn_id: uuid.UUID | None
    cancel_requested: bool
    visible_message_count: int
    internal_message_count: int
    # The epoch of the runner that owns the session's turns (see app.runner.fence):
    # written back as held, so a runner's claim commits with its checkpoint.
    runner_epoch: int

    def copy(self) -> "LockedSession":
        # A fifth of what dataclasses.replace costs; several per steering POST.
        return LockedSession(
            self.id,
            self.organization_id,
            self.status,
            self.last_sequence,
            self.last_input_sequence,
            self.active_turn_id,
            self.cancel_requested,
            self.visible_message_count,
            self.internal_message_count,
            self.runner_epoch,
        )


@dataclass(slots=True)
class MessageRow:
    id: uuid.UUID
    session_id: uuid.UUID
    sequence: int
    role: str
    state: str
    visibility: str
    revision: int
    turn_id: uuid.UUID | None
    client_message_id: str | None
    content: list[dict[str, Any]]
    extra: dict[str, Any]
    snapshot: str
    changed_sequence: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class EventRow:
    id: uuid.UUID
    sequence: int
    type: str
    turn_id: uuid.UUID | None
    # The wire JSON of the event.
    body: str


@dataclass(slots=True)
class Optimistic:
    """A checkpoint of a session row assumed as `head`, to be written as `session`
    with its message (PostgreSQL; see app.db.batch)."""

    head: LockedSession
    session: LockedSession
    now: datetime
    message: MessageRow
    events: Sequence[EventRow]
    started: bool
    finished: bool
    # (channel, payload): sent if and only if the checkpoint is written.
    notifications: list[tuple[str, str]] = field(default_factory=list)
    # A new message; else an update of the stored one, at the revision before its own.
    inserted: bool = True


class StaleMessage(Exception):
    """The message changed since it was read: its revision is not the one expected."""


class DuplicateMessage(Exception):
    """The session already has a message with this client_message_id: nothing of the
    checkpoint was written."""


class SessionChanged(Exception):
    """An optimistic unit of work found the session row not as its head said (or the
    checkpoint's client_message_id taken): nothing was written. Run the unit again,
    locking the row."""

    def __init__(self, session_id: uuid.UUID) -> None:
        super().__init__(f"session {session_id} is not as assumed")
        self.session_id = session_id


class SessionHeads:
    """The session rows as this process's own writes leave them (committed, or handed
    to the group commit and dropped if that fails), newest first out: what an
    optimistic unit of work assumes instead of locking. A head may be stale
    (another process, or a statement outside the checkpoint path, changed the row):
    the optimistic write checks every column it assumes, so a stale head costs one
    failed statement, never a wrong write."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._heads: dict[uuid.UUID, LockedSession] = {}

    def get(self, session_id: uuid.UUID) -> LockedSession | None:
        head = self._heads.get(session_id)
        return None if head is None else head.copy()

    def put(self, head: LockedSession) -> None:
        held = self._heads.pop(head.id, None)
        # Commits of one session can publish out of order: keep the newest.
        if held is not None and held.last_sequence > head.last_sequence:
            head = held
        self._heads[head.id] = head
        if len(self._heads) > self.capacity:
            del self._heads[next(iter(self._heads))]

    def discard(self, session_id: uuid.UUID) -> None:
        self._heads.pop(session_id, None)
