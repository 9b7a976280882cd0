"""`session.sync()`: a live view of a session's newest messages that follows the seed's
reconnect-and-sync rules:

1. subscribe and buffer every Mutation before loading the snapshot;
2. merge complete `message` snapshots by message_id + revision (keep the higher);
3. apply `part` and `delta` only while the stream is continuous (a part extends the
   exact revision held, a delta starts where its part's text ends);
4. after a disconnect or a `reset`, keep what is shown as provisional, resubscribe,
   buffer, reload the snapshot and apply the buffer: deltas are never replayed.

Live Mutations update the newest window only; older pages loaded with `load_older()`
are never rewritten by them. The same algorithm as the JavaScript client's.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

import httpx

from evermirror_client._client import Closing, Session, Stream
from evermirror_client._errors import EvermirrorError
from evermirror_client._types import (
    DeltaMutation,
    Message,
    MessageMutation,
    Mutation,
    Part,
    PartMutation,
    ResetMutation,
    SessionMessagePage,
)
from evermirror_client._utf16 import utf16_index, utf16_length

log = logging.getLogger("evermirror_client")

SyncStatus = Literal["connecting", "live", "reconnecting", "closed"]


@dataclass
class _Live:
    """The live projection of one streaming message, extending committed `revision`."""

    revision: int
    parts: dict[str, Part] = field(default_factory=dict)
    # UTF-16 length of each live part's text (the unit of delta offsets).
    units: dict[str, int] = field(default_factory=dict)
    # Parts that saw a gap: no delta applies until a part frame or a snapshot.
    stale: set[str] = field(default_factory=set)


@dataclass
class _Attempt:
    """One connection: Mutations wait in `buffer` until the snapshot is loaded (then it
    is None); `reset` when the service could not continue from our cursor."""

    buffer: list[Mutation] | None = field(default_factory=list)
    reset: bool = False


class SyncView(Closing):
    """The live view. `messages` is the list of messages in order, live parts included;
    `status` is connecting, live, reconnecting (what is shown is provisional) or
    closed. Close it with `aclose()` (or use it as an async context manager)."""

    def __init__(self, session: Session, *, limit: int, include_internal: bool) -> None:
        self.session = session
        self.limit = limit
        self.include_internal = include_internal
        self.status: SyncStatus = "connecting"
        # What ended the view, when a refusal did.
        self.error: BaseException | None = None
        self._committed: dict[str, Message] = {}
        self._live: dict[str, _Live] = {}
        # Sequences below this belong to older pages; live Mutations leave them alone.
        self._window_start = 0
        # Where load_older() continues; None when nothing older exists.
        self._older_before: int | None = None
        self._loaded_once = False
        self._cursor: int | None = None
        self._listeners: list[Callable[[SyncView], None]] = []
        self._rendered: list[Message] = []
        self._dirty = True
        self._notify_scheduled = False
        self._changed_event = asyncio.Event()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Set by `aclose`: the loop ends even if a cancellation was absorbed below it
        # (a stream that finished with an error as it was being cancelled).
        self._closing = False
        self._task = asyncio.create_task(self._run())

    # ---- what the view shows ------------------------------------------------------

    @property
    def messages(self) -> list[Message]:
        """The messages in sequence order, each with the live parts of the revision it
        holds. Unchanged messages are the same objects between changes."""
        if self._dirty:
            self._dirty = False
            self._rendered = [
                self._render(m)
                for m in sorted(self._committed.values(), key=lambda m: m["sequence"])
            ]
        return list(self._rendered)

    def _render(self, message: Message) -> Message:
        live = self._live.get(message["id"])
        if live is None or live.revision != message["revision"] or not live.parts:
            return message
        held = {part.get("part_id") for part in message["content"]}
        extra = sorted(
            (p for p in live.parts.values() if p["part_id"] not in held),
            key=lambda p: p.get("sequence", 0),
        )
        if not extra:
            return message
        rendered: Message = {**message, "content": [*message["content"], *extra]}
        return rendered

    @property
    def has_more(self) -> bool:
        """Whether older messages exist than those held (see `load_older()`)."""
        return self._older_before is not None

    def on_change(self, listener: Callable[["SyncView"], None]) -> Callable[[], None]:
        """Calls `listener(view)` after every change; returns a function removing it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def wait_for(
        self,
        predicate: Callable[[list[Message]], bool],
        # A parameter, as in asyncio.wait_for: waiting without a bound is never meant.
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> list[Message]:
        """The messages, once `predicate(messages)` holds. TimeoutError after
        `timeout` seconds; the error that closed the view if it closes first."""
        deadline = time.monotonic() + timeout
        while True:
            if self.status == "closed":
                raise self.error or RuntimeError("the view is closed")
            messages = self.messages
            if predicate(messages):
                return messages
            event = self._changed_event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"SyncView.wait_for: not within {timeout} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)

    async def load_older(self, limit: int | None = None) -> int:
        """Loads the page before the oldest message held; returns how many were added."""
        before = self._older_before
        if before is None:
            return 0
        page = await self.session.messages(
            limit=limit or self.limit,
            before_sequence=before,
            include_internal=self.include_internal,
        )
        # A reload that found a hole meanwhile restarted the older pages: drop this one.
        if self._older_before != before:
            return 0
        added = 0
        for message in page.items:
            if message["id"] not in self._committed:
                self._committed[message["id"]] = message
                added += 1
        self._older_before = page.next_before_sequence if page.has_more else None
        self._changed()
        return added

    async def aclose(self) -> None:
        self._closing = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def _changed(self) -> None:
        self._dirty = True
        if self._notify_scheduled:
            return
        self._notify_scheduled = True
        # Coalesced: a burst (a buffer applied after a reload) is one notification.
        asyncio.get_running_loop().call_soon(self._notify)

    def _notify(self) -> None:
        self._notify_scheduled = False
        event, self._changed_event = self._changed_event, asyncio.Event()
        event.set()
        for listener in list(self._listeners):
            try:
                listener(self)
            except Exception:
                log.exception("a SyncView listener failed")

    def _set_status(self, status: SyncStatus) -> None:
        if self.status != status:
            self.status = status
            self._changed()

    # ---- merging ------------------------------------------------------------------

    def _merge_message(self, message: Message) -> None:
        """Rule 2: a snapshot replaces what is held only with a higher revision."""
        if message["sequence"] < self._window_start:
            return
        held = self._committed.get(message["id"])
        if held is not None and held["revision"] >= message["revision"]:
            return
        self._committed[message["id"]] = message
        live = self._live.get(message["id"])
        if live is not None and live.revision < message["revision"]:
            del self._live[message["id"]]
        self._changed()

    def _apply_part(self, mutation: PartMutation) -> None:
        """Rule 3: a part starts (or restarts, with its text so far) the live projection
        of the revision it extends."""
        held = self._committed.get(mutation.message_id)
        part = mutation.part
        if held is None or held["revision"] > mutation.revision:
            return
        if not isinstance(part, dict) or not isinstance(part.get("part_id"), str):
            return
        live = self._live.get(mutation.message_id)
        if live is None or live.revision < mutation.revision:
            live = _Live(mutation.revision)
            self._live[mutation.message_id] = live
        elif live.revision > mutation.revision:
            return
        part_id = part["part_id"]
        live.parts[part_id] = part
        text = part.get("text")
        live.units[part_id] = utf16_length(text) if isinstance(text, str) else 0
        live.stale.discard(part_id)
        self._changed()

    def _apply_delta(self, mutation: DeltaMutation) -> None:
        """Rule 3: a delta applies only where its part's text ends; offsets count UTF-16
        code units."""
        live = self._live.get(mutation.message_id)
        if live is None or live.revision != mutation.revision:
            return
        part_id = mutation.part_id
        part = live.parts.get(part_id)
        if (
            part is None
            or part_id in live.stale
            or not isinstance(part.get("text"), str)
        ):
            return
        length = live.units[part_id]
        added = utf16_length(mutation.text)
        if mutation.offset > length:
            # A gap: this part cannot continue until a part frame or its snapshot.
            live.stale.add(part_id)
            return
        if mutation.offset + added <= length:
            return  # already held
        tail = mutation.text[utf16_index(mutation.text, length - mutation.offset) :]
        live.parts[part_id] = {**part, "text": part["text"] + tail}
        live.units[part_id] = mutation.offset + added
        self._changed()

    def _apply(self, mutation: Mutation) -> None:
        if isinstance(mutation, MessageMutation):
            self._merge_message(mutation.message)
            self._advance(mutation.cursor)
        elif isinstance(mutation, PartMutation):
            self._apply_part(mutation)
        elif isinstance(mutation, DeltaMutation):
            self._apply_delta(mutation)
        # Other kinds (turn, session, warning, ...) are not rendered by the view.

    def _advance(self, cursor: str | None) -> None:
        if cursor is not None and cursor.isascii() and cursor.isdigit():
            self._cursor = max(self._cursor or 0, int(cursor))

    def _load_page(self, page: SessionMessagePage) -> None:
        """Rule 4's reload: the newest page replaces the newest window (by revision, so
        a page a moment older than what the stream already gave never goes back)."""
        newest_held = max((m["sequence"] for m in self._committed.values()), default=-1)
        if not self._loaded_once:
            self._loaded_once = True
            self._older_before = page.next_before_sequence if page.has_more else None
        elif page.has_more and newest_held < (page.start_sequence or 0):
            # More messages arrived while offline than one page holds: what is held is
            # no longer adjacent to the page. The older pages start over from it.
            self._committed.clear()
            self._older_before = page.next_before_sequence
        self._window_start = (page.start_sequence or 0) if page.has_more else 0
        for message in page.items:
            held = self._committed.get(message["id"])
            if held is None or held["revision"] < message["revision"]:
                self._committed[message["id"]] = message
        self._advance(page.cursor)
        self._changed()

    # ---- the connection loop ------------------------------------------------------

    async def _run(self) -> None:
        client = self.session.client
        failures = 0
        try:
            while not self._closing:
                attempt = _Attempt()
                live = False
                hint: int | None = None
                retry_after: int | None = None
                failed = False
                try:
                    async with self.session.open_stream(
                        cursor=None if self._cursor is None else str(self._cursor),
                        include_internal=self.include_internal,
                    ) as stream:
                        reader = asyncio.create_task(self._read(stream, attempt))
                        try:
                            live = await self._reload(attempt, reader)
                            await reader
                        finally:
                            reader.cancel()
                            try:
                                await reader
                            except asyncio.CancelledError:
                                # The reader's own cancellation ends here; this task's
                                # (`aclose` while it waited for the reader) goes on.
                                current = asyncio.current_task()
                                if current is not None and current.cancelling():
                                    raise
                    hint = stream.retry_ms
                except EvermirrorError as error:
                    if not error.retryable:
                        raise
                    failed = True
                    retry_after = error.retry_after
                except httpx.TransportError:
                    failed = True
                # What is shown stays, marked provisional, until the next reload.
                if self.status == "live":
                    self._set_status("reconnecting")
                if attempt.reset:
                    self._cursor = None
                    hint = 0
                if live:
                    failures = 0
                if failed or not live:
                    failures += 1
                await asyncio.sleep(client.reconnect_delay(failures, hint, retry_after))
        except Exception as error:
            self.error = error
        finally:
            self._live.clear()
            self.status = "closed"
            if not self._ready.done():
                self._ready.set_exception(self.error or RuntimeError("the view closed"))
                # Read here so that an unawaited start does not log it as lost.
                self._ready.exception()
            self._changed()

    async def _read(self, stream: Stream, attempt: _Attempt) -> None:
        async for mutation in stream:
            if isinstance(mutation, ResetMutation):
                # The service cannot continue from our cursor: start over without it.
                attempt.reset = True
                return
            if attempt.buffer is not None:
                attempt.buffer.append(mutation)
            else:
                self._apply(mutation)

    async def _reload(self, attempt: _Attempt, reader: "asyncio.Task[None]") -> bool:
        """With the stream open and buffering: load the snapshot, then apply the buffer
        and go live, as one step. Returns whether it went live."""
        page = await self.session.messages(
            limit=self.limit, include_internal=self.include_internal
        )
        self._load_page(page)
        if reader.done():
            # The stream ended meanwhile: its buffer is not the whole story.
            return False
        # The live parts shown before a disconnect give way to what this connection
        # sends: the service opens every stream with the live parts so far.
        self._live.clear()
        buffer, attempt.buffer = attempt.buffer or [], None
        for mutation in buffer:
            self._apply(mutation)
        self._set_status("live")
        if not self._ready.done():
            self._ready.set_result(None)
        return True


class SyncStart:
    """What `session.sync()` returns: await it for the view once its first snapshot is
    shown, or use it as `async with session.sync() as view:`."""

    def __init__(self, session: Session, *, limit: int, include_internal: bool) -> None:
        self._session = session
        self._limit = limit
        self._include_internal = include_internal
        self._view: SyncView | None = None

    async def _start(self) -> SyncView:
        view = SyncView(
            self._session, limit=self._limit, include_internal=self._include_internal
        )
        try:
            await asyncio.shield(view._ready)
        except BaseException:
            await view.aclose()
            raise
        self._view = view
        return view

    def __await__(self) -> Generator[Any, None, SyncView]:
        return self._start().__await__()

    async def __aenter__(self) -> SyncView:
        return await self._start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._view is not None:
            await self._view.aclose()
