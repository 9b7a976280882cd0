"""Concurrent SSE connection and `wait=true` limits, per session and per process."""

import uuid
from dataclasses import dataclass, field

from app.errors import TooManyRequests

RETRY_AFTER_SECONDS = 5


class Slot:
    """One admitted stream. Released exactly once: by the stream's generator when it ends,
    or, if the client vanished before the generator ever ran, when the unstarted
    generator (which holds the slot) is garbage collected."""

    def __init__(
        self, limits: "StreamLimits", session_id: uuid.UUID, kind: str
    ) -> None:
        self._limits = limits
        self._session_id = session_id
        self._kind = kind
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limits.release(self._session_id, self._kind)

    def __del__(self) -> None:
        self.release()


@dataclass
class StreamLimits:
    per_session: int
    per_process: int
    open: dict[uuid.UUID, int] = field(default_factory=dict)
    total: int = 0
    # By kind ("sse", "mutations", "wait"): open now, and opened since start (metrics).
    by_kind: dict[str, int] = field(default_factory=dict)
    opened: dict[str, int] = field(default_factory=dict)

    def acquire(self, session_id: uuid.UUID, kind: str) -> Slot:
        # Streams and `wait=true` requests share the budget; the refusal names which.
        what = "wait" if kind == "wait" else "SSE connection"
        if self.total >= self.per_process:
            raise TooManyRequests(
                f"{what} limit for this server reached (open streams and waits)",
                retry_after_seconds=RETRY_AFTER_SECONDS,
            )
        if self.open.get(session_id, 0) >= self.per_session:
            raise TooManyRequests(
                f"per-session {what} limit reached (open streams and waits)",
                retry_after_seconds=RETRY_AFTER_SECONDS,
            )
        self.open[session_id] = self.open.get(session_id, 0) + 1
        self.total += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        self.opened[kind] = self.opened.get(kind, 0) + 1
        return Slot(self, session_id, kind)

    def release(self, session_id: uuid.UUID, kind: str) -> None:
        self.by_kind[kind] = max(0, self.by_kind.get(kind, 0) - 1)
        count = self.open.get(session_id, 0) - 1
        if count > 0:
            self.open[session_id] = count
        else:
            self.open.pop(session_id, None)
        self.total = max(0, self.total - 1)
