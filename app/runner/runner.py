"""The turn runner: one per session across all processes (a lease), driving a model
driver step by step, publishing the live projection and committing checkpoints.

Deltas update the in-memory projection and go to the bus; they are never written to the
database. A step's complete parts commit at once when it finishes; tool transitions,
errors and closure are checkpoints of their own. Cancel requests are durable
(`sessions.cancel_requested_at`) and reach the runner through bus wake-ups, so a cancel
sent to any process stops a turn running on any other.
"""

import asyncio
import contextlib
import copy
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import func, insert, or_, select
from sqlalchemy.exc import IntegrityError

from app import wire
from app.catalog.registry import Catalog, Model
from app.db import models
from app.db.dialect import Regain, create_leases
from app.db.reads import Reads
from app.db.session import Database
from app.db.types import utcnow
from app.db.writes import LockedSession, MessageRow, StaleMessage, Write
from app.errors import is_transient_db_error
from app.events.service import EventSpec
from app.ids import format_id, uuid7
from app.live.bus import Bus
from app.live.items import (
    TOOL_INPUT_DELTA,
    Kick,
    ModelWarning,
    PartStarted,
    RepublishParts,
    Resync,
    StepEnded,
    TextDelta as LiveDelta,
    Wakeup,
)
from app.messages import checkpoint
from app.metrics import Metrics
from app.ops import logs, traces
from app.runner import composer
from app.runner.drivers import (
    BUILTIN_TOOLS,
    Annotations,
    Driver,
    ModelError,
    ReasoningDelta,
    Retrying,
    StepFinish,
    TextDelta,
    ToolCall,
    ToolCallStarted,
    ToolInputDelta,
    Turn,
    create_driver,
    run_tool,
)
from app.sessions import service as sessions_service
from app.settings import Settings
from app.tools import lifecycle
from app.tools.schemas import is_client_side, needs_approval

log = logging.getLogger("app.runner")

T = TypeVar("T")

HISTORY_FOR_MODEL = 50
# The step cap of a session created without `max_iterations`.
DEFAULT_MAX_ITERATIONS = 20
# Checkpoints written again because an Action changed the message under the runner.
MAX_STALE_RETRIES = 5
# Upstream's session status while a turn waits for client-side tool results.
WAITING = "waitingfortoolresults"


class TurnCancelled(Exception):
    pass


class LeaseLost(Exception):
    """This process no longer owns the session's turn: another runner claimed it, or the
    lease could not be regained in time. Nothing more may be written or published."""


@dataclass(slots=True)
class TurnProgress:
    """Where a running turn is: its step, its tool calls so far, the newest input its
    step has seen, and its agent message as last committed."""

    session_id: uuid.UUID
    turn_id: uuid.UUID
    started: float
    iteration: int = 0
    tool_count: int = 0
    consumed: int = 0
    message: MessageRow | None = None
    # The results of the previous step's tool calls, for the next step.
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    # Token usage of each committed step, by step number (set again, never added, so a
    # retried checkpoint counts once).
    step_usage: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def usage(self) -> dict[str, Any] | None:
        total: dict[str, Any] | None = None
        for usage in self.step_usage.values():
            total = sessions_service.add_usage(total, usage)
        return total


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


@dataclass(frozen=True, slots=True)
class Context:
    """What a step starts from (see `TurnRunner._history`)."""

    messages: list[dict[str, Any]]
    model_input: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    consumed: int
    cancelled: bool
    # The driver of the model the step runs, and the provider's name for that model
    # (None: the driver's own).
    driver: Driver
    model: str | None = None


@dataclass
class LiveStep:
    """The projection of one model Step of a streaming message."""

    session_id: uuid.UUID
    message_id: uuid.UUID
    turn_id: uuid.UUID
    revision: int
    first_sequence: int
    parts: list[dict[str, Any]] = field(default_factory=list)
    phase: str | None = None
    # The UTF-16 length of each live part's text (the offset of its next delta), kept
    # per delta: measuring the whole text on every delta would be quadratic.
    units: dict[str, int] = field(default_factory=dict)
    # The step's token usage, as the model reported it.
    usage: dict[str, Any] = field(default_factory=dict)
    # Tool calls whose arguments were not valid JSON: committed failed, never run. The
    # turn goes on, so the model sees why.
    failed_calls: list[ToolCall] = field(default_factory=list)

    def new_part(self, part: dict[str, Any]) -> dict[str, Any]:
        sequence = self.first_sequence + len(self.parts)
        part = {
            "part_id": checkpoint.part_id("agent", part["type"], sequence),
            "sequence": sequence,
            **part,
        }
        self.parts.append(part)
        return part

    def part_started(self, part: dict[str, Any]) -> PartStarted:
        return PartStarted(
            self.session_id,
            self.message_id,
            self.revision,
            format_id("turn", self.turn_id),
            dict(part),
        )

    def delta(
        self,
        part_id: str,
        offset: int,
        text: str,
        event_type: str,
        tool_call_id: str | None = None,
    ) -> LiveDelta:
        return LiveDelta(
            self.session_id,
            self.message_id,
            self.revision,
            format_id("turn", self.turn_id),
            part_id,
            offset,
            text,
            event_type,
            format_id("event", uuid7()),
            wire.event_ts(utcnow()),
            tool_call_id,
        )

    def restart(self) -> None:
        """The model request is tried again: what it streamed is void. The same part
        ids start over (their `part` frames replace what clients hold)."""
        self.parts = []
        self.units = {}
        self.phase = None
        self.usage = {}
        self.failed_calls = []

    def settled(self) -> list[dict[str, Any]]:
        """The step's parts as they stand, in their committed form: reasoning text in
        upstream's structure, a tool call's streamed input replaced by its arguments,
        and tool calls that never got to run (the step was cut off) failed."""
        parts = []
        for live in self.parts:
            part = dict(live)
            if part["type"] == "reasoning" and isinstance(part.get("text"), str):
                part["text"] = {"kind": "plain", "text": part["text"]}
            elif part["type"] == "tool_call":
                part.pop("input_text", None)
                if lifecycle.current(part.get("status")) in (
                    lifecycle.INPUT_STREAMING,
                    lifecycle.READY,
                ):
                    part["status"] = lifecycle.FAILED
                    part.setdefault("error", "The turn ended before this tool ran")
                    part.setdefault("arguments", {})
            parts.append(part)
        return parts


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
        # The models sessions and messages select (their name for the provider, their
        # context size); None: the driver's own model and MODEL_CONTEXT_TOKENS.
        self.catalog = catalog
        self.database = database
        # Single-statement reads on the driver (app/db/reads.py): what a turn polls
        # on every wake-up of its session.
        self.reads = reads
        self.bus = bus
        # Set by the application when metrics are on.
        self.metrics: Metrics | None = None
        # One driver of each kind the catalog names; MODEL_DRIVER's is the default.
        self.driver = create_driver(settings)
        self.drivers: dict[str, Driver] = {self.driver.name: self.driver}
        for entry in catalog.models if catalog is not None else ():
            if entry.driver not in self.drivers:
                self.drivers[entry.driver] = create_driver(settings, entry.driver)
        self.leases = create_leases(
            settings.database_url, renew_seconds=settings.runner_renew_seconds
        )
        self.tasks: dict[uuid.UUID, asyncio.Task[None]] = {}
        self.rekick: set[uuid.UUID] = set()
        self.live: dict[uuid.UUID, LiveStep] = {}
        # The runner epoch this process claimed for each session it runs, once the
        # claim has committed (see `_checkpoint`).
        self.epochs: dict[uuid.UUID, int] = {}
        # Set by every wake-up of a session whose turn runs here: time to check for a
        # cancel request.
        self.watches: dict[uuid.UUID, asyncio.Event] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.is_distributed = settings.database_url.startswith("postgresql")
        # Set when the process drains (app/ops/drain.py): it starts no session's runner;
        # the sessions it was asked to run meanwhile are handed over with the rest.
        self.draining = False
        self.handoff: set[uuid.UUID] = set()
        # While tracing is on: the trace context of what kicked each session (the
        # request whose commit started its turn), the parent of the turn's span.
        self.origins: dict[uuid.UUID, Any] = {}

    # ---- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        await self.leases.start()
        # A free lease of a turn nobody renewed for two renewal periods: its runner is
        # gone (one process on SQLite: any free lease is).
        await self.recover(
            grace_seconds=2 * self.settings.runner_renew_seconds
            if self.is_distributed
            else 0
        )
        if self.is_distributed:
            self._sweeper = asyncio.create_task(self._sweep(), name="runner-sweeper")

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
        is needed; the taker resumes the open agent message (see `_resume`)."""
        if not self.is_distributed:
            return
        for session_id in sessions:
            with contextlib.suppress(Exception):
                await self.bus.publish(Kick(session_id))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- control -------------------------------------------------------------------

    def deliver(self, item: Wakeup | Kick | RepublishParts | Resync) -> None:
        """The runner's inbox (see app.live.dispatch)."""
        if isinstance(item, Kick):
            self.kick(item.session_id)
        elif isinstance(item, Wakeup):
            watch = None if item.input_only else self.watches.get(item.session_id)
            if watch is not None:
                watch.set()
        elif isinstance(item, RepublishParts):
            step = self.live.get(item.message_id)
            if step is not None:
                self._spawn(self._republish(step))
        else:
            for watch in self.watches.values():
                watch.set()

    async def _republish(self, step: LiveStep) -> None:
        if not self.leases.holds(step.session_id):
            return
        for part in list(step.parts):
            await self.bus.publish(step.part_started(part))

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

    async def _run_session(self, session_id: uuid.UUID) -> None:
        # The task may have been created inside the request that kicked it: its log
        # lines are the session's and its turns', not that request's.
        logs.REQUEST_ID.set(None)
        logs.SESSION_ID.set(format_id("session", session_id))
        traces.detach()
        try:
            acquired = False
            # Another process may be finishing this session's previous turn; it re-checks
            # for a new turn before letting go, so a short wait is enough.
            for _ in range(20):
                if await self.leases.try_acquire(session_id):
                    acquired = True
                    break
                if not self.is_distributed:
                    return
                await asyncio.sleep(0.1)
            if not acquired:
                return
            try:
                while True:
                    self.rekick.discard(session_id)
                    turn_id, max_iterations = await self._active_turn(session_id)
                    if turn_id is None:
                        break
                    started = time.monotonic()
                    with traces.span(
                        "turn",
                        {
                            "evermirror.session_id": format_id("session", session_id),
                            "evermirror.turn_id": format_id("turn", turn_id),
                        },
                        parent=self.origins.pop(session_id, None),
                    ) as turn_span:
                        outcome = await self._run_turn(
                            session_id, turn_id, max_iterations
                        )
                        if turn_span is not None:
                            turn_span.set_attribute("evermirror.turn.outcome", outcome)
                    if self.metrics is not None:
                        self.metrics.turns.observe(
                            (outcome,), time.monotonic() - started
                        )
            except LeaseLost as exc:
                log.warning("runner of session %s stopped: %s", session_id, exc)
                self.rekick.discard(session_id)
            finally:
                self.epochs.pop(session_id, None)
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

    async def _active_turn(self, session_id: uuid.UUID) -> tuple[uuid.UUID | None, int]:
        """The session's running turn, and its step cap. A turn waiting for client tool
        results has no runner until they arrive (or a cancel is requested)."""
        async with self.database.statements() as conn:
            row = (
                await conn.execute(
                    select(
                        models.Session.active_turn_id,
                        models.Session.attributes,
                        models.Session.status,
                        models.Session.cancel_requested_at,
                    ).where(models.Session.id == session_id)
                )
            ).one_or_none()
        if row is None:
            return None, DEFAULT_MAX_ITERATIONS
        cap = row.attributes.get("max_iterations") or DEFAULT_MAX_ITERATIONS
        if row.status == WAITING and row.cancel_requested_at is None:
            return None, int(cap)
        return row.active_turn_id, int(cap)

    async def _session_tools(
        self, session_id: uuid.UUID
    ) -> tuple[list[dict[str, Any]], bool]:
        """The session's tool definitions as they are now (a PATCH takes effect at the
        next step), and whether tools that require approval ask for it."""
        async with self.database.statements() as conn:
            attributes = await conn.scalar(
                select(models.Session.attributes).where(models.Session.id == session_id)
            )
        attributes = attributes or {}
        ask = attributes.get("approval_mode") != "always-allow"
        return list(attributes.get("tools") or []), ask

    # ---- owning the turn: fenced checkpoints -----------------------------------------

    async def _owned(self, session_id: uuid.UUID) -> None:
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

    async def _publish(
        self, session_id: uuid.UUID, item: PartStarted | LiveDelta | ModelWarning
    ) -> None:
        """A live frame of the turn: only while this process owns it. Shielded: a
        cancel stops the step streaming it (see `_stream_step`), but never a publish
        half-sent (on PostgreSQL that would break the shared NOTIFY connection)."""
        await self._owned(session_id)
        await asyncio.shield(self.bus.publish(item))

    async def _checkpoint(
        self,
        session_id: uuid.UUID,
        turn_id: uuid.UUID,
        write: Callable[[Write, LockedSession], Awaitable[MessageRow | None]],
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
        turn runs), the checkpoint is written again from the stored message."""
        outage = Outage(self.settings.runner_outage_seconds)
        stale = 0
        # Set when a COMMIT went unanswered: what that attempt wrote.
        uncertain = False
        attempted: MessageRow | None = None
        while True:
            await self._owned(session_id)
            written: MessageRow | None = None
            try:
                async with self.database.write() as db:
                    session = await sessions_service.lock_session(db, session_id)
                    if session is None:
                        raise TurnCancelled
                    claimed = self.epochs.get(session_id)
                    if claimed is not None and session.runner_epoch != claimed:
                        raise LeaseLost("another runner took the session over")
                    if uncertain:
                        landed = await self._landed(db, session, turn_id, attempted)
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
                self.epochs[session_id] = session.runner_epoch
                return written
            except (TurnCancelled, LeaseLost):
                raise
            except StaleMessage:
                stale += 1
                if turn is None or turn.message is None or stale > MAX_STALE_RETRIES:
                    raise
                turn.message = await self._retrying(
                    functools.partial(self._read_message, turn.message.id)
                )
            except Exception as exc:
                if getattr(exc, "statement", None) == "COMMIT":
                    uncertain, attempted = True, written
                await outage.wait(exc)
                log.warning(
                    "checkpoint of turn %s failed (%s); retried",
                    turn_id,
                    type(exc).__name__,
                )

    async def _retrying(self, read: Callable[[], Awaitable[T]]) -> T:
        """A read of a running turn, retried while the database is unavailable (within
        `runner_outage_seconds`)."""
        outage = Outage(self.settings.runner_outage_seconds)
        while True:
            try:
                return await read()
            except Exception as exc:
                await outage.wait(exc)

    async def _landed(
        self,
        db: Write,
        session: LockedSession,
        turn_id: uuid.UUID,
        written: MessageRow | None,
    ) -> "Landed | None":
        """Whether a checkpoint whose COMMIT went unanswered committed after all: its
        message is stored at the revision it wrote, or (a checkpoint without a message:
        the turn's end) the turn is over."""
        if written is None:
            return Landed(None) if session.active_turn_id != turn_id else None
        stored = await db.message(written.id)
        if stored is not None and stored.revision == written.revision:
            return Landed(stored)
        return None

    # ---- a turn --------------------------------------------------------------------

    async def _history(self, session_id: uuid.UUID) -> "Context":
        """The recent conversation for the model (wire messages, and composed for it),
        the newest user message sequence it includes, and whether a cancel was
        requested (read first: a cancel that commits after it is seen at the step's
        checkpoint)."""
        async with self.database.statements() as conn:
            session = (
                await conn.execute(
                    select(
                        models.Session.cancel_requested_at, models.Session.attributes
                    ).where(models.Session.id == session_id)
                )
            ).one_or_none()
            rows = (
                await conn.execute(
                    select(
                        models.Message.snapshot,
                        models.Message.role,
                        models.Message.sequence,
                        models.Message.visibility,
                        models.Message.content,
                    )
                    .where(models.Message.session_id == session_id)
                    .order_by(models.Message.sequence.desc())
                    .limit(HISTORY_FOR_MODEL)
                )
            ).all()
        cancel, attributes = session if session is not None else (None, {})
        attributes = attributes or {}
        rows = list(reversed(rows))
        consumed = max((row.sequence for row in rows if row.role == "user"), default=0)
        tools = [*BUILTIN_TOOLS, *(attributes.get("tools") or ())]
        history = [
            composer.HistoryMessage(
                row.sequence, row.role, row.visibility, list(row.content)
            )
            for row in rows
        ]
        messages = [wire.loads(row.snapshot) for row in rows]
        model = self._model(attributes, messages)
        driver = self.drivers[model.driver] if model is not None else self.driver
        context_tokens = (
            model.context_tokens
            if model is not None
            else self.settings.model_context_tokens
        )
        fitted = functools.partial(
            composer.fit,
            history,
            system_prompt=attributes.get("system_prompt"),
            provider=driver.name,
            context_tokens=context_tokens,
        )
        composition = fitted()
        if composition.omitted_through is not None:
            summary = await self._summary(
                session_id, driver, history, composition.omitted_through, context_tokens
            )
            if summary is not None:
                composition = fitted(summary=summary)
        return Context(
            messages,
            composition.messages,
            tools,
            consumed,
            cancel is not None,
            driver,
            model.provider_model if model is not None else None,
        )

    def _model(
        self, attributes: dict[str, Any], messages: list[dict[str, Any]]
    ) -> Model | None:
        """The catalog model of the next step: the newest user message's
        `controls.model_id`, else the session's `model_id`, else the default."""
        if self.catalog is None:
            return None
        chosen = attributes.get("model_id")
        for message in reversed(messages):
            if message["role"] == "user":
                chosen = (message.get("controls") or {}).get("model_id") or chosen
                break
        return self.catalog.get(chosen)

    async def _summary(
        self,
        session_id: uuid.UUID,
        driver: Driver,
        history: list[composer.HistoryMessage],
        through: int,
        context_tokens: int,
    ) -> composer.Summary | None:
        """A summary of the session's messages up to at least `through`: the newest
        stored one if it reaches that far; otherwise the model writes one (extending
        the newest stored, which it then replaces as the one in use) and it is stored
        as derived data. None if the model could not: history is then truncated."""
        newest = max((m.sequence for m in history), default=0)
        async with self.database.statements() as conn:
            row = (
                await conn.execute(
                    select(
                        models.ComposerSummary.first_sequence,
                        models.ComposerSummary.last_sequence,
                        models.ComposerSummary.text,
                    )
                    .where(
                        models.ComposerSummary.session_id == session_id,
                        models.ComposerSummary.last_sequence <= newest,
                    )
                    .order_by(models.ComposerSummary.last_sequence.desc())
                    .limit(1)
                )
            ).one_or_none()
        previous = (
            composer.Summary(row.last_sequence, row.text) if row is not None else None
        )
        if previous is not None and previous.last_sequence >= through:
            return previous
        request = composer.summary_request(
            history,
            provider=driver.name,
            context_tokens=context_tokens,
            previous=previous,
            through=through,
        )
        try:
            text = await driver.summarize(request)
        except Exception as exc:
            log.warning("history summary failed, history truncated instead: %s", exc)
            return None
        if not text:
            return None
        first = (
            row.first_sequence if row is not None else min(m.sequence for m in history)
        )
        with contextlib.suppress(IntegrityError):
            async with self.database.write() as db:
                conn = await db.core()
                await conn.execute(
                    insert(models.ComposerSummary).values(
                        id=uuid.uuid4(),
                        session_id=session_id,
                        first_sequence=first,
                        last_sequence=through,
                        text=text,
                        created_at=utcnow(),
                    )
                )
        log.info("history up to sequence %d summarized", through)
        return composer.Summary(through, text)

    async def _run_turn(
        self, session_id: uuid.UUID, turn_id: uuid.UUID, max_iterations: int
    ) -> str:
        """Step the model until a step answers without tool calls and no input arrived
        that it did not see, or until `max_iterations` steps. The runner holds the
        streaming message between checkpoints: it is its only writer while the turn
        runs (each checkpoint is fenced, see `_checkpoint`, and the message update
        checks the revision). Returns how it ended: completed, cancelled or failed."""
        logs.TURN_ID.set(format_id("turn", turn_id))
        watch = self.watches[session_id] = asyncio.Event()
        turn = TurnProgress(session_id, turn_id, time.monotonic())
        # How the turn ended here, for its log line (left to recovery unless set).
        outcome = "interrupted"
        try:
            await self._resume(turn)
            if turn.message is not None and turn.iteration >= max_iterations:
                # Resumed at the step cap (client results arrived for its last step,
                # or its runner stopped between the cap's tools and its close). Input
                # its steps saw is answered; newer input gets a turn of its own.
                turn.consumed = await self._retrying(
                    functools.partial(self._seen_input, turn)
                )
                await self._checkpoint(
                    session_id,
                    turn_id,
                    functools.partial(self._write_cap, turn),
                    turn=turn,
                )
                outcome = "completed"
                return outcome
            while True:
                turn.iteration += 1
                context = await self._retrying(
                    functools.partial(self._history, session_id)
                )
                turn.consumed = context.consumed
                if context.cancelled:
                    raise TurnCancelled
                if turn.message is None:
                    turn.message = await self._checkpoint(
                        session_id,
                        turn_id,
                        functools.partial(
                            self._write_open,
                            turn,
                            context.model or context.driver.name,
                        ),
                    )
                assert turn.message is not None
                step = LiveStep(
                    session_id,
                    turn.message.id,
                    turn_id,
                    turn.message.revision,
                    len(turn.message.content) + 1,
                )
                self.live[step.message_id] = step
                with traces.span(
                    "model.step",
                    {
                        "gen_ai.system": context.driver.name,
                        "evermirror.step": turn.iteration,
                    },
                ) as step_span:
                    tool_calls = await self._stream_step(
                        turn,
                        step,
                        Turn(
                            context.messages,
                            turn.iteration,
                            turn.tool_results,
                            context.model_input,
                            context.tools,
                            context.model,
                        ),
                        watch,
                        context.driver,
                    )
                    if step_span is not None:
                        step_span.set_attribute(
                            "evermirror.step.tool_calls", len(tool_calls)
                        )
                last = turn.iteration >= max_iterations
                turn.message = await self._checkpoint(
                    session_id,
                    turn_id,
                    functools.partial(self._write_step, turn, step, tool_calls, last),
                    turn=turn,
                )
                assert turn.message is not None
                self.live.pop(step.message_id, None)
                with traces.span("bus.publish", {"evermirror.bus.item": "step_ended"}):
                    await self.bus.publish(StepEnded(session_id, step.message_id))
                if turn.message.state == "done":
                    outcome = "completed"
                    return outcome
                turn.tool_results = []
                tools, ask = await self._retrying(
                    functools.partial(self._session_tools, session_id)
                )
                client_calls: list[ToolCall] = []
                for call in tool_calls:
                    turn.tool_count += 1
                    if is_client_side(tools, call.name):
                        client_calls.append(call)
                    elif ask and needs_approval(tools, call.name):
                        turn.tool_results.append(
                            await self._run_approved(turn, call, watch)
                        )
                    else:
                        turn.tool_results.append(await self._run_tool(turn, call))
                if client_calls:
                    # The wait is durable: this runner lets the session go, and the
                    # results (posted to any process) kick a runner to go on.
                    turn.message = await self._checkpoint(
                        session_id,
                        turn_id,
                        functools.partial(
                            self._write_client_request,
                            turn,
                            [c.id for c in client_calls],
                        ),
                        turn=turn,
                    )
                    outcome = "waiting"
                    return outcome
                if last:
                    # The cap came with tool calls: their results are stored, and no
                    # further step runs.
                    await self._checkpoint(
                        session_id,
                        turn_id,
                        functools.partial(self._write_cap, turn),
                        turn=turn,
                    )
                    outcome = "completed"
                    return outcome
        except TurnCancelled:
            outcome = "cancelled"
            await self._end_with_error(
                session_id,
                turn_id,
                turn.message.id if turn.message else None,
                ("cancelled", "The turn was cancelled by the user"),
                EventSpec(
                    "turn.cancelled",
                    {
                        "turn_id": format_id("turn", turn_id),
                        "reason": "cancelled_by_user",
                        # Upstream's "usage before cancellation": the committed steps'.
                        **({"usage": turn.usage} if turn.usage else {}),
                    },
                    turn_id=turn_id,
                ),
            )
        except ModelError as exc:
            outcome = "failed"
            await self._end_with_error(
                session_id,
                turn_id,
                turn.message.id if turn.message else None,
                ("model_error", str(exc)),
                EventSpec(
                    "turn.failed",
                    {
                        "turn_id": format_id("turn", turn_id),
                        "error": str(exc),
                        "error_code": "model_error",
                    },
                    turn_id=turn_id,
                ),
            )
        except (asyncio.CancelledError, LeaseLost) as exc:
            # Shutting down: leave the turn for start-up recovery (or another node).
            # Or the turn is not this process's any more: write nothing.
            if isinstance(exc, LeaseLost):
                outcome = "taken over"
            raise
        except Exception as exc:
            outcome = "failed"
            log.exception("turn %s failed", turn_id)
            await self._end_with_error(
                session_id,
                turn_id,
                turn.message.id if turn.message else None,
                ("internal_error", "The turn failed unexpectedly"),
                EventSpec(
                    "turn.failed",
                    {
                        "turn_id": format_id("turn", turn_id),
                        "error": type(exc).__name__,
                        "error_code": "internal_error",
                    },
                    turn_id=turn_id,
                ),
            )
        finally:
            if self.watches.get(session_id) is watch:
                del self.watches[session_id]
            if turn.message is not None:
                self.live.pop(turn.message.id, None)
            log.info(
                "turn %s after %d step(s) in %.0f ms",
                outcome,
                turn.iteration,
                (time.monotonic() - turn.started) * 1000,
            )
        return outcome

    async def _resume(self, turn: TurnProgress) -> None:
        """A turn another runner left unfinished (it drained, or lost its lease) goes on
        in the agent message it opened: the steps it committed stay, and the step it was
        streaming is run again from that message's last revision (its live parts were
        never committed; the same part ids start again from the beginning)."""

        async def read() -> MessageRow | None:
            async with self.database.write() as db:
                rows = await db.streaming_messages(turn.session_id)
            return next((m for m in rows if m.turn_id == turn.turn_id), None)

        message = await self._retrying(read)
        if message is None:
            return
        turn.message = message
        steps = [p["step_id"] for p in message.content if "step_id" in p]
        turn.iteration = len(set(steps))
        turn.tool_count = sum(p["type"] == "tool_call" for p in message.content)
        # What the last committed step's tools returned (client results, or built-in
        # tools run before a hand-over), as the next step would have seen it.
        last_step = steps[-1] if steps else None
        turn.tool_results = [
            {
                "tool_call_id": p["tool_call_id"],
                "result": p.get("result"),
                "error": p.get("error"),
            }
            for p in message.content
            if p["type"] == "tool_result" and p.get("step_id") == last_step
        ]
        log.info("turn resumed after step %d", turn.iteration)

    async def _seen_input(self, turn: TurnProgress) -> int:
        """The newest user message the turn's last step saw, for a turn resumed
        without running another: what arrived while it waited for client tool results
        (after its `tool.call_requested`) it did not see."""
        async with self.database.statements() as conn:
            waited = await conn.scalar(
                select(func.max(models.Event.sequence)).where(
                    models.Event.session_id == turn.session_id,
                    models.Event.turn_id == turn.turn_id,
                    models.Event.type == "tool.call_requested",
                )
            )
            seen = select(func.max(models.Message.sequence)).where(
                models.Message.session_id == turn.session_id,
                models.Message.role == "user",
            )
            if waited is not None:
                seen = seen.where(models.Message.sequence < waited)
            return int(await conn.scalar(seen) or 0)

    async def _write_open(
        self, turn: TurnProgress, model: str, db: Write, session: LockedSession
    ) -> MessageRow | None:
        """The turn's agent message opens (`output.message.started`, naming the model
        its first step runs)."""
        opened = await checkpoint.open_agent_message(
            db,
            session,
            turn_id=turn.turn_id,
            model=model,
            iteration=turn.iteration,
        )
        return opened.message

    async def _write_step(
        self,
        turn: TurnProgress,
        step: LiveStep,
        tool_calls: list[ToolCall],
        last: bool,
        db: Write,
        session: LockedSession,
    ) -> MessageRow | None:
        """A finished step commits whole. A step without tool calls is the answer
        (closing the message and the turn), unless input arrived that it did not see:
        then the next step of the same message answers that too. At the cap there is
        no next step."""
        assert turn.message is not None
        message = copy.copy(turn.message)
        # A call that failed without running (its arguments were not JSON) gets its
        # result now, and the model a next step to see it.
        failed = step.failed_calls
        done = (
            not tool_calls
            and (not failed or last)
            and (last or session.last_input_sequence <= turn.consumed)
        )
        parts = [*step.parts]
        for call in failed:
            parts.append(
                {"type": "tool_result", "tool_call_id": call.id, "error": call.error}
            )
        await checkpoint.commit_step(
            db,
            session,
            message,
            step_id=f"step_{turn.iteration}",
            parts=parts,
            phase=step.phase,
            phase_source="provider",
            close=done,
            usage=step.usage or None,
            then=[
                EventSpec(
                    "tool.completed",
                    {
                        "tool_call_id": call.id,
                        "tool_name": call.name,
                        "status": "error",
                        "success": False,
                        "error": call.error,
                    },
                    turn_id=turn.turn_id,
                )
                for call in failed
            ],
        )
        await sessions_service.record_usage(db, session, step.usage)
        if step.usage:
            turn.step_usage[turn.iteration] = step.usage
        if done:
            await self._complete(db, session, turn, message)
        return message

    async def _write_cap(
        self, turn: TurnProgress, db: Write, session: LockedSession
    ) -> MessageRow | None:
        """The step cap was reached with tool calls: the message closes, the turn ends."""
        assert turn.message is not None
        message = copy.copy(turn.message)
        await checkpoint.close_message(db, session, message)
        await self._complete(db, session, turn, message)
        return message

    async def _complete(
        self,
        db: Write,
        session: LockedSession,
        turn: TurnProgress,
        message: MessageRow,
    ) -> None:
        """`turn.completed` and `session.idled`. Input the last step did not see (only
        possible at the step cap) is not dropped: a new turn starts for it in the same
        checkpoint."""
        unanswered = None
        if session.last_input_sequence > turn.consumed:
            unanswered = await db.first_input_after(session.id, turn.consumed)
        data = {
            "turn_id": format_id("turn", turn.turn_id),
            "iterations": turn.iteration,
            "status": "completed",
            "final_message_id": format_id("message", message.id),
            "duration_ms": int((time.monotonic() - turn.started) * 1000),
            "tool_call_count": turn.tool_count,
        }
        if turn.usage:
            data["usage"] = turn.usage
        await checkpoint.finish_turn(
            db,
            session,
            turn_id=turn.turn_id,
            outcome=EventSpec("turn.completed", data, turn_id=turn.turn_id),
            answer_next=unanswered,
        )

    async def _stream_step(
        self,
        progress: TurnProgress,
        step: LiveStep,
        turn: Turn,
        watch: asyncio.Event,
        driver: Driver,
    ) -> list[ToolCall]:
        """Stream one model step into the live projection; returns the tool calls to
        run. A cancel request stops it at once, however long the model takes to send
        its next chunk: the driver's stream is closed (and with it the provider's
        response) and TurnCancelled raised."""
        streaming = asyncio.create_task(self._consume(step, turn, driver))
        watching = asyncio.create_task(self._watch_step(progress, step, watch))
        try:
            await asyncio.wait(
                (streaming, watching), return_when=asyncio.FIRST_COMPLETED
            )
            if streaming.done():
                return streaming.result()
            # A cancel was requested (or reading whether one was failed: raised here,
            # as the step's own failure would be).
            watching.result()
            streaming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await streaming
            raise TurnCancelled
        finally:
            for task in (streaming, watching):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task

    async def _watch_step(
        self, turn: TurnProgress, step: LiveStep, watch: asyncio.Event
    ) -> None:
        """Return once a cancel of the session's turn was requested; each wake-up of
        the session is a moment to check. The same read tells whether an Action
        joined the streaming message: then the step goes on from its new revision."""
        while True:
            await watch.wait()
            watch.clear()
            cancelled, revision = await self._retrying(
                functools.partial(
                    self.reads.turn_watch, step.session_id, step.message_id
                )
            )
            if cancelled:
                return
            if revision is not None and revision > step.revision:
                await self._rebase(turn, step)

    async def _rebase(self, turn: TurnProgress, step: LiveStep) -> None:
        """An Action was committed to the message while this step streams: the step's
        live parts now extend the new revision and follow the Action's parts (their
        part ids stay; their sequences move on). Clients dropped the old projection
        with the new snapshot; they get the parts again, text so far included."""
        stored = await self._retrying(
            functools.partial(self._read_message, step.message_id)
        )
        if stored.revision <= step.revision:
            return
        turn.message = stored
        step.revision = stored.revision
        step.first_sequence = len(stored.content) + 1
        for offset, part in enumerate(step.parts):
            part["sequence"] = step.first_sequence + offset
        await self._republish(step)

    async def _consume(
        self, step: LiveStep, turn: Turn, driver: Driver
    ) -> list[ToolCall]:
        tool_calls: list[ToolCall] = []
        text_part: dict[str, Any] | None = None
        reasoning_part: dict[str, Any] | None = None
        tool_parts: dict[str, dict[str, Any]] = {}
        # Closed at once however this ends (a cancel cancels this task): the driver's
        # `finally` closes its provider stream.
        async with contextlib.aclosing(driver.step(turn)) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    if text_part is None:
                        text_part = step.new_part({"type": "text", "text": ""})
                        await self._publish(
                            step.session_id, step.part_started(text_part)
                        )
                    await self._delta(
                        step, text_part, event.text, "output.message.delta"
                    )
                elif isinstance(event, ReasoningDelta):
                    if reasoning_part is None:
                        reasoning_part = step.new_part(
                            {
                                "type": "reasoning",
                                "provider": driver.name,
                                "text": "",
                            }
                        )
                        await self._publish(
                            step.session_id, step.part_started(reasoning_part)
                        )
                    await self._delta(
                        step, reasoning_part, event.text, "reason.thinking.delta"
                    )
                elif isinstance(event, ToolCallStarted):
                    # The part exists from the call's first chunk; its input streams.
                    part = tool_parts[event.id] = step.new_part(
                        {
                            "type": "tool_call",
                            "id": event.id,
                            "name": event.name,
                            "arguments": {},
                            "status": lifecycle.INPUT_STREAMING,
                            "input_text": "",
                        }
                    )
                    await self._publish(step.session_id, step.part_started(part))
                    text_part = None
                elif isinstance(event, ToolInputDelta):
                    part = tool_parts[event.id]
                    await self._delta(
                        step,
                        part,
                        event.text,
                        TOOL_INPUT_DELTA,
                        key="input_text",
                        tool_call_id=event.id,
                    )
                elif isinstance(event, ToolCall):
                    complete: dict[str, Any] = {
                        "type": "tool_call",
                        "id": event.id,
                        "name": event.name,
                        "arguments": event.arguments,
                        "status": lifecycle.READY
                        if event.error is None
                        else lifecycle.FAILED,
                    }
                    if event.error is not None:
                        complete["error"] = event.error
                    streamed = tool_parts.get(event.id)
                    if streamed is None:
                        part = step.new_part(complete)
                    else:
                        part = streamed
                        part.pop("input_text", None)
                        part.update(complete)
                    await self._publish(step.session_id, step.part_started(part))
                    if event.error is None:
                        tool_calls.append(event)
                    else:
                        step.failed_calls.append(event)
                    text_part = None
                elif isinstance(event, Retrying):
                    await self._publish(step.session_id, self._warning(step, event))
                    if event.will_retry and step.parts:
                        # The step starts over; the parts so far are void. Processes
                        # drop their projection of them (late joiners get only the
                        # new ones); clients holding them get the same part ids
                        # again from empty.
                        step.restart()
                        await self._owned(step.session_id)
                        await asyncio.shield(
                            self.bus.publish(
                                StepEnded(step.session_id, step.message_id)
                            )
                        )
                        tool_calls = []
                        text_part = reasoning_part = None
                        tool_parts = {}
                elif isinstance(event, Annotations) and text_part is not None:
                    text_part["annotations"] = event.items
                elif isinstance(event, StepFinish):
                    step.phase = event.phase
                    step.usage = dict(event.usage)
        # The committed form of a reasoning part keeps upstream's shape.
        for part in step.parts:
            if part["type"] == "reasoning":
                part["text"] = {"kind": "plain", "text": part["text"]}
        return tool_calls

    def _warning(self, step: LiveStep, event: Retrying) -> ModelWarning:
        """The live notice of a retry (the driver logged it)."""
        return ModelWarning(
            step.session_id,
            step.message_id,
            format_id("turn", step.turn_id),
            format_id("event", uuid7()),
            wire.event_ts(utcnow()),
            {
                "attempt": event.attempt,
                "max_attempts": event.max_attempts,
                "code": event.code,
                "message": event.message,
                "will_retry": event.will_retry,
                "retry_in_ms": event.delay_ms,
            },
        )

    async def _delta(
        self,
        step: LiveStep,
        part: dict[str, Any],
        text: str,
        event_type: str,
        *,
        key: str = "text",
        tool_call_id: str | None = None,
    ) -> None:
        part_id = part["part_id"]
        offset = step.units.get(part_id, 0)
        step.units[part_id] = offset + wire.utf16_len(text)
        part[key] += text
        await self._publish(
            step.session_id,
            step.delta(part_id, offset, text, event_type, tool_call_id),
        )

    async def _run_approved(
        self, turn: TurnProgress, call: ToolCall, watch: asyncio.Event
    ) -> dict[str, Any]:
        """A tool that requires approval: it moves to `awaiting_approval` with a pending
        `interaction` part (one checkpoint), and the runner waits, holding the turn,
        until `POST .../interactions/{id}` decides (it commits the interaction and the
        tool's move to `running` or `failed` together) or the turn is cancelled. The
        wait is not durable: recovery cancels the interaction (`runtime_interrupted`)."""
        interaction_id = format_id("interaction", uuid7())
        request = {
            "tool_call": {"id": call.id, "name": call.name, "arguments": call.arguments}
        }
        interaction = {
            "interaction_id": interaction_id,
            "interaction_type": "approval",
            "kind": "approval",
            "status": "pending",
            "prompt": f"Run {call.name}?",
            "request": request,
        }
        turn.message = await self._checkpoint(
            turn.session_id,
            turn.turn_id,
            functools.partial(
                self._write_tool,
                turn,
                call.id,
                lifecycle.AWAITING_APPROVAL,
                interaction=interaction,
            ),
            turn=turn,
        )
        assert turn.message is not None
        message_id = turn.message.id
        while True:
            watch.clear()
            cancelled, _ = await self._retrying(
                functools.partial(self.reads.turn_watch, turn.session_id, message_id)
            )
            if cancelled:
                raise TurnCancelled
            status = await self._retrying(
                functools.partial(self._tool_status, message_id, call.id)
            )
            if status != lifecycle.AWAITING_APPROVAL:
                break
            # Every checkpoint of the session wakes `watch` (the decision's too, on
            # any process); the timeout is a fallback.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watch.wait(), 1.0)
        # The decision wrote the message: go on from what it stored.
        stored = await self._retrying(functools.partial(self._read_message, message_id))
        part = next(
            p for p in stored.content if p["type"] == "tool_call" and p["id"] == call.id
        )
        turn.message = stored
        if part["status"] == lifecycle.RUNNING:
            return await self._run_tool(turn, call, started=True)
        denied = next(
            (
                p
                for p in stored.content
                if p["type"] == "tool_result" and p.get("tool_call_id") == call.id
            ),
            {},
        )
        return {"tool_call_id": call.id, "result": None, "error": denied.get("error")}

    async def _tool_status(
        self, message_id: uuid.UUID, tool_call_id: str
    ) -> str | None:
        async with self.database.statements() as conn:
            content = await conn.scalar(
                select(models.Message.content).where(models.Message.id == message_id)
            )
        for part in content or ():
            if part.get("type") == "tool_call" and part.get("id") == tool_call_id:
                return str(part.get("status"))
        return None

    async def _read_message(self, message_id: uuid.UUID) -> MessageRow:
        async with self.database.write() as db:
            return await checkpoint.get_message_for_update(db, message_id)

    async def _run_tool(
        self, turn: TurnProgress, call: ToolCall, *, started: bool = False
    ) -> dict[str, Any]:
        """Run one tool call between its two checkpoints (`running`, unless an approval
        `started` it, then its outcome); returns the result for the model."""
        if not started:
            turn.message = await self._checkpoint(
                turn.session_id,
                turn.turn_id,
                functools.partial(self._write_tool, turn, call.id, "running"),
                turn=turn,
            )
        began = time.monotonic()
        try:
            result, error, status = (
                await run_tool(call.name, call.arguments),
                None,
                "completed",
            )
        except ModelError as exc:
            result, error, status = None, str(exc), "failed"
        turn.message = await self._checkpoint(
            turn.session_id,
            turn.turn_id,
            functools.partial(
                self._write_tool,
                turn,
                call.id,
                status,
                result=result,
                error=error,
                duration_ms=int((time.monotonic() - began) * 1000),
            ),
            turn=turn,
        )
        return {"tool_call_id": call.id, "result": result, "error": error}

    async def _write_tool(
        self,
        turn: TurnProgress,
        tool_call_id: str,
        status: str,
        db: Write,
        session: LockedSession,
        **outcome: Any,
    ) -> MessageRow | None:
        assert turn.message is not None
        message = copy.copy(turn.message)
        await checkpoint.tool_transition(
            db, session, message, tool_call_id=tool_call_id, status=status, **outcome
        )
        return message

    async def _write_client_request(
        self,
        turn: TurnProgress,
        tool_call_ids: list[str],
        db: Write,
        session: LockedSession,
    ) -> MessageRow | None:
        """Client-side tools: their parts move to `awaiting_client`, the calls are
        `tool.call_requested` events and the session waits for tool results, in one
        checkpoint."""
        assert turn.message is not None
        message = copy.copy(turn.message)
        await checkpoint.request_client_tools(
            db, session, message, tool_call_ids=tool_call_ids
        )
        return message

    async def _end_with_error(
        self,
        session_id: uuid.UUID,
        turn_id: uuid.UUID,
        message_id: uuid.UUID | None,
        error: tuple[str, str],
        outcome: EventSpec,
    ) -> None:
        """Close the message with an error part and end the turn, in one checkpoint.
        What the unfinished step streamed is kept ahead of the error part, as it stood
        (a cancel or a model failure loses nothing that was shown; a crash still does:
        nothing in memory survives it). The message is read again under the lock:
        what is stored is what the step and the error part follow."""
        step = self.live.get(message_id) if message_id is not None else None

        async def end(db: Write, session: LockedSession) -> MessageRow | None:
            message = None
            if message_id is not None:
                message = await checkpoint.get_message_for_update(db, message_id)
                if message.state == "streaming":
                    # Only if the step is not stored yet (an attempt whose COMMIT
                    # went unanswered may have committed it).
                    stored = {p["part_id"] for p in message.content}
                    partial = (
                        step.settled()
                        if step is not None
                        and not stored.intersection(p["part_id"] for p in step.parts)
                        else []
                    )
                    step_number = 1 + len(
                        {p["step_id"] for p in message.content if "step_id" in p}
                    )
                    await checkpoint.close_message(
                        db,
                        session,
                        message,
                        error=error,
                        partial=partial,
                        step_id=f"step_{step_number}",
                    )
            await checkpoint.finish_turn(db, session, turn_id=turn_id, outcome=outcome)
            return None

        with contextlib.suppress(TurnCancelled):
            await self._checkpoint(session_id, turn_id, end, ending=True)
        if message_id is not None:
            await self.bus.publish(StepEnded(session_id, message_id))

    # ---- recovery ------------------------------------------------------------------

    async def recover(self, grace_seconds: float) -> int:
        """Close turns whose runner is gone: a streaming message gets an error part and
        `state: done`, the turn fails, the session idles. Only sessions whose lease is
        free and whose runner has neither written nor renewed its lease for
        `grace_seconds` are touched; taking one over claims it (the runner epoch), so a
        runner that was merely cut off can never write to it again."""
        cutoff = utcnow() - timedelta(seconds=grace_seconds)
        async with self.database.read() as db:
            candidates = list(
                (
                    await db.scalars(
                        select(models.Session.id).where(
                            models.Session.active_turn_id.is_not(None),
                            # A turn waiting for client tool results has no runner
                            # to lose: it waits durably (a cancel kicks a runner).
                            or_(
                                models.Session.status != WAITING,
                                models.Session.cancel_requested_at.is_not(None),
                            ),
                            models.Session.last_activity_at <= cutoff,
                            or_(
                                models.Session.runner_renewed_at.is_(None),
                                models.Session.runner_renewed_at <= cutoff,
                            ),
                        )
                    )
                ).all()
            )
        recovered = 0
        for session_id in candidates:
            if session_id in self.tasks or not await self.leases.try_acquire(
                session_id
            ):
                continue
            try:
                closed = await self._recover_session(session_id)
            finally:
                await self.leases.release(session_id)
            for message_id in closed:
                await self.bus.publish(StepEnded(session_id, message_id))
            recovered += 1
        return recovered

    async def _recover_session(self, session_id: uuid.UUID) -> list[uuid.UUID]:
        async with self.database.write() as db:
            session = await sessions_service.lock_session(db, session_id)
            if session is None or session.active_turn_id is None:
                return []
            if session.status == WAITING and not session.cancel_requested:
                return []
            session.runner_epoch += 1
            turn_id = session.active_turn_id
            messages = await checkpoint.streaming_messages(db, session_id)
            for message in messages:
                await checkpoint.close_message(
                    db,
                    session,
                    message,
                    error=(
                        "interrupted",
                        "The server running this turn stopped before the message was complete",
                    ),
                )
            outcome = EventSpec(
                "turn.failed",
                {
                    "turn_id": format_id("turn", turn_id),
                    "error": "The turn was interrupted",
                    "error_code": "interrupted",
                },
                turn_id=turn_id,
            )
            await checkpoint.finish_turn(db, session, turn_id=turn_id, outcome=outcome)
            log.warning(
                "recovered interrupted turn %s of session %s", turn_id, session_id
            )
            return [m.id for m in messages]

    async def _sweep(self) -> None:
        # Start-up recovered what had gone unrenewed for two renewal periods; a turn of
        # a process that died just before this one started is seen one pass later.
        startup = 2 * self.settings.runner_renew_seconds
        await asyncio.sleep(startup)
        with contextlib.suppress(Exception):
            await self.recover(grace_seconds=startup)
        grace = self.settings.runner_sweep_seconds
        while True:
            await asyncio.sleep(grace)
            try:
                # Just after this node's lease connection came back (a database
                # restart), every other runner's renewals look stale too: give them a
                # whole grace period to regain their leases first.
                if not await self.leases.settled(grace):
                    continue
                await self.recover(grace_seconds=grace)
            except Exception as exc:
                log.warning("runner sweep failed: %s", exc)
