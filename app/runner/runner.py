"""The turn runner's supervision: one runner per session across all processes (a
lease), an inbox of bus items (kicks, wake-ups), a task per session whose turns it runs
one after another, and the process's part in recovery.

Deltas update the in-memory projection and go to the bus; they are never written to the
database. A step's complete parts commit at once when it finishes; tool transitions,
errors and closure are checkpoints of their own (app/runner/turn.py). Cancel requests
are durable (`sessions.cancel_requested_at`) and reach the runner through bus
wake-ups, so a cancel sent to any process stops a turn running on any other.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

from app.catalog.registry import Catalog
from app.db.admission import Admitted
from app.db.leases import create_leases
from app.db.reads import Reads
from app.db.session import Database
from app.errors import is_transient_db_error
from app.ids import format_id
from app.live.bus import Bus
from app.live.items import Kick, RepublishParts, Resync, Wakeup
from app.metrics import Metrics
from app.runner import outcomes, queries, recovery
from app.runner.fence import Fence, LeaseLost
from app.runner.history import History
from app.runner.progress import LiveStep
from app.runner.queries import ActiveTurn
from app.runner.runtime import Runtime
from app.runner.streaming import republish
from app.runner.turn import run_turn
from app.settings import Settings
from app.telemetry import logs, traces

log = logging.getLogger("app.runner")

# How long a runner waits before asking again for a lease the database did not answer.
LEASE_RETRY_SECONDS = 0.5


class TurnRunner:
    def __init__(
        self,
        *,
        settings: Settings,
        database: Database,
        reads: Reads,
        bus: Bus,
        catalog: Catalog | None = None,
    ) -> None:
        self.settings = settings
        self.bus = bus
        # Decided once (app/backend.py): on a shared database, leases and the sweeper
        # work across processes, and a drained turn is handed over.
        self.backend = settings.backend
        self.leases = create_leases(
            self.backend,
            settings.direct_url,
            renew_seconds=settings.runner_renew_seconds,
        )
        # The turns' units of work share the pool with requests, a few at a time
        # (app/db/admission.py).
        units = Admitted(database, settings.runner_db_slots)
        self.runtime = Runtime(
            settings=settings,
            database=units,
            reads=reads,
            bus=bus,
            fence=Fence(settings=settings, database=units, leases=self.leases, bus=bus),
            history=History(
                settings=settings, database=units, reads=reads, catalog=catalog
            ),
        )
        # Set by the application when metrics are on.
        self.metrics: Metrics | None = None
        self.tasks: dict[uuid.UUID, asyncio.Task[None]] = {}
        self.rekick: set[uuid.UUID] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        # Set when the process drains (app/ops/drain.py): it starts no session's runner;
        # the sessions it was asked to run meanwhile are handed over with the rest.
        self.draining = False
        self.handoff: set[uuid.UUID] = set()
        # While tracing is on: the trace context of what kicked each session (the
        # request whose commit started its turn), the parent of the turn's span.
        self.origins: dict[uuid.UUID, Any] = {}

    @property
    def live(self) -> dict[uuid.UUID, LiveStep]:
        """The step each streaming message of a turn run here is in."""
        return self.runtime.live

    # ---- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        await self.leases.start()
        # A free lease of a turn nobody renewed for two renewal periods: its runner is
        # gone (one process on SQLite: any free lease is).
        await recovery.recover(
            self.runtime,
            self.tasks,
            grace_seconds=2 * self.settings.runner_renew_seconds
            if self.backend.shared
            else 0,
        )
        if self.backend.shared:
            self._sweeper = asyncio.create_task(
                recovery.sweep(self.runtime, self.tasks), name="runner-sweeper"
            )

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = [*self.tasks.values(), *self._background]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.leases.stop()

    async def interrupt(self) -> list[uuid.UUID]:
        """Stop every turn running here, as shutting down does: each is left as it last
        committed, its lease released, for another process (or start-up recovery) to
        take over. Returns their sessions."""
        sessions = list(self.tasks)
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        return sessions

    async def hand_over(self, sessions: set[uuid.UUID]) -> None:
        """Announce sessions whose lease this process released with their turn unfinished
        (PostgreSQL): another process's runner takes each over at once (`Kick`), rather
        than its sweeper closing the turn as interrupted. A cleanly released lease is
        free, and the taker's first checkpoint claims the runner epoch, so nothing more
        is needed; the taker resumes the open agent message (see `TurnRun.resume`)."""
        if not self.backend.shared:
            return
        for session_id in sessions:
            with contextlib.suppress(Exception):
                self.bus.publish(Kick(session_id))

    # ---- the inbox -----------------------------------------------------------------

    def deliver(self, item: Wakeup | Kick | RepublishParts | Resync) -> None:
        """The runner's inbox (see app.live.dispatch)."""
        if isinstance(item, Kick):
            self.kick(item.session_id)
        elif isinstance(item, Wakeup):
            watch = None if item.quiet else self.runtime.watches.get(item.session_id)
            if watch is not None:
                watch.set()
        elif isinstance(item, RepublishParts):
            step = self.runtime.live.get(item.message_id)
            if step is not None:
                self._spawn(republish(self.runtime, step))
        else:
            for watch in self.runtime.watches.values():
                watch.set()

    def streams(self, message_id: uuid.UUID) -> bool:
        return message_id in self.runtime.live

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def kick(self, session_id: uuid.UUID) -> None:
        """Run the session's active turn here, unless this process already does."""
        if traces.tracer is not None:
            origin = traces.capture()
            if origin is not None:
                self.origins[session_id] = origin
        if session_id in self.tasks:
            self.rekick.add(session_id)
            return
        if self.draining:
            self.handoff.add(session_id)
            return
        task = asyncio.create_task(
            self._run_session(session_id), name=f"turn-{session_id.hex}"
        )
        self.tasks[session_id] = task

    # ---- a session's task ----------------------------------------------------------

    async def _run_session(self, session_id: uuid.UUID) -> None:
        # The task may have been created inside the request that kicked it: its log
        # lines are the session's and its turns', not that request's.
        logs.REQUEST_ID.set(None)
        logs.SESSION_ID.set(format_id("session", session_id))
        traces.detach()
        try:
            if not await self._acquire(session_id):
                return
            try:
                await self._run_turns(session_id)
            except LeaseLost as exc:
                log.warning("runner of session %s stopped: %s", session_id, exc)
                self.rekick.discard(session_id)
            finally:
                self.runtime.fence.epochs.pop(session_id, None)
                self.runtime.fence.runnable.pop(session_id, None)
                self.runtime.history.forget(session_id)
                await self.leases.release(session_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("runner for session %s failed", session_id)
        finally:
            self.tasks.pop(session_id, None)
            if session_id not in self.rekick:
                self.origins.pop(session_id, None)
            if session_id in self.rekick:
                self.rekick.discard(session_id)
                self.kick(session_id)

    async def _acquire(self, session_id: uuid.UUID) -> bool:
        """Take the session's lease. Another process may be finishing this session's
        previous turn; it re-checks for a new turn before letting go, so a short wait
        is enough. A database that does not answer (the lease connection timing out
        under load, a restart) is waited for as a checkpoint waits for it, up to
        RUNNER_OUTAGE_SECONDS: giving up would leave the turn to the sweep, which
        fails it."""
        deadline = time.monotonic() + self.settings.runner_outage_seconds
        busy = 0
        while busy < 20:
            try:
                acquired = await self.leases.try_acquire(session_id)
            except Exception as exc:
                if not is_transient_db_error(exc) or time.monotonic() > deadline:
                    raise
                log.warning(
                    "runner lease of session %s not taken (%s); trying again",
                    session_id,
                    type(exc).__name__,
                )
                await asyncio.sleep(LEASE_RETRY_SECONDS)
                continue
            if acquired:
                return True
            if not self.backend.shared:
                return False
            busy += 1
            await asyncio.sleep(0.1)
        return False

    async def _run_turn(self, session_id: uuid.UUID, active: ActiveTurn) -> str:
        """One turn; if even its ending failed, it is abandoned (ended `failed` without
        what it held in memory) rather than left active with no runner, which a retry
        would only fail the same way."""
        assert active.turn_id is not None
        try:
            return await run_turn(self.runtime, session_id, active)
        except Exception as exc:
            if isinstance(exc, LeaseLost) or is_transient_db_error(exc):
                # Not this turn's fault: another runner or start-up recovery takes it.
                raise
            log.exception("turn %s could not be ended; abandoning it", active.turn_id)
            await outcomes.abandon(
                self.runtime, session_id, active.turn_id, type(exc).__name__
            )
            return "abandoned"

    async def _run_turns(self, session_id: uuid.UUID) -> None:
        """The session's turns, one after another, while it has one to run."""
        while True:
            self.rekick.discard(session_id)
            active = await queries.active_turn(self.runtime.reads, session_id)
            turn_id = active.turn_id
            if turn_id is None:
                return
            started = time.monotonic()
            with traces.span(
                "turn",
                {
                    "evermirror.session_id": format_id("session", session_id),
                    "evermirror.turn_id": format_id("turn", turn_id),
                },
                parent=self.origins.pop(session_id, None),
            ) as turn_span:
                outcome = await self._run_turn(session_id, active)
                if turn_span is not None:
                    turn_span.set_attribute("evermirror.turn.outcome", outcome)
            if self.metrics is not None:
                self.metrics.turns.observe((outcome,), time.monotonic() - started)
            if not self.runtime.fence.runnable.pop(session_id, True):
                # Its last checkpoint left the session no turn to run. One started
                # since is kicked: here (`rekick`), or elsewhere, where its runner
                # waits for this lease.
                return
