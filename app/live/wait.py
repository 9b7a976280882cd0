"""`POST .../messages?wait=true`: answer when the turn the message started or joined
ends, instead of at once.

The waiter holds no database connection while it waits. It subscribes to the session's
local fan-out (which hears every checkpoint, from any process, through the bus) and
reads the turn's outcome once after subscribing and again whenever a turn event, a
resync or a lost subscription says it may have changed. A wait the server ends early
(the process drains) answers as a timeout: the turn goes on, elsewhere, and the client
reads its result from the message list. A wait opened with a key ends when the key is
revoked (401), and one whose client has gone ends at once (its stream slot with it)."""

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from app import wire
from app.db.read_statements import TURN_ENDS
from app.db.reads import Reads
from app.errors import Unauthorized
from app.live.fanout import Fanout
from app.live.outputs import CYCLE, GONE, RESYNC, REVOKED, EventOut
from app.live.subscription import Subscription

# Checkpoints after which the turn may be waiting for its client: tool calls it runs
# on the client, an approval asked for (the message's checkpoint carries the part).
MAY_WAIT = ("tool.call_requested", "output.message.completed")


@dataclass(frozen=True, slots=True)
class Ended:
    """How a turn ended: its outcome event's type and data, and the agent messages it
    produced (stored snapshots, oldest first)."""

    type: str
    data: dict[str, Any]
    messages: list[bytes]


@dataclass(frozen=True, slots=True)
class Waiting:
    """The turn cannot go on without its client: `waiting_for` is `tool_results`
    (client-side tool calls to answer) or `approval` (a tool call to approve or deny);
    the turn's agent messages so far hold the calls and interactions."""

    waiting_for: str
    messages: list[bytes]


async def turn_ended(
    reads: Reads,
    session_id: uuid.UUID,
    turn_id: uuid.UUID,
    *,
    waiting: bool = False,
) -> Ended | Waiting | None:
    """The turn's outcome, or None while it runs; with `waiting`, a turn that waits
    for its client is `Waiting`: the session's status says tool results, or a pending
    interaction in one of the turn's streaming messages asks for an approval (looked
    for by text in the database first, parsed only where it may be). One statement."""
    read = await reads.turn_outcome(session_id, turn_id)
    if read.outcome is not None:
        event = wire.loads(read.outcome)
        return Ended(event["type"], event.get("data") or {}, read.messages)
    if not waiting or read.status is None:
        return None
    if read.status == "waitingfortoolresults":
        return Waiting("tool_results", read.messages)
    if any(map(_asks_approval, read.asking)):
        return Waiting("approval", read.messages)
    return None


def _asks_approval(snapshot: bytes) -> bool:
    return any(
        part.get("type") == "interaction" and part.get("status") == "pending"
        for part in wire.loads(snapshot).get("content") or ()
    )


async def wait_for_turn(
    reads: Reads,
    fanout: Fanout,
    session_id: uuid.UUID,
    turn_id: uuid.UUID,
    timeout_seconds: float,
    key_hash: str | None = None,
    subscribed: Subscription | None = None,
) -> Ended | Waiting | None:
    """The turn's outcome, `Waiting` as soon as it waits for its client (for tool
    results or an approval: it would not end before the client acts), or None if
    neither came within `timeout_seconds` (or the server ended the wait: drain,
    session deleted). Unauthorized once `key_hash` (the key the wait was opened with)
    is revoked.

    `subscribed`: the caller's subscription to the session, opened before the turn's
    message committed (and closed by the caller), so that the turn's end is in it
    and need not be read first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    given = subscribed
    while True:
        if given is not None:
            sub, given = given, None
            owned = False
        else:
            # Subscribe first, then read: an end that commits in between is in the
            # read or arrives in the subscription.
            sub = fanout.subscribe(session_id, key_hash, durable_only=True)
            owned = True
        # The deadline closes the subscription: no timer or task per item waited for.
        timer = loop.call_at(deadline, sub.close)
        try:
            if owned:
                ended = await turn_ended(reads, session_id, turn_id, waiting=True)
                if ended is not None:
                    return ended
            while True:
                item = await sub.next()
                if item is None:
                    if sub.overflowed and loop.time() < deadline:
                        break  # It fell behind: subscribe again and read again.
                    return None
                if item is CYCLE or item is GONE:
                    return None
                if item is REVOKED:
                    raise Unauthorized(
                        "the API key was revoked while the request waited"
                    )
                if item is RESYNC or (
                    isinstance(item, EventOut)
                    and (item.type in TURN_ENDS or item.type in MAY_WAIT)
                ):
                    ended = await turn_ended(reads, session_id, turn_id, waiting=True)
                    if ended is not None:
                        return ended
        finally:
            timer.cancel()
            if owned:
                fanout.unsubscribe(sub)


def completed_body(message: bytes, ended: Ended) -> bytes:
    """`200 {status, message, messages, error?}`: the posted message as stored, the
    turn's agent messages, and, for a failed or cancelled turn, what went wrong.
    Snapshots are spliced in as stored, not re-serialized."""
    if ended.type == "turn.completed":
        head = b'{"status":"completed"'
    else:
        if ended.type == "turn.cancelled":
            code = ended.data.get("reason") or "cancelled"
            text = "The turn was cancelled"
        else:
            code = ended.data.get("error_code") or "failed"
            text = ended.data.get("error") or "The turn failed"
        error = {"code": code, "message": text}
        head = b'{"status":"failed","error":' + wire.dumps(error)
    listed = wire.join_array(ended.messages)
    return head + b',"message":' + message + b',"messages":' + listed + b"}"


def waiting_body(message: bytes, waiting: Waiting) -> bytes:
    """`202 {status: "waiting", waiting_for, message, messages}`: the turn goes on once
    the client answers its tool calls or decides its approval (both are in
    `messages`, the turn's agent messages so far)."""
    listed = wire.join_array(waiting.messages)
    return (
        b'{"status":"waiting","waiting_for":"'
        + waiting.waiting_for.encode()
        + b'","message":'
        + message
        + b',"messages":'
        + listed
        + b"}"
    )


def timeout_body(message: bytes) -> bytes:
    """`202 {status: "timeout", message}`: the message is stored and its turn goes on."""
    return b'{"status":"timeout","message":' + message + b"}"
