"""Waits with a deadline: for a condition, and for a session to reach a status (the
service's own HTTP API, or the official SDK's client)."""

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from everruns_sdk import Everruns

from tests.support.api import get_session

POLL = 0.05


async def wait_until(
    check: Callable[[], bool | Awaitable[bool]],
    what: str,
    within: float = 15.0,
    interval: float = POLL,
) -> None:
    """Poll `check` (plain or async) until it holds; AssertionError after `within` s."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(interval)


async def wait_status(
    client: httpx.AsyncClient,
    session_id: str,
    status: str,
    within: float = 20.0,
    *,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Poll the session until its status is `status`; returns the session."""
    deadline = time.monotonic() + within
    while True:
        session = await get_session(client, session_id, headers=headers)
        if session["status"] == status:
            return session
        assert time.monotonic() < deadline, (
            f"session {session_id} still {session['status']} after {within}s"
            f" (waiting for {status})"
        )
        await asyncio.sleep(POLL)


async def wait_idle(
    client: httpx.AsyncClient,
    session_id: str,
    within: float = 20.0,
    *,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Poll the session until no turn runs; returns the session."""
    return await wait_status(client, session_id, "idle", within, headers=headers)


async def wait_sdk_idle(sdk: Everruns, session_id: str, within: float = 30.0) -> None:
    """`wait_idle` through the official SDK's client."""
    deadline = time.monotonic() + within
    while (status := (await sdk.sessions.get(session_id)).status) != "idle":
        assert time.monotonic() < deadline, (
            f"session {session_id} still {status} after {within}s"
        )
        await asyncio.sleep(POLL)
