"""Owning a session's turn: the lease this process must hold to publish or write, and
checkpoints fenced by the runner epoch, retried through a database outage."""

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from app.db.admission import Units
from app.db.leases import Leases, Regain
from app.db.rows import LockedSession, MessageRow, SessionChanged, StaleMessage
from app.db.writes import Write
from app.errors import is_transient_db_error
from app.journal.sessions import lock_session
from app.live.bus import Bus
from app.live.items import ModelWarning, PartStarted, StepEnded, TextDelta
from app.runner import queries
from app.runner.progress import TurnProgress
from app.settings import Settings

log = logging.getLogger("app.runner")

T = TypeVar("T")

# Checkpoints written again because an Action changed the message under the runner.
MAX_STALE_RETRIES = 5

# One checkpoint's writes, under the session row lock: the message it wrote, if any.
WriteUnit = Callable[[Write, LockedSession], Awaitable[MessageRow | None]]


class TurnCancelled(Exception):
    pass


class LeaseLost(Exception):
    """This process no longer owns the session's turn: another runner claimed it, or the
    lease could not be regained in time. Nothing more may be written or published."""


class Outage:
    """Retries while the database is unavailable: a growing pause between attempts,
    for at most `seconds` in all; any other failure, or one past that, is raised."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.delay = 0.1

    async def wait(self, exc: Exception) -> None:
        if not is_transient_db_error(exc) or time.monotonic() >= self.deadline:
            raise exc
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, 2.0)


@dataclass(frozen=True, slots=True)
class Landed:
    """A checkpoint found committed after all, and the message as it stored it."""

    message: MessageRow | None


class Fence:
    def __init__(
        self, *, settings: Settings, database: Units, leases: Leases, bus: Bus
    ) -> None:
        self.settings = settings
        self.database = database
        self.leases = leases
        self.bus = bus
        # The runner epoch this process claimed for each session it runs, once the
        # claim has committed (see `checkpoint`).
        self.epochs: dict[uuid.UUID, int] = {}
        # Whether each session's last checkpoint here left it a turn to run (as
        # `queries.active_turn` would find it): after a turn that ended with none, its
        # runner need not read the session again before letting it go.
        self.runnable: dict[uuid.UUID, bool] = {}

    async def owned(self, session_id: uuid.UUID) -> None:
        """Return once this process holds the session's lease: at once while it does;
        after a lost lease connection, once the lease is regained with nobody having
        claimed the session meanwhile. Raises LeaseLost if another runner did, or if the
        lease cannot be regained within `runner_outage_seconds`."""
        if self.leases.holds(session_id):
            return
        deadline = time.monotonic() + self.settings.runner_outage_seconds
        delay = 0.05
        while True:
            regained = await self.leases.regain(session_id, self.epochs.get(session_id))
            if regained is Regain.HELD:
                return
            if regained is Regain.TAKEN:
                raise LeaseLost("another runner took the session over")
            if time.monotonic() >= deadline:
                raise LeaseLost("the lease could not be regained in time")
            # Retried at least once a renewal period: well within the grace other
            # nodes give a runner before taking its turn over.
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.runner_renew_seconds)

    async def publish(
        self,
        session_id: uuid.UUID,
        item: PartStarted | TextDelta | ModelWarning | StepEnded,
    ) -> None:
        """A live frame of the turn: only while this process owns it."""
        await self.owned(session_id)
        self.bus.publish(item)

    async def retrying(self, read: Callable[[], Awaitable[T]]) -> T:
        """A read of a running turn, retried while the database is unavailable (within
        `runner_outage_seconds`)."""
        outage = Outage(self.settings.runner_outage_seconds)
        while True:
            try:
                return await read()
            except Exception as exc:
                await outage.wait(exc)

    async def checkpoint(
        self,
        session_id: uuid.UUID,
        turn_id: uuid.UUID,
        write: WriteUnit,
        *,
        ending: bool = False,
        turn: TurnProgress | None = None,
    ) -> MessageRow | None:
        """Run `write` as one checkpoint of the turn and return the message it wrote.

        Fenced: the checkpoint runs only while this process holds the lease, and under
        the session row lock it checks the runner epoch. The first checkpoint of a
        runner claims the session (epoch + 1, committed with it); every later one
        requires the epoch it claimed, so once another runner has taken the session
        over (and claimed it in turn) this one can never commit again: LeaseLost.

        Not ended by an outage: while the database is unavailable the checkpoint is
        retried (within `runner_outage_seconds`), and after a COMMIT whose outcome is
        unknown, the next attempt first checks whether it landed. `write` must work on
        copies of what it changes (the runner adopts them only after the commit).

        TurnCancelled when the turn is not the session's any more or a cancel was
        requested; with `ending` (the turn's last checkpoint, which writes the cancel or
        failure) a cancel request does not stop it, and an ended turn writes nothing.

        `write` works from `turn.message`. When that changed under the runner (an
        Action joined it: `PATCH /v1/sessions/{id}` is its only other writer while the
        turn runs), the checkpoint is written again from the stored message.

        Written optimistically first (PostgreSQL: the row assumed as this process's
        last write leaves it, a checkpoint of one message one statement of the group
        commit, see app.db.batch; a unit that does more locks the row as it goes), and
        again under the lock if the row or the message was not as assumed."""
        outage = Outage(self.settings.runner_outage_seconds)
        stale = 0
        # Set when a COMMIT went unanswered: what that attempt wrote.
        uncertain = False
        attempted: MessageRow | None = None
        optimistic = True
        while True:
            await self.owned(session_id)
            written: MessageRow | None = None
            try:
                async with self.database.write(
                    optimistic=optimistic and not uncertain
                ) as db:
                    session = await lock_session(db, session_id)
                    if session is None:
                        raise TurnCancelled
                    claimed = self.epochs.get(session_id)
                    if claimed is not None and session.runner_epoch != claimed:
                        raise LeaseLost("another runner took the session over")
                    if uncertain:
                        landed = await _landed(db, session, turn_id, attempted)
                        if landed is not None:
                            self.epochs[session_id] = session.runner_epoch
                            return landed.message
                    if session.active_turn_id != turn_id:
                        if ending:
                            return None
                        raise TurnCancelled
                    if session.cancel_requested and not ending:
                        raise TurnCancelled
                    if claimed is None:
                        session.runner_epoch += 1
                    written = await write(db, session)
                    # Its wake-up need not make the turn's own step look (it would
                    # read the session back at every step for nothing).
                    db.outbox.hush(session_id)
                self.epochs[session_id] = session.runner_epoch
                self.runnable[session_id] = queries.runnable(
                    session.active_turn_id, session.status, session.cancel_requested
                )
                return written
            except (TurnCancelled, LeaseLost):
                raise
            except SessionChanged:
                # Nothing was written: another writer came between. Under the lock.
                optimistic = False
            except StaleMessage:
                stale += 1
                if turn is None or turn.message is None or stale > MAX_STALE_RETRIES:
                    raise
                await self._reread(turn, turn.message.id)
            except Exception as exc:
                if getattr(exc, "statement", None) == "COMMIT":
                    uncertain, attempted = True, written
                await outage.wait(exc)
                log.warning(
                    "checkpoint of turn %s failed (%s); retried",
                    turn_id,
                    type(exc).__name__,
                )

    async def _reread(self, turn: TurnProgress, message_id: uuid.UUID) -> None:
        async def read() -> MessageRow:
            return await queries.read_message(self.database, message_id)

        turn.message = await self.retrying(read)


async def _landed(
    db: Write,
    session: LockedSession,
    turn_id: uuid.UUID,
    written: MessageRow | None,
) -> Landed | None:
    """Whether a checkpoint whose COMMIT went unanswered committed after all: its
    message is stored at the revision it wrote, or (a checkpoint without a message:
    the turn's end) the turn is over."""
    if written is None:
        return Landed(None) if session.active_turn_id != turn_id else None
    stored = await db.message(written.id)
    if stored is not None and stored.revision == written.revision:
        return Landed(stored)
    return None
