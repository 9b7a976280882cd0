"""Concurrent SSE connection limits, per session and per process."""

import uuid
from dataclasses import dataclass, field

from app.errors import TooManyRequests


@dataclass
class StreamLimits:
    per_session: int
    per_process: int
    open: dict[uuid.UUID, int] = field(default_factory=dict)
    total: int = 0

    def acquire(self, session_id: uuid.UUID) -> None:
        if self.total >= self.per_process:
            raise TooManyRequests(
                "SSE connection limit for this server reached", retry_after_seconds=5
            )
        if self.open.get(session_id, 0) >= self.per_session:
            raise TooManyRequests(
                "per-session SSE connection limit reached", retry_after_seconds=5
            )
        self.open[session_id] = self.open.get(session_id, 0) + 1
        self.total += 1

    def release(self, session_id: uuid.UUID) -> None:
        count = self.open.get(session_id, 0) - 1
        if count > 0:
            self.open[session_id] = count
        else:
            self.open.pop(session_id, None)
        self.total = max(0, self.total - 1)
