"""Admission of new turns: a message that would start a turn is refused (`429` with
`Retry-After`, nothing written) while its organization, or this process, already runs
as many turns as allowed, and (`503` with `Retry-After`) while this process drains. A
message that steers a running turn is never refused here: it is a durable write the
turn (or whichever process takes it over) reads at its next step, whether this process
drains or not.

Admission is asked after the unit of work wrote the turn's start, as its last
statements: a refusal rolls the unit back, and a retry of a message already stored is
answered as a duplicate by the write itself, before any cap is asked.

Per organization the count is the database's (sessions with a running turn, across
every process, this one's included), taken under a per-organization lock for the rest
of the unit of work (PostgreSQL; SQLite's writers are serialized anyway), so two
concurrent posts cannot both take the last place. The lock is held from that count to
the commit, not across the unit's other statements: every post that starts a turn in
an organization passes through it one at a time. Per process the count is the turns the
local runner runs, plus those admitted here in the last moments whose runner has not
started yet (a turn starts on the process its message was posted to).
"""

import time
import uuid
from collections.abc import Callable, Collection

from app.db.rows import LockedSession
from app.db.writes import Write
from app.errors import Draining, TooManyRequests

# Turns take seconds to minutes; a client told to come back sooner would only be refused
# again.
RETRY_AFTER_SECONDS = 5
# How long an admitted turn counts before its runner shows up in `running`.
RESERVATION_SECONDS = 2.0


class TooManyTurns(TooManyRequests):
    code = "too_many_turns"


class TurnAdmission:
    def __init__(
        self,
        *,
        per_organization: int,
        per_process: int,
        running: Callable[[], Collection[uuid.UUID]],
    ) -> None:
        # 0 disables a cap.
        self.per_organization = per_organization
        self.per_process = per_process
        # The sessions whose turn this process's runner runs.
        self.running = running
        self._admitted: dict[uuid.UUID, float] = {}
        # Set when the process drains (app/ops/drain.py): it starts no new turn.
        self.draining = False

    def _running_here(self, now: float) -> int:
        running = self.running()
        for session_id, at in list(self._admitted.items()):
            if session_id in running or now - at > RESERVATION_SECONDS:
                del self._admitted[session_id]
        return len(running) + len(self._admitted)

    async def admit(self, db: Write, session: LockedSession) -> None:
        """Called once `db` wrote the start of a turn on `session` (under its row
        lock), before the unit commits. Raises TooManyTurns, or Draining: the caller's
        unit of work then rolls back."""
        if self.draining:
            raise Draining("turns")
        now = time.monotonic()
        if self.per_process and self._running_here(now) >= self.per_process:
            raise TooManyTurns(
                f"This server runs {self.per_process} turns already; retry later",
                retry_after_seconds=RETRY_AFTER_SECONDS,
            )
        if self.per_organization:
            await db.lock_organization(session.organization_id)
            # This session's turn, written by the unit, is one of them.
            running = await db.running_turns(session.organization_id)
            if running > self.per_organization:
                raise TooManyTurns(
                    f"The organization runs {self.per_organization} turns already "
                    "(the most allowed at once); retry later",
                    retry_after_seconds=RETRY_AFTER_SECONDS,
                )
        if self.per_process:
            self._admitted[session.id] = now
