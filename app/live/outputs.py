"""What a stream's subscription receives from the fan-out: durable changes and live
items, each already encoded as the frames its streams send, and the markers that tell
a stream what to do next."""

from collections.abc import Callable
from dataclasses import dataclass

from app.live.items import TextDelta


@dataclass(frozen=True, slots=True)
class EventOut:
    """A durable event, encoded for upstream's stream."""

    sequence: int
    type: str
    frame: bytes


@dataclass(frozen=True, slots=True)
class MessageOut:
    """A committed message snapshot, encoded for the Mutation stream."""

    sequence: int
    visible: bool
    frame: bytes


@dataclass(frozen=True, slots=True)
class EventMutationOut:
    """The `turn` or `session` Mutation of a durable event, for the Mutation stream."""

    sequence: int
    frame: bytes


@dataclass(frozen=True, slots=True)
class PartOut:
    part_id: str
    # The UTF-16 length of the part's text so far: where its next delta starts.
    text_length: int
    frame: bytes


class DeltaOut:
    """A live delta, encoded for the Mutation stream at once and for `/sse` when a
    stream first asks: upstream's delta event carries the part's whole text so far, so
    encoding it for every delta, with or without an `/sse` subscriber, would cost each
    delta the length of the reply."""

    __slots__ = ("_sse", "delta", "end", "mutation_frame")

    def __init__(
        self,
        delta: TextDelta,
        sse_frame: bytes | Callable[[], bytes],
        mutation_frame: bytes,
        end: int,
    ) -> None:
        self.delta = delta
        self._sse = sse_frame
        self.mutation_frame = mutation_frame
        # Where the delta's text ends in its part, in UTF-16 code units.
        self.end = end

    @property
    def sse_frame(self) -> bytes:
        sse = self._sse
        if not isinstance(sse, bytes):
            sse = self._sse = sse()
        return sse


class Deltas:
    """Consecutive live deltas one fan-out pass hands over together: a stream writes
    their frames to its socket in one write, not one write each."""

    __slots__ = ("items",)

    def __init__(self, items: list[DeltaOut]) -> None:
        self.items = items


@dataclass(frozen=True, slots=True)
class WarningOut:
    """A model retry notice, encoded for both streams."""

    sse_frame: bytes
    mutation_frame: bytes


class Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Marker({self.name})"


# Re-read from the database (the bus may have missed items, or the channel failed).
RESYNC = Marker("resync")
# The process timer: time for a keep-alive comment.
HEARTBEAT = Marker("heartbeat")
# The process timer: this stream's connection cycle is over.
CYCLE = Marker("cycle")
# The session was deleted.
GONE = Marker("gone")
# The key the stream was opened with was revoked.
REVOKED = Marker("revoked")
# A frame written from the fan-out's pass has to wait for the socket: the stream's task
# finishes that write before anything else (see Subscription.direct).
FLUSH = Marker("flush")

Out = (
    EventOut
    | EventMutationOut
    | MessageOut
    | PartOut
    | DeltaOut
    | Deltas
    | WarningOut
    | Marker
)
