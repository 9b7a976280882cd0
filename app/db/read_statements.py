"""The reads' statements (app/db/reads.py), written once for both drivers: each takes
the driver's placeholders (`p`) and, where a branch of a UNION needs them, its typed
NULLs (`null`)."""

from collections.abc import Sequence

# The events that end a turn.
TURN_ENDS = ("turn.completed", "turn.failed", "turn.cancelled")


def page_sql(include_internal: bool, p: Sequence[str], null: dict[str, str]) -> str:
    """The session head and the page in one statement: the first branch yields the
    session row (sequence NULL), the second the newest `limit` messages up to `upto`."""
    visibility = "" if include_internal else " AND visibility = 'visible'"
    return (
        "SELECT organization_id, last_sequence, visible_message_count,"
        f" internal_message_count, {null['int']} AS sequence, {null['text']} AS snapshot"
        f" FROM sessions WHERE id = {p[0]}"
        " UNION ALL SELECT * FROM ("
        f"SELECT {null['uuid']}, {null['int']}, {null['int']}, {null['int']},"
        " sequence, snapshot FROM messages"
        f" WHERE session_id = {p[0]}{visibility} AND sequence <= {p[1]}"
        f" ORDER BY sequence DESC LIMIT {p[2]}) AS page"
    )


def head_sql(p: Sequence[str]) -> str:
    return (
        "SELECT organization_id, last_sequence, visible_message_count,"
        f" internal_message_count FROM sessions WHERE id = {p[0]}"
    )


def message_sql(p: Sequence[str]) -> str:
    return (
        "SELECT s.organization_id, s.last_sequence, s.visible_message_count,"
        " s.internal_message_count, m.snapshot FROM sessions s"
        f" LEFT JOIN messages m ON m.session_id = s.id AND m.id = {p[1]}"
        f" WHERE s.id = {p[0]}"
    )


def turn_watch_sql(p: Sequence[str]) -> str:
    return (
        "SELECT cancel_requested_at IS NOT NULL,"
        f" (SELECT revision FROM messages WHERE id = {p[1]})"
        f" FROM sessions WHERE id = {p[0]}"
    )


def active_turn_sql(p: Sequence[str]) -> str:
    return (
        "SELECT active_turn_id, attributes, status, cancel_requested_at IS NOT NULL,"
        " EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id"
        " AND m.turn_id = s.active_turn_id AND m.state = 'streaming')"
        f" FROM sessions s WHERE id = {p[0]}"
    )


def session_part_sql(p: Sequence[str]) -> str:
    return (
        "SELECT cancel_requested_at IS NOT NULL, attributes FROM sessions"
        f" WHERE id = {p[0]}"
    )


HISTORY_COLUMNS = "snapshot, role, sequence, visibility, content, changed_sequence"


def newest_messages_sql(p: Sequence[str]) -> str:
    return (
        f"SELECT {HISTORY_COLUMNS} FROM messages WHERE session_id = {p[0]}"
        f" ORDER BY sequence DESC LIMIT {p[1]}"
    )


def changed_messages_sql(p: Sequence[str]) -> str:
    """What changed since a window was read, in the order it changed (the range of
    the (session_id, changed_sequence) index)."""
    return (
        f"SELECT {HISTORY_COLUMNS} FROM messages WHERE session_id = {p[0]}"
        f" AND changed_sequence > {p[1]} ORDER BY changed_sequence LIMIT {p[2]}"
    )


def checkpoints_sql(p: Sequence[str], null: dict[str, str]) -> str:
    """What committed in (after, upto]: the events (kind 0) and the messages changed
    there (kind 1), in one statement and one snapshot."""
    return (
        f"SELECT 0, sequence, id, type, body, {null['int']}, {null['time']}"
        f" FROM events WHERE session_id = {p[0]}"
        f" AND sequence > {p[1]} AND sequence <= {p[2]}"
        " UNION ALL SELECT 1, changed_sequence, id, visibility, snapshot, revision,"
        f" updated_at FROM messages WHERE session_id = {p[0]}"
        f" AND changed_sequence > {p[1]} AND changed_sequence <= {p[2]}"
    )


def turn_outcome_sql(p: Sequence[str], null: dict[str, str]) -> str:
    """A turn's outcome event (kind 0), the session's status while it is the active
    turn (kind 1), and its messages (kind 2) that a waiting client is answered with
    (the visible agent messages) or that may ask for an approval (streaming messages
    with an interaction part), in one statement and one snapshot."""
    ends = ", ".join(f"'{end}'" for end in TURN_ENDS)
    listed = "role = 'agent' AND visibility = 'visible'"
    asking = "state = 'streaming' AND snapshot LIKE '%\"type\":\"interaction\"%'"
    return (
        f"SELECT 0, {null['int']}, 0, 0, body FROM events"
        f" WHERE session_id = {p[0]} AND turn_id = {p[1]} AND type IN ({ends})"
        f" UNION ALL SELECT 1, {null['int']}, 0, 0, status FROM sessions"
        f" WHERE id = {p[0]} AND active_turn_id = {p[1]}"
        " UNION ALL SELECT 2, sequence,"
        f" CASE WHEN {listed} THEN 1 ELSE 0 END,"
        f" CASE WHEN {asking} THEN 1 ELSE 0 END, snapshot FROM messages"
        f" WHERE session_id = {p[0]} AND turn_id = {p[1]}"
        f" AND (({listed}) OR ({asking}))"
    )


def rows_after_sql(table: str, column: str, p: Sequence[str]) -> str:
    """A session's rows of `table` in sequence order, in (after, upto], `limit` of them:
    one batch of an export."""
    return (
        f"SELECT sequence, {column} FROM {table} WHERE session_id = {p[0]}"
        f" AND sequence > {p[1]} AND sequence <= {p[2]} ORDER BY sequence LIMIT {p[3]}"
    )
