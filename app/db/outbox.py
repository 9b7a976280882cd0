"""The transactional outbox of a write unit of work: what must be announced once (and
only if) the transaction commits. The checkpoint writer and the services append to it;
the unit of work hands it to the bus (PostgreSQL sends it as NOTIFY inside the
transaction, the in-process bus delivers it after COMMIT)."""

import uuid
from dataclasses import dataclass, field


@dataclass
class Outbox:
    # Session -> the highest sequence this transaction committed for it, and the lowest.
    wakeups: dict[uuid.UUID, int] = field(default_factory=dict)
    firsts: dict[uuid.UUID, int] = field(default_factory=dict)
    # The sessions whose checkpoints here only added user messages (see
    # app.live.items.Wakeup.input_only).
    input_only: set[uuid.UUID] = field(default_factory=set)
    # Sessions whose turn this transaction started: the local runner picks them up.
    kicks: set[uuid.UUID] = field(default_factory=set)
    # Sessions this transaction deleted: every process drops what it holds of them.
    deleted: set[uuid.UUID] = field(default_factory=set)
    # An API key was created or revoked: every process re-checks the keys it trusts.
    keys_changed: bool = False

    def wake(
        self,
        session_id: uuid.UUID,
        sequence: int,
        *,
        input_only: bool = False,
        first: int | None = None,
    ) -> None:
        if first is not None:
            self.firsts[session_id] = min(first, self.firsts.get(session_id, first))
        if input_only and session_id not in self.wakeups:
            self.input_only.add(session_id)
        elif not input_only:
            self.input_only.discard(session_id)
        if sequence > self.wakeups.get(session_id, 0):
            self.wakeups[session_id] = sequence

    def kick(self, session_id: uuid.UUID) -> None:
        self.kicks.add(session_id)

    def delete(self, session_id: uuid.UUID) -> None:
        self.deleted.add(session_id)

    def __bool__(self) -> bool:
        return bool(self.wakeups or self.kicks or self.deleted or self.keys_changed)
