"""The database's traced variants, used only while tracing is on
(app/telemetry/traces.py): write units of work as `checkpoint` spans and the delivery of
a commit to the live side as a `bus.deliver` span."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from app.db.outbox import Outbox
from app.db.session import CommitHooks, Database
from app.db.writes import Write
from app.telemetry import traces


def database_class() -> type[Database]:
    """`Database` whose write units of work are `checkpoint` spans."""

    class TracedDatabase(Database):
        @asynccontextmanager
        async def write(self, *, optimistic: bool = False) -> AsyncIterator[Write]:
            assert traces.tracer is not None
            with traces.tracer.start_as_current_span(
                "checkpoint",
                attributes={
                    "db.system.name": self.backend.value,
                    "evermirror.optimistic": optimistic,
                },
            ):
                async with super().write(optimistic=optimistic) as db:
                    yield db

    return TracedDatabase


class TracedHooks:
    """A database's commit hooks (the bus) whose delivery of a commit is a span."""

    def __init__(self, inner: CommitHooks) -> None:
        self.inner = inner

    async def before_commit(self, db: Write) -> None:
        await self.inner.before_commit(db)

    def after_commit(self, outbox: Outbox) -> None:
        assert traces.tracer is not None
        with traces.tracer.start_as_current_span(
            "bus.deliver",
            attributes={
                "evermirror.bus.wakeups": len(outbox.wakeups),
                "evermirror.bus.kicks": len(outbox.kicks),
            },
        ):
            self.inner.after_commit(outbox)

    def commit_unknown(self) -> None:
        self.inner.commit_unknown()


def hooks(inner: CommitHooks) -> CommitHooks:
    """The commit hooks to install: `inner`, traced while tracing is on."""
    return inner if traces.tracer is None else TracedHooks(inner)
