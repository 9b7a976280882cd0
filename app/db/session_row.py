"""The session row as the checkpoint path reads and writes it, spelled once: the columns
of `LockedSession`, from which the lock's select list, the update's assignments, their
values, and the group commit's assumed-and-written columns are all generated.

A new column of the checkpoint path is one `Column` here (and one field of
`LockedSession`, in the same place)."""

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from app.db.rows import LockedSession


@dataclass(frozen=True, slots=True)
class Column:
    # The field of LockedSession, and the statements' parameter name.
    name: str
    # Its PostgreSQL type, for the group commit's arrays.
    pg_type: str
    # How it is read from the row (`{t}` is the table's alias and dot, if any).
    read: str = ""
    # How it is written from `{value}`; None: never written by a checkpoint.
    write: str | None = "{value}"
    # The column it is written to, when that is not `name`.
    target: str = ""
    # Compared with IS NOT DISTINCT FROM (it may be NULL).
    nullable: bool = False

    def reader(self, table: str = "") -> str:
        return (self.read or "{t}" + self.name).format(t=table)

    def writer(self, value: str, table: str = "") -> str:
        assert self.write is not None
        return self.write.format(value=value, t=table)


SESSION_ROW = (
    Column("organization_id", "uuid", write=None),
    Column("status", "text"),
    Column("last_sequence", "integer"),
    Column("last_input_sequence", "integer"),
    Column("active_turn_id", "uuid", nullable=True),
    # A cancel request is a timestamp; a checkpoint can only clear it.
    Column(
        "cancel_requested",
        "boolean",
        read="({t}cancel_requested_at IS NOT NULL)",
        write="CASE WHEN {value} THEN {t}cancel_requested_at END",
        target="cancel_requested_at",
    ),
    Column("visible_message_count", "integer"),
    Column("internal_message_count", "integer"),
    Column("runner_epoch", "integer"),
)
assert (
    tuple(c.name for c in SESSION_ROW)
    == tuple(f.name for f in fields(LockedSession))[1:]
), "SESSION_ROW follows LockedSession's fields"

# The columns a checkpoint writes: those a group-committed one also assumes (as
# `was_<name>`) still hold what it read. A column no checkpoint writes (the
# organization) cannot have changed under it; comparing it too let the planner reach
# the row through the organization's index, walking all its sessions per checkpoint.
WRITTEN_COLUMNS = tuple(c for c in SESSION_ROW if c.write is not None)
WRITTEN = tuple(c.name for c in WRITTEN_COLUMNS)

# Written with every checkpoint, from the unit's clock and what it did.
STAMPS = (
    "started_at = COALESCE({t}started_at, {started_at})",
    "finished_at = COALESCE({finished_at}, {t}finished_at)",
    "last_activity_at = {now}",
    "updated_at = {now}",
)

LOCK_SESSION = (
    "SELECT "
    + ", ".join(c.reader() for c in SESSION_ROW)
    + " FROM sessions WHERE id = :session_id"
)


def assignments(value: str, table: str = "", indent: int = 4) -> str:
    """The SET list of a checkpoint: each written column from `value` (a format with
    `{name}`), then the stamps."""
    written = [
        f"{c.target or c.name} = {c.writer(value.format(name=c.name), table)}"
        for c in WRITTEN_COLUMNS
    ]
    stamps = [
        stamp.format(
            t=table,
            started_at=value.format(name="started_at"),
            finished_at=value.format(name="finished_at"),
            now=value.format(name="now"),
        )
        for stamp in STAMPS
    ]
    return (",\n" + " " * indent).join([*written, *stamps])


UPDATE_SESSION = (
    f"UPDATE sessions SET\n    {assignments(':{name}')}\nWHERE id = :session_id"
)


def unchanged(row: str, assumed: str) -> str:
    """The conditions under which the row `row` is still as `assumed` (a relation with
    a `was_<name>` column for each written column) says."""
    return "\n        AND ".join(
        f"{c.reader(row + '.')} "
        f"{'IS NOT DISTINCT FROM' if c.nullable else '='} {assumed}.was_{c.name}"
        for c in WRITTEN_COLUMNS
    )


def session_values(
    session: LockedSession, now: datetime, *, started: bool, finished: bool
) -> dict[str, Any]:
    """The parameters of UPDATE_SESSION for the row as `session` holds it."""
    values: dict[str, Any] = {name: getattr(session, name) for name in WRITTEN}
    values["session_id"] = session.id
    values["started_at"] = now if started else None
    values["finished_at"] = now if finished else None
    values["now"] = now
    return values
