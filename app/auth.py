"""API keys: stored only as SHA-256 hashes, resolved to an organization per request.

Keys are 256-bit random tokens, so a fast unsalted hash is as strong as a slow one and
keeps the lookup a single indexed equality. Valid keys are remembered, so the hot read
paths cost no database round trip; a change to the keys (one created or revoked, by any
process) is announced on the bus (PostgreSQL: a NOTIFY sent with the change's COMMIT) or,
on SQLite, where the revoking CLI is another process with no bus to reach this one,
noticed by polling a fingerprint of the keys table every `poll_seconds`. Either way every
remembered key is re-checked at once, and streams opened with a revoked key are ended.

Unknown keys are remembered too, in a small cache of their own (`NEGATIVE_SIZE`): a flood
of fresh bogus keys cannot evict the valid ones, and its database lookups are bounded by
the rate limiter's budget for unknown credentials (app.api.guards).
"""

import asyncio
import contextlib
import hashlib
import hmac
import logging
import re
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import models
from app.db.dialect import lock_for_transaction
from app.db.session import Database
from app.db.types import utcnow
from app.db.writes import Write
from app.errors import Unauthorized
from app.ids import DEFAULT_ORG_ID, uuid7

log = logging.getLogger("app.auth")

KEY_PREFIX = "evm_"
KEY_PATTERN = re.compile(r"evm_[0-9a-f]{64}")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_hex(32)


async def create_key(
    db: Write, *, organization_id: uuid.UUID, name: str | None = None
) -> tuple[models.ApiKey, str]:
    key = generate_key()
    values = {
        "id": uuid7(),
        "organization_id": organization_id,
        "name": name,
        "key_hash": hash_key(key),
        "prefix": key[:12],
        "created_at": utcnow(),
        "revoked_at": None,
    }
    conn = await db.core()
    await conn.execute(insert(models.ApiKey).values(values))
    # The first key ends open mode on every process.
    db.outbox.keys_changed = True
    return models.ApiKey(**values), key


async def revoke_key(
    db: Write, *, key_id: uuid.UUID | None = None, key_hash: str | None = None
) -> int:
    """Revoke one key, named by its id or by its hash (of the full key); returns how many
    were revoked (0: unknown or already revoked)."""
    stmt = (
        update(models.ApiKey)
        .where(models.ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    if key_id is not None:
        stmt = stmt.where(models.ApiKey.id == key_id)
    elif key_hash is not None:
        stmt = stmt.where(models.ApiKey.key_hash == key_hash)
    else:
        raise ValueError("revoke_key needs key_id or key_hash")
    conn = await db.core()
    result = await conn.execute(stmt)
    if result.rowcount:
        db.outbox.keys_changed = True
    return int(result.rowcount)


async def create_first_key(db: Write) -> tuple[models.ApiKey, str] | None:
    """A key for the default organization (the one open mode serves), unless a key was
    ever created. Processes starting together create one key between them: the check
    and the insert hold a lock (`lock_for_transaction`)."""
    conn = await db.core()
    await lock_for_transaction(conn, "evermirror.first_key")
    if await conn.scalar(select(models.ApiKey.id).limit(1)) is not None:
        return None
    return await create_key(db, organization_id=DEFAULT_ORG_ID, name="first key")


async def list_keys(db: AsyncSession) -> list[models.ApiKey]:
    return list(
        (
            await db.scalars(select(models.ApiKey).order_by(models.ApiKey.created_at))
        ).all()
    )


async def keys_exist(db: AsyncSession) -> bool:
    """Whether any key was ever created. Revoked keys count: revoking the last key must
    not reopen a service that was locked down."""
    return await db.scalar(select(models.ApiKey.id).limit(1)) is not None


def credential_from_header(authorization: str | None) -> str | None:
    """`Authorization: Bearer <key>`, or the bare key as the official Python SDK sends it."""
    if not authorization:
        return None
    scheme, _, rest = authorization.strip().partition(" ")
    if rest and scheme.lower() == "bearer":
        return rest.strip() or None
    return authorization.strip()


def credential_hash(authorization: str | None) -> str | None:
    """The hash of the key a request carries, however the header spells it."""
    credential = credential_from_header(authorization)
    return hash_key(credential) if credential else None


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: its organization, and the hash of the key it authenticated
    with (None in open mode). Streams keep the hash, so revoking the key ends them."""

    organization_id: uuid.UUID
    key_hash: str | None


OPEN_CALLER = Caller(DEFAULT_ORG_ID, None)

# A changed keys table, as the SQLite poll sees it.
Fingerprint = tuple[Any, ...]


class KeyResolver:
    # Unknown keys remembered (a 401 without a database lookup); least recently seen
    # first out. Bounded, and apart from the valid keys, so a flood of bogus keys
    # evicts only bogus keys.
    NEGATIVE_SIZE = 1024
    # Keys re-checked per statement when the keys change.
    REFRESH_BATCH = 500

    def __init__(
        self,
        database: Database,
        *,
        ttl_seconds: float,
        poll_seconds: float | None = None,
    ) -> None:
        self.database = database
        # A resolution is re-read after this long even if no change was announced.
        self.ttl_seconds = ttl_seconds
        # SQLite: how often the keys table is looked at for changes; None: the bus
        # announces them.
        self.poll_seconds = poll_seconds
        # Bumped by every announced change: a resolution made before it is not trusted
        # until the refresh re-checks it.
        self._epoch = 0
        # Key hash -> (expires at, epoch, organization).
        self._valid: dict[str, tuple[float, int, uuid.UUID]] = {}
        # Key hash -> expires at.
        self._invalid: OrderedDict[str, float] = OrderedDict()
        # Whether no key exists: (expires at, epoch, open).
        self._open: tuple[float, int, bool] = (0.0, 0, True)
        # False while the bus may be missing announcements (PostgreSQL listener down):
        # nothing remembered is trusted then.
        self._heard = True
        # Told the hashes of revoked keys that streams may hold (the fan-out ends them;
        # None: the streams opened in open mode, which ended with the first key), and
        # asked which hashes open streams hold.
        self.on_revoked: Callable[[set[str | None]], None] = lambda hashes: None
        self.streaming: Callable[[], Iterable[str]] = lambda: ()
        self._refresh: asyncio.Task[None] | None = None
        self._again = False
        self._poller: asyncio.Task[None] | None = None
        # Database lookups of keys made so far (what a flood of bogus keys costs).
        self.lookups = 0
        # SQLite: the keys table as last re-checked or polled.
        self._seen: Fingerprint = ()

    # ---- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        # Known from the start, so the rate limiter tells open mode from keyed mode.
        await self._open_mode()
        if self.poll_seconds is not None:
            async with self.database.read() as db:
                self._seen = await _fingerprint(db)
            self._poller = asyncio.create_task(self._poll(), name="keys-poll")

    async def stop(self) -> None:
        for task in (self._poller, self._refresh):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # ---- per request ---------------------------------------------------------------

    def cached(self, authorization: str | None) -> Caller | None:
        """The caller if it is known without a database read (open mode, or a key
        resolved since the last change), else None: resolve it the slow way."""
        if not self._heard:
            return None
        now = time.monotonic()
        expires, epoch, is_open = self._open
        if expires <= now or epoch != self._epoch:
            return None
        if is_open:
            return OPEN_CALLER
        digest = credential_hash(authorization)
        if digest is None:
            return None
        entry = self._valid.get(digest)
        if entry is None or entry[0] <= now or entry[1] != self._epoch:
            return None
        return Caller(entry[2], digest)

    def is_known(self, digest: str) -> bool:
        """Whether the key was valid when last checked (for the rate limiter, which
        gives known keys a budget of their own)."""
        return digest in self._valid

    @property
    def is_open(self) -> bool:
        """Whether the service runs open, as last checked and not changed since (a
        change may have been the first key)."""
        return self._open[2] and self._open[1] == self._epoch

    async def resolve(self, authorization: str | None) -> Caller:
        """The caller; the default organization while no keys exist. Raises
        Unauthorized."""
        if await self._open_mode():
            return OPEN_CALLER
        digest = credential_hash(authorization)
        if digest is None:
            raise Unauthorized(
                "An API key is required: send `Authorization: Bearer <key>`"
            )
        return await self.resolve_key(digest)

    async def resolve_key(self, digest: str) -> Caller:
        """The caller authenticating with the key of this hash. Raises Unauthorized."""
        now = time.monotonic()
        entry = self._valid.get(digest)
        if (
            entry is not None
            and entry[0] > now
            and entry[1] == self._epoch
            and self._heard
        ):
            return Caller(entry[2], digest)
        refused = self._invalid.get(digest)
        if refused is not None and refused > now and self._heard:
            self._invalid.move_to_end(digest)
            raise Unauthorized("Invalid or revoked API key")
        epoch = self._epoch
        self.lookups += 1
        async with self.database.read() as db:
            row = await db.scalar(
                select(models.ApiKey).where(
                    models.ApiKey.key_hash == digest,
                    models.ApiKey.revoked_at.is_(None),
                )
            )
        # Constant-time comparison of the stored hash guards against timing probes.
        if row is None or not hmac.compare_digest(row.key_hash, digest):
            self._invalid[digest] = now + self.ttl_seconds
            self._invalid.move_to_end(digest)
            if len(self._invalid) > self.NEGATIVE_SIZE:
                self._invalid.popitem(last=False)
            raise Unauthorized("Invalid or revoked API key")
        self._invalid.pop(digest, None)
        # Stamped with the epoch the read began in: if the keys changed meanwhile, the
        # refresh (or the next request) checks again.
        self._valid[digest] = (now + self.ttl_seconds, epoch, row.organization_id)
        return Caller(row.organization_id, digest)

    async def _open_mode(self) -> bool:
        now = time.monotonic()
        expires, epoch, is_open = self._open
        if expires <= now or epoch != self._epoch or not self._heard:
            epoch = self._epoch
            async with self.database.read() as db:
                is_open = not await keys_exist(db)
            self._open = (now + self.ttl_seconds, epoch, is_open)
        return is_open

    # ---- changes -------------------------------------------------------------------

    def changed(self) -> None:
        """The keys changed (or may have, unheard): distrust every resolution until it
        is re-checked, which starts now."""
        self._epoch += 1
        self._invalid.clear()
        if self._refresh is not None and not self._refresh.done():
            self._again = True
            return
        self._refresh = asyncio.create_task(self._refresh_all(), name="keys-refresh")

    def listening(self, heard: bool) -> None:
        """Whether the bus delivers every announcement (the PostgreSQL listener is up)."""
        missed = heard and not self._heard
        self._heard = heard
        if missed:
            # Announcements may have been missed while it was down.
            self.changed()

    async def _refresh_all(self) -> None:
        while True:
            self._again = False
            try:
                await self._recheck()
            except Exception as exc:
                # The database is unreachable: requests resolve the slow way meanwhile
                # (and fail while it is down); try again shortly.
                log.warning("re-checking API keys failed: %s", exc)
                await asyncio.sleep(1.0)
                self._again = True
            if not self._again:
                return

    async def _recheck(self) -> None:
        epoch = self._epoch
        digests = sorted(set(self._valid) | set(self.streaming()))
        active: dict[str, uuid.UUID] = {}
        async with self.database.read() as db:
            if self.poll_seconds is not None:
                # What this re-check sees needs no second one when the poll sees it.
                self._seen = await _fingerprint(db)
            is_open = not await keys_exist(db)
            for start in range(0, len(digests), self.REFRESH_BATCH):
                batch = digests[start : start + self.REFRESH_BATCH]
                rows = await db.execute(
                    select(models.ApiKey.key_hash, models.ApiKey.organization_id).where(
                        models.ApiKey.key_hash.in_(batch),
                        models.ApiKey.revoked_at.is_(None),
                    )
                )
                active.update((digest, org) for digest, org in rows.all())
        now = time.monotonic()
        for digest in list(self._valid):
            org = active.get(digest)
            if org is None:
                del self._valid[digest]
            else:
                self._valid[digest] = (now + self.ttl_seconds, epoch, org)
        was_open = self._open[2]
        self._open = (now + self.ttl_seconds, epoch, is_open)
        revoked: set[str | None] = {d for d in digests if d not in active}
        if was_open and not is_open:
            revoked.add(None)
        if revoked:
            self.on_revoked(revoked)

    # ---- SQLite: polling for changes made by other processes ------------------------

    async def _poll(self) -> None:
        assert self.poll_seconds is not None
        while True:
            await asyncio.sleep(self.poll_seconds)
            try:
                async with self.database.read() as db:
                    fingerprint = await _fingerprint(db)
            except Exception as exc:
                log.warning("polling API keys failed: %s", exc)
                continue
            if fingerprint != self._seen:
                self._seen = fingerprint
                self.changed()


async def _fingerprint(db: AsyncSession) -> Fingerprint:
    """Changes with every key created, revoked or deleted."""
    table = models.ApiKey
    row = (
        await db.execute(
            select(
                func.count(),
                func.count(table.revoked_at),
                func.max(table.created_at),
                func.max(table.revoked_at),
            )
        )
    ).one()
    return tuple(row)
