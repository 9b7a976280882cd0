"""The one life cycle of a tool call, kept on its `tool_call` part (`status`):

    input_streaming ─▶ ready ─┬─▶ awaiting_approval ─▶ running ─┬─▶ completed
       (live only)            ├─▶ awaiting_client ──────────────┤
                              ├─▶ running ──────────────────────┤
                              └─▶ failed ◀──────────────────────┘

`input_streaming` exists only in the live projection (arguments still arriving); a
step commits its tool calls as `ready`. A client-side tool goes from `awaiting_client`
straight to `completed` or `failed`: the client ran it, and its result arrives in one
request. Every state but `completed` and `failed` may also end in `failed` (denied,
cancelled, interrupted). The checkpoint writer refuses any other move
(`ToolTransitionError`)."""

INPUT_STREAMING = "input_streaming"
READY = "ready"
AWAITING_APPROVAL = "awaiting_approval"
AWAITING_CLIENT = "awaiting_client"
RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"

STATES = (
    INPUT_STREAMING,
    READY,
    AWAITING_APPROVAL,
    AWAITING_CLIENT,
    RUNNING,
    COMPLETED,
    FAILED,
)
TERMINAL = frozenset({COMPLETED, FAILED})
# The states a committed part may hold (input_streaming is never written).
DURABLE = tuple(s for s in STATES if s != INPUT_STREAMING)

TRANSITIONS: dict[str, frozenset[str]] = {
    INPUT_STREAMING: frozenset({READY, FAILED}),
    READY: frozenset({AWAITING_APPROVAL, AWAITING_CLIENT, RUNNING, FAILED}),
    AWAITING_APPROVAL: frozenset({RUNNING, FAILED}),
    AWAITING_CLIENT: frozenset({COMPLETED, FAILED}),
    RUNNING: frozenset({COMPLETED, FAILED}),
    COMPLETED: frozenset(),
    FAILED: frozenset(),
}

# Parts written before the life cycle had its names called `ready` "requested".
LEGACY = {"requested": READY}


def current(status: str | None) -> str:
    """The state of a stored part (`ready` when it has none, as older parts)."""
    if status is None:
        return READY
    return LEGACY.get(status, status)


def allowed(source: str | None, target: str) -> bool:
    return target in TRANSITIONS.get(current(source), frozenset())
