"""Readiness (`GET /ready`): whether this process should be sent traffic. Liveness is
`/health`, which answers as long as the process serves at all.

Ready means: the database answers, its schema is at the head of the migration chain
this package carries (a process of a newer release must not serve an old schema, nor
an older one a newer), and the bus listens (PostgreSQL: the `LISTEN` connection is up,
without which this process would miss other processes' commits; SQLite's in-process bus
always does). Each check is bounded, so a hung database makes the probe fail rather
than hang.
"""

import asyncio
import logging
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError

from app.api.state import AppState
from app.db.migrate import applied_revisions, head_revisions

log = logging.getLogger("app.ops.ready")

# Well inside the probe timeouts orchestrators use (Kubernetes: 1 s by default).
CHECK_TIMEOUT_SECONDS = 0.8
OK = "ok"


@dataclass(frozen=True, slots=True)
class Readiness:
    # Each check's name and "ok", or what is wrong.
    checks: dict[str, str]

    @property
    def ready(self) -> bool:
        return all(value == OK for value in self.checks.values())

    @property
    def detail(self) -> str:
        return "; ".join(
            f"{name}: {value}" for name, value in self.checks.items() if value != OK
        )


async def _schema(state: AppState) -> tuple[str, str]:
    """(database, migrations) checks."""
    async with state.database.statements() as conn:
        try:
            await conn.exec_driver_sql("SELECT 1")
        except DBAPIError as exc:
            return f"unreachable: {type(exc.orig).__name__}", "unknown"
        try:
            applied = await applied_revisions(conn)
        except DBAPIError:
            return OK, "not migrated (no alembic_version table)"
    heads = head_revisions()
    if applied == heads:
        return OK, OK
    return OK, (
        f"at {', '.join(sorted(applied)) or 'no revision'}, "
        f"this release needs {', '.join(sorted(heads))}"
    )


# Checks past their bound, finishing their cleanup (see `readiness`).
_abandoned: set[asyncio.Task[tuple[str, str]]] = set()


def _forget(task: asyncio.Task[tuple[str, str]]) -> None:
    _abandoned.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: its outcome no longer matters


async def readiness(state: AppState) -> Readiness:
    # The check runs as a task of its own, so the probe answers at the bound: a check
    # cancelled in a hung query still has to get its connection back (the query
    # cancelled on the server, the connection reset), which took 6.9 s more on a
    # loaded machine; that goes on after the answer.
    check = asyncio.ensure_future(_schema(state))
    try:
        done, _ = await asyncio.wait((check,), timeout=CHECK_TIMEOUT_SECONDS)
        if not done:
            raise TimeoutError
        database, migrations = check.result()
    except TimeoutError:
        check.cancel()
        _abandoned.add(check)
        check.add_done_callback(_forget)
        database = f"no answer within {CHECK_TIMEOUT_SECONDS:g} s"
        migrations = "unknown"
    except asyncio.CancelledError:
        check.cancel()
        raise
    except Exception as exc:
        # A connection that could not be opened at all (refused, DNS, auth): the probe
        # answers 503, never a 500.
        database, migrations = f"unreachable: {type(exc).__name__}", "unknown"
    bus = OK if state.bus.healthy else "not listening (reconnecting)"
    result = Readiness({"database": database, "migrations": migrations, "bus": bus})
    if not result.ready:
        log.warning("not ready: %s", result.detail)
    return result
