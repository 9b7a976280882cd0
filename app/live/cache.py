"""The hot-read cache: per session, its owner, the sequence it was read at, its newest
pages and single-message snapshots, as the bytes the API answers with.

It is kept correct by the bus: every checkpoint bumps the session's sequence and wakes
every process (in-process delivery, or NOTIFY on PostgreSQL), and a wake-up for a newer
sequence drops the session's entry. An entry is stored only if no newer wake-up was
heard while it was being read, so a read racing a write can never pin a stale page.
While the bus is not connected nothing is served or stored: a missed wake-up would go
unnoticed. Bounded by bytes, least recently used out first.
"""

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

# Sessions whose latest wake-up sequence is remembered (to refuse stale stores). A read
# races a write for milliseconds; this many other sessions would have to be written in
# that window for a remembered sequence to be forgotten too early.
HEARD_SESSIONS = 100_000
# Single-message snapshots kept per session.
MESSAGES_PER_SESSION = 64


@dataclass(frozen=True, slots=True)
class CachedPage:
    etag: str
    body: bytes


@dataclass(slots=True)
class Entry:
    organization_id: uuid.UUID
    last_sequence: int
    # (limit, include_internal) -> the newest page
    pages: dict[tuple[int, bool], CachedPage] = field(default_factory=dict)
    messages: dict[uuid.UUID, bytes] = field(default_factory=dict)
    size: int = 0


class PageCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.entries: OrderedDict[uuid.UUID, Entry] = OrderedDict()
        self.heard: OrderedDict[uuid.UUID, int] = OrderedDict()
        # Off until the bus says it is listening (see `connected`).
        self.enabled = False

    # ---- bus side ------------------------------------------------------------------

    def committed(self, session_id: uuid.UUID, sequence: int) -> None:
        """A checkpoint up to `sequence` committed for the session (any process)."""
        if sequence > self.heard.get(session_id, 0):
            self.heard[session_id] = sequence
        self.heard.move_to_end(session_id)
        if len(self.heard) > HEARD_SESSIONS:
            self.heard.popitem(last=False)
        entry = self.entries.get(session_id)
        if entry is not None and entry.last_sequence < sequence:
            self._drop(session_id)

    def deleted(self, session_id: uuid.UUID) -> None:
        self._drop(session_id)
        # Any later store is for a session that no longer exists.
        self.heard[session_id] = 1 << 62

    def connected(self, listening: bool) -> None:
        """The bus started or stopped hearing wake-ups; either way nothing held is
        trusted any more."""
        self.enabled = listening
        self.entries.clear()
        self.size = 0

    # ---- request side --------------------------------------------------------------

    def entry(self, session_id: uuid.UUID) -> Entry | None:
        if not self.enabled:
            return None
        entry = self.entries.get(session_id)
        if entry is not None:
            self.entries.move_to_end(session_id)
        return entry

    def owned_entry(
        self, session_id: uuid.UUID, organization_id: uuid.UUID
    ) -> Entry | None:
        """The session's entry, if this process holds it and the caller's organization
        owns the session (another organization's caller reads from the database, which
        answers its 404)."""
        entry = self.entry(session_id)
        if entry is None or entry.organization_id != organization_id:
            return None
        return entry

    def store_page(
        self,
        session_id: uuid.UUID,
        organization_id: uuid.UUID,
        last_sequence: int,
        key: tuple[int, bool],
        page: CachedPage,
    ) -> None:
        entry = self._entry_for(session_id, organization_id, last_sequence)
        if entry is None:
            return
        old = entry.pages.get(key)
        entry.pages[key] = page
        self._grow(entry, len(page.body) - (len(old.body) if old else 0))

    def store_message(
        self,
        session_id: uuid.UUID,
        organization_id: uuid.UUID,
        last_sequence: int,
        message_id: uuid.UUID,
        snapshot: bytes,
    ) -> None:
        entry = self._entry_for(session_id, organization_id, last_sequence)
        if entry is None or message_id in entry.messages:
            return
        if len(entry.messages) >= MESSAGES_PER_SESSION:
            evicted = entry.messages.pop(next(iter(entry.messages)))
            self._grow(entry, -len(evicted))
        entry.messages[message_id] = snapshot
        self._grow(entry, len(snapshot))

    def _entry_for(
        self, session_id: uuid.UUID, organization_id: uuid.UUID, last_sequence: int
    ) -> Entry | None:
        if not self.enabled or last_sequence < self.heard.get(session_id, 0):
            return None
        entry = self.entries.get(session_id)
        if entry is not None and entry.last_sequence != last_sequence:
            if entry.last_sequence > last_sequence:
                return None  # this read is older than what is held
            self._drop(session_id)
            entry = None
        if entry is None:
            entry = Entry(organization_id, last_sequence)
            self.entries[session_id] = entry
        return entry

    def _grow(self, entry: Entry, delta: int) -> None:
        entry.size += delta
        self.size += delta
        while self.size > self.max_bytes and self.entries:
            self._drop(next(iter(self.entries)))

    def _drop(self, session_id: uuid.UUID) -> None:
        entry = self.entries.pop(session_id, None)
        if entry is not None:
            self.size -= entry.size
