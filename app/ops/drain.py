"""The graceful drain, run on SIGTERM before uvicorn closes any connection
(`DrainingServer` in app/server.py):

1. New turns and new streams are refused (`503` problem+json `draining`, with
   `Retry-After`), and `/ready` answers 503 so load balancers move away; `/health`
   stays 200 (the process is alive). A message that steers a running turn is still
   accepted: it is durable, and the turn, here or wherever it is taken over, reads it.
2. Every open stream is told `disconnecting` with the short retry hint (the fan-out's
   connection-cycle machinery, ended now), so its client reconnects, with its cursor, to
   another process at once.
3. Running turns may finish for up to DRAIN_SECONDS. The rest are then stopped as
   shutting down stops them (left as last committed, leases released) and, on
   PostgreSQL, announced on the bus so another process's runner takes each over at once.

Then uvicorn's own shutdown runs: it waits (timeout_graceful_shutdown) for the
connections left, then the lifespan closes everything.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.api.state import AppState

log = logging.getLogger("app.ops.drain")

# How often the drain looks at its turns, and tells streams opened meanwhile (one that
# was past the draining check when the drain began) to go.
POLL_SECONDS = 0.1

# The application of this process, registered by its lifespan: with `--workers` each
# worker is a process of its own, and drains itself on its own SIGTERM.
_states: list[AppState] = []


def register(state: AppState) -> None:
    _states.append(state)


def unregister(state: AppState) -> None:
    if state in _states:
        _states.remove(state)


@dataclass(frozen=True, slots=True)
class DrainReport:
    finished: int
    interrupted: int
    streams: int
    seconds: float


async def drain(
    state: AppState, seconds: float, stop_early: Callable[[], bool] = lambda: False
) -> DrainReport:
    """Drain this process's application for up to `seconds` (`stop_early`: a second
    signal asked uvicorn to exit at once)."""
    started = time.monotonic()
    state.draining = True
    state.admission.draining = True
    runner = state.runner
    runner.draining = True
    running = set(runner.tasks)
    told = state.fanout.cycle_all()
    log.info(
        "draining: %d turn(s) running, %d stream(s) told to reconnect elsewhere; "
        "turns get up to %g s to finish",
        len(running),
        told,
        seconds,
    )
    deadline = started + seconds
    while runner.tasks and time.monotonic() < deadline and not stop_early():
        await asyncio.sleep(POLL_SECONDS)
        told += state.fanout.cycle_all()
    interrupted = await runner.interrupt()
    told += state.fanout.cycle_all()
    await runner.hand_over({*interrupted, *runner.handoff})
    report = DrainReport(
        finished=len(running - set(interrupted)),
        interrupted=len(interrupted),
        streams=told,
        seconds=time.monotonic() - started,
    )
    log.info(
        "drained in %.1f s: %d turn(s) finished, %d interrupted%s, %d stream(s) told "
        "to reconnect",
        report.seconds,
        report.finished,
        report.interrupted,
        " (handed over)" if interrupted and runner.backend.shared else "",
        report.streams,
    )
    return report


async def drain_all(stop_early: Callable[[], bool] = lambda: False) -> None:
    """Drain every application of this process (there is one), each for its own
    DRAIN_SECONDS."""
    await asyncio.gather(
        *(drain(s, s.settings.drain_seconds, stop_early) for s in tuple(_states))
    )
