"""Turns whose runner is gone: closed at start-up and, on PostgreSQL, by a sweeper
that looks for them on every node. Closing one claims the session (the runner epoch),
so a runner that was merely cut off can never write to it again."""

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Container
from datetime import timedelta

from app.db.types import utcnow
from app.ids import format_id
from app.journal import checkpoint
from app.journal.events import EventSpec
from app.journal.sessions import lock_session
from app.live.items import StepEnded
from app.runner import queries
from app.runner.runtime import Runtime

log = logging.getLogger("app.runner")


async def recover(
    rt: Runtime, running: Container[uuid.UUID], grace_seconds: float
) -> int:
    """Close turns whose runner is gone: a streaming message gets an error part and
    `state: done`, the turn fails, the session idles. Only sessions whose lease is
    free and whose runner has neither written nor renewed its lease for
    `grace_seconds` are touched (and none in `running`, this process's own)."""
    cutoff = utcnow() - timedelta(seconds=grace_seconds)
    leases = rt.fence.leases
    recovered = 0
    for session_id in await queries.orphaned_turns(rt.database, cutoff):
        if session_id in running or not await leases.try_acquire(session_id):
            continue
        try:
            closed = await _recover_session(rt, session_id)
        finally:
            await leases.release(session_id)
        for message_id in closed:
            rt.bus.publish(StepEnded(session_id, message_id))
        recovered += 1
    return recovered


async def _recover_session(rt: Runtime, session_id: uuid.UUID) -> list[uuid.UUID]:
    async with rt.database.write() as db:
        session = await lock_session(db, session_id)
        if session is None or session.active_turn_id is None:
            return []
        if session.status == queries.WAITING and not session.cancel_requested:
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
        log.warning("recovered interrupted turn %s of session %s", turn_id, session_id)
        return [m.id for m in messages]


async def sweep(rt: Runtime, running: Container[uuid.UUID]) -> None:
    """The sweeper of a node on PostgreSQL: recovers, once a grace period has passed,
    turns whose runner on any node stopped renewing its lease."""
    # Start-up recovered what had gone unrenewed for two renewal periods; a turn of a
    # process that died just before this one started is seen one pass later.
    startup = 2 * rt.settings.runner_renew_seconds
    await asyncio.sleep(startup)
    with contextlib.suppress(Exception):
        await recover(rt, running, grace_seconds=startup)
    grace = rt.settings.runner_sweep_seconds
    while True:
        await asyncio.sleep(grace)
        try:
            # Just after this node's lease connection came back (a database restart),
            # every other runner's renewals look stale too: give them a whole grace
            # period to regain their leases first.
            if not await rt.fence.leases.settled(grace):
                continue
            await recover(rt, running, grace_seconds=grace)
        except Exception as exc:
            log.warning("runner sweep failed: %s", exc)
