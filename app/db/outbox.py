"""The transactional outbox of a write unit of work: what must be announced once (and
only if) the transaction commits. The checkpoint writer and the services append to it;
the unit of work hands it to the bus (PostgreSQL sends it as NOTIFY inside the
transaction, the in-process bus delivers it after COMMIT)."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.db.reads import ChangedMessage, Checkpoints, LoggedEvent
from app.db.rows import EventRow, MessageRow


@dataclass
class Outbox:
    # Session -> the highest sequence this transaction committed for it, and the lowest.
    wakeups: dict[uuid.UUID, int] = field(default_factory=dict)
    firsts: dict[uuid.UUID, int] = field(default_factory=dict)
    # The sessions whose checkpoints here hold nothing a running step reacts to (see
    # app.live.items.Wakeup.quiet).
    quiet: set[uuid.UUID] = field(default_factory=set)
    # Sessions whose turn this transaction started: the local runner picks them up.
    kicks: set[uuid.UUID] = field(default_factory=set)
    # Sessions this transaction deleted: every process drops what it holds of them.
    deleted: set[uuid.UUID] = field(default_factory=set)
    # An API key was created or revoked: every process re-checks the keys it trusts.
    keys_changed: bool = False
    # What the checkpoints here wrote, per session: its events, and each message it
    # changed as it left it (see `written`).
    events: dict[uuid.UUID, list[LoggedEvent]] = field(default_factory=dict)
    messages: dict[uuid.UUID, dict[uuid.UUID, ChangedMessage]] = field(
        default_factory=dict
    )

    def wake(
        self,
        session_id: uuid.UUID,
        sequence: int,
        *,
        quiet: bool = False,
        first: int | None = None,
    ) -> None:
        if first is not None:
            self.firsts[session_id] = min(first, self.firsts.get(session_id, first))
        if quiet and session_id not in self.wakeups:
            self.quiet.add(session_id)
        elif not quiet:
            self.quiet.discard(session_id)
        if sequence > self.wakeups.get(session_id, 0):
            self.wakeups[session_id] = sequence

    def wrote(
        self,
        session_id: uuid.UUID,
        events: Sequence[EventRow],
        message: MessageRow | None,
    ) -> None:
        """A checkpoint's rows, as stored."""
        self.events.setdefault(session_id, []).extend(
            LoggedEvent(e.sequence, e.id, e.type, e.body.encode()) for e in events
        )
        if message is not None:
            self.messages.setdefault(session_id, {})[message.id] = ChangedMessage(
                message.changed_sequence,
                message.visibility == "visible",
                message.snapshot.encode(),
                message.id,
                message.revision,
                message.updated_at,
            )

    def written(self, session_id: uuid.UUID) -> Checkpoints | None:
        """What committed for the session here, as the fan-out would read it back
        (`Reads.checkpoints` over its wake-up's range); None unless the checkpoints
        here wrote every sequence of that range."""
        events = self.events.get(session_id)
        first = self.firsts.get(session_id)
        if not events or first is None:
            return None
        last = self.wakeups[session_id]
        if len(events) != last - first + 1 or events[0].sequence != first:
            return None
        changed = self.messages.get(session_id, {})
        return Checkpoints(events, list(changed.values()))

    def hush(self, session_id: uuid.UUID) -> None:
        """The session's checkpoints here were all its runner's own."""
        if session_id in self.wakeups:
            self.quiet.add(session_id)

    def kick(self, session_id: uuid.UUID) -> None:
        self.kicks.add(session_id)

    def delete(self, session_id: uuid.UUID) -> None:
        self.deleted.add(session_id)

    def __bool__(self) -> bool:
        return bool(self.wakeups or self.kicks or self.deleted or self.keys_changed)
