"""API keys: stored only as SHA-256 hashes, resolved to an organization per request.

Keys are 256-bit random tokens, so a fast unsalted hash is as strong as a slow one and
keeps the lookup a single indexed equality. Resolutions are cached for a few seconds so
the hot read paths cost no database round trip; a revoked key stops working within
`auth_cache_seconds`.
"""

import hashlib
import hmac
import secrets
import time
import uuid
from dataclasses import dataclass, field

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import models
from app.db.session import Database
from app.db.types import utcnow
from app.db.writes import Write
from app.errors import Unauthorized
from app.ids import DEFAULT_ORG_ID, uuid7

KEY_PREFIX = "evm_"


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
    return models.ApiKey(**values), key


async def revoke_key(
    db: Write, *, key_id: uuid.UUID | None = None, prefix: str | None = None
) -> int:
    stmt = (
        update(models.ApiKey)
        .where(models.ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    if key_id is not None:
        stmt = stmt.where(models.ApiKey.id == key_id)
    elif prefix is not None:
        stmt = stmt.where(models.ApiKey.prefix == prefix)
    else:
        raise ValueError("revoke_key needs key_id or prefix")
    conn = await db.core()
    result = await conn.execute(stmt)
    return int(result.rowcount)


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


@dataclass
class KeyResolver:
    database: Database
    ttl_seconds: float
    _open_until: float = 0.0
    _is_open: bool = True
    _cache: dict[str, tuple[float, uuid.UUID | None]] = field(default_factory=dict)

    async def _open_mode(self) -> bool:
        now = time.monotonic()
        if now >= self._open_until:
            async with self.database.read() as db:
                self._is_open = not await keys_exist(db)
            self._open_until = now + self.ttl_seconds
        return self._is_open

    def cached_organization(self, authorization: str | None) -> uuid.UUID | None:
        """The caller's organization if it is known without a database read (open mode
        or a cached, valid key), else None: the caller resolves it the slow way."""
        now = time.monotonic()
        if now >= self._open_until:
            return None
        if self._is_open:
            return DEFAULT_ORG_ID
        credential = credential_from_header(authorization)
        if credential is None:
            return None
        cached = self._cache.get(hash_key(credential))
        if cached is None or cached[0] <= now:
            return None
        return cached[1]

    async def organization_for(self, authorization: str | None) -> uuid.UUID:
        """The caller's organization; the default organization while no keys exist."""
        if await self._open_mode():
            return DEFAULT_ORG_ID
        credential = credential_from_header(authorization)
        if credential is None:
            raise Unauthorized(
                "An API key is required: send `Authorization: Bearer <key>`"
            )
        digest = hash_key(credential)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is None or cached[0] <= now:
            async with self.database.read() as db:
                row = await db.scalar(
                    select(models.ApiKey).where(
                        models.ApiKey.key_hash == digest,
                        models.ApiKey.revoked_at.is_(None),
                    )
                )
            # Constant-time comparison of the stored hash guards against timing probes.
            org = (
                row.organization_id
                if row is not None and hmac.compare_digest(row.key_hash, digest)
                else None
            )
            if len(self._cache) > 10_000:
                self._cache.clear()
            cached = (now + self.ttl_seconds, org)
            self._cache[digest] = cached
        if cached[1] is None:
            raise Unauthorized("Invalid or revoked API key")
        return cached[1]
