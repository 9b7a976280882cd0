"""Rate limits that cannot be dodged: requests with unknown credentials share a small
budget per client address (a flood of fresh bogus keys is refused without a database
lookup each, and evicts nobody's bucket or cached key); `X-Forwarded-For` counts only
from configured proxies; the budgets are the whole service's, shared out over its
processes."""

import asyncio
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.auth import KeyResolver, create_key
from app.db.session import Database
from app.main import create_app
from app.settings import Settings
from tests.support.api import auth
from tests.support.cli import create_cli_key, run_cli
from tests.support.lanes import ROOT, make_settings
from tests.support.problems import assert_problem, assert_too_many
from tests.support.servers import free_port, server_process
from tests.support.waits import wait_until

ORG = uuid.UUID(hex="33333333333333333333333333333333")
ORG_WIRE = "org_" + ORG.hex
FLOOD = 800
UNKNOWN_BURST = 20


def bogus_key() -> str:
    return "evm_" + secrets.token_hex(32)


@dataclass
class Limited:
    app: Any
    database: Database
    keys: KeyResolver
    key: str

    def client(self, address: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.app, client=(address, 50000))
        return httpx.AsyncClient(transport=transport, base_url="http://test")


async def limited_app(settings: Settings, **overrides: Any) -> AsyncIterator[Limited]:
    values: dict[str, Any] = {
        "rate_limit_per_second": 100.0,
        "rate_limit_burst": 400,
        "rate_limit_unknown_key_per_second": 1.0,
        "rate_limit_unknown_key_burst": UNKNOWN_BURST,
        **overrides,
    }
    app = create_app(make_settings(settings.database_url, **values))
    async with app.router.lifespan_context(app):
        state = app.state.app
        async with state.database.write() as db:
            _, key = await create_key(db, organization_id=ORG)
        yield Limited(app, state.database, state.keys, key)


async def keys_settled(keys: KeyResolver, quiet: float = 0.6) -> None:
    """Until the resolver has taken no announcement for `quiet` seconds and has no
    re-check running."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        epoch = keys._epoch
        await asyncio.sleep(quiet)
        refreshing = keys._refresh is not None and not keys._refresh.done()
        if keys._epoch == epoch and not refreshing:
            return
    pytest.fail("the key resolver kept hearing announcements")


@pytest.fixture
async def limited(settings: Settings) -> AsyncIterator[Limited]:
    async for value in limited_app(settings):
        yield value


async def test_a_flood_of_bogus_keys_is_refused_without_a_lookup_each(
    limited: Limited,
) -> None:
    async with (
        limited.client("10.0.0.1") as attacker,
        limited.client("10.0.0.1") as neighbour,
        limited.client("10.0.0.2") as other,
    ):
        # A valid key in use before the flood, from the attacker's own address too.
        page = "/v1/sessions"
        assert (await neighbour.get(page, headers=auth(limited.key))).status_code == 200
        lookups = limited.keys.lookups
        started = time.monotonic()
        answers: Counter[int] = Counter()
        for _ in range(FLOOD):
            response = await attacker.get(page, headers=auth(bogus_key()))
            answers[response.status_code] += 1
            if response.status_code == 429:
                assert_too_many(response, code="rate_limited")
            else:
                assert_problem(response, 401, code="unauthorized")
        elapsed = time.monotonic() - started
        flood_lookups = limited.keys.lookups - lookups
        # The unknown-credential budget: its burst, and what refilled meanwhile.
        allowed = UNKNOWN_BURST + int(elapsed * 1.0) + 1
        assert answers[401] <= allowed, (answers, elapsed)
        assert answers[429] >= FLOOD - allowed, (answers, elapsed)
        assert flood_lookups == answers[401], (flood_lookups, answers)

        # The valid key kept its bucket and its cached resolution: no lookup, no 429,
        # from the same address as the flood.
        lookups = limited.keys.lookups
        for _ in range(50):
            response = await neighbour.get(page, headers=auth(limited.key))
            assert response.status_code == 200, response.text
        assert limited.keys.lookups == lookups
        # Another address has its own budget for unknown keys.
        response = await other.get(page, headers=auth(bogus_key()))
        assert_problem(response, 401)
        print(
            f"bogus-key flood: {FLOOD} requests in {elapsed:.2f} s, "
            f"{answers[429]} x 429, {answers[401]} x 401, {flood_lookups} lookups"
        )


async def test_a_repeated_bogus_key_is_looked_up_once(limited: Limited) -> None:
    key = bogus_key()
    async with limited.client("10.0.0.3") as client:
        lookups = limited.keys.lookups
        for _ in range(10):
            assert_problem(await client.get("/v1/sessions", headers=auth(key)), 401)
        assert limited.keys.lookups == lookups + 1


async def test_a_new_valid_key_is_looked_up_once_then_counts_as_itself(
    limited: Limited,
) -> None:
    async with limited.database.write() as db:
        _, fresh = await create_key(db, organization_id=ORG)
    # The new key's announcement makes the resolver distrust what it knows until its
    # re-check: heard at commit, and again when the NOTIFY comes back (PostgreSQL) or
    # the poll sees the table change (SQLite). Let both pass before counting.
    await keys_settled(limited.keys)
    async with limited.client("10.0.0.4") as client:
        response = await client.get("/v1/sessions", headers=auth(limited.key))
        assert response.status_code == 200
        # Spend the address's budget for unknown credentials.
        for _ in range(UNKNOWN_BURST):
            await client.get("/v1/sessions", headers=auth(bogus_key()))
        assert_too_many(await client.get("/v1/sessions", headers=auth(bogus_key())))
        # A key already known is not refused with them.
        response = await client.get("/v1/sessions", headers=auth(limited.key))
        assert response.status_code == 200
    async with limited.client("10.0.0.5") as client:
        lookups = limited.keys.lookups
        for _ in range(30):
            response = await client.get("/v1/sessions", headers=auth(fresh))
            assert response.status_code == 200, response.text
        assert limited.keys.lookups == lookups + 1


async def test_a_revoked_key_falls_to_the_budget_for_unknown_credentials(
    settings: Settings,
) -> None:
    # Next to no refill: the CLI's run below takes about a second, which at the usual
    # rate would give a token back or not, depending on the machine.
    async for limited in limited_app(
        settings,
        rate_limit_unknown_key_burst=3,
        rate_limit_unknown_key_per_second=0.001,
    ):
        async with limited.client("10.0.0.6") as client:
            headers = auth(limited.key)
            # The key's first request is looked up under the unknown budget (3 -> 2).
            assert (
                await client.get("/v1/sessions", headers=headers)
            ).status_code == 200
            result = await run_cli(settings.database_url, "keys", "revoke", limited.key)
            assert result.returncode == 0, result.stderr
            statuses = [
                (await client.get("/v1/sessions", headers=headers)).status_code
                for _ in range(6)
            ]
            assert statuses == [401, 401, 429, 429, 429, 429], statuses


async def test_open_mode_counts_by_address_whatever_credential_is_sent(
    settings: Settings,
) -> None:
    """The SDKs send a key even to a service without keys: in open mode every request
    counts against its address's full budget."""
    app = create_app(
        make_settings(
            settings.database_url,
            rate_limit_per_second=0.01,
            rate_limit_burst=5,
            rate_limit_unknown_key_burst=1,
        )
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("10.0.0.7", 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            statuses = [
                (await c.get("/v1/sessions", headers=auth(bogus_key()))).status_code
                for _ in range(6)
            ]
    assert statuses == [200] * 5 + [429], statuses


async def test_budgets_are_shared_out_over_the_expected_instances(
    settings: Settings,
) -> None:
    app = create_app(
        make_settings(
            settings.database_url,
            rate_limit_per_second=0.01,
            rate_limit_burst=6,
            sse_max_per_session=5,
            expected_instances=3,
        )
    )
    async with app.router.lifespan_context(app):
        assert app.state.app.limits.per_session == 2
        transport = httpx.ASGITransport(app=app, client=("10.0.0.8", 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            statuses = [(await c.get("/v1/sessions")).status_code for _ in range(3)]
    assert statuses == [200, 200, 429], statuses


# ---- X-Forwarded-For, on a real server (uvicorn applies it) ------------------------------


async def forwarded_statuses(server_url: str, forwarded: list[str]) -> list[int]:
    async with httpx.AsyncClient(base_url=server_url, timeout=10) as client:
        return [
            (
                await client.get("/v1/sessions", headers={"X-Forwarded-For": value})
            ).status_code
            for value in forwarded
        ]


async def test_x_forwarded_for_is_ignored_unless_from_a_trusted_proxy(
    settings: Settings, tmp_path: Path
) -> None:
    limits = {"RATE_LIMIT_PER_SECOND": "0.01", "RATE_LIMIT_BURST": "3"}
    rotating = [f"203.0.113.{i}" for i in range(1, 6)]
    async with server_process(
        settings.database_url, tmp_path, kill=False, **limits
    ) as server:
        # Loopback is no proxy by default: a rotating header buys nothing.
        assert await forwarded_statuses(server.url, rotating) == [200] * 3 + [429] * 2
    async with server_process(
        settings.database_url,
        tmp_path,
        kill=False,
        TRUSTED_PROXIES="127.0.0.1/32",
        **limits,
    ) as server:
        # From a trusted proxy the forwarded client counts, each on its own.
        assert await forwarded_statuses(server.url, rotating) == [200] * 5
        same = ["198.51.100.7"] * 4
        assert await forwarded_statuses(server.url, same) == [200] * 3 + [429]
        # What the client itself wrote in front of the proxy's entry does not count:
        # the address the proxy saw (the rightmost untrusted one) does.
        spoofed = [f"192.0.2.{i}, 198.51.100.9" for i in range(1, 5)]
        assert await forwarded_statuses(server.url, spoofed) == [200] * 3 + [429]


async def test_an_invalid_trusted_proxy_setting_is_refused(settings: Settings) -> None:
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "app", "serve", "--port", str(free_port())],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": settings.database_url,
            "TRUSTED_PROXIES": "10.0.0.0/8,not-an-address",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "TRUSTED_PROXIES" in result.stderr


# ---- across processes ------------------------------------------------------------------


def serve_workers(database_url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app",
                "serve",
                "--workers",
                "2",
                "--port",
                str(port),
            ],
            cwd=ROOT,
            env={
                **os.environ,
                "DATABASE_URL": database_url,
                "LOG_LEVEL": "info",
                "RATE_LIMIT_PER_SECOND": "0.01",
                "RATE_LIMIT_BURST": "4",
            },
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.postgres_only(reason="workers need PostgreSQL")
async def test_workers_share_one_budget(settings: Settings, tmp_path: Path) -> None:
    """`--workers 2` grants each worker half of the budget: however the connections
    spread over them, a client gets no more than the configured burst."""
    key = await create_cli_key(settings.database_url, ORG_WIRE)
    port = free_port()
    log = tmp_path / "workers.log"
    process = serve_workers(settings.database_url, port, log)
    try:
        await wait_until(
            lambda: log.read_text().count("Application startup complete") >= 2,
            "both workers to start",
            within=45,
            interval=0.1,
        )
        statuses: Counter[int] = Counter()
        for _ in range(20):
            # A fresh connection each time: they spread over both workers.
            async with httpx.AsyncClient(timeout=10) as client:
                response = await client.get(
                    f"http://127.0.0.1:{port}/v1/sessions", headers=auth(key)
                )
            statuses[response.status_code] += 1
        assert statuses[200] <= 4, statuses
        assert statuses[200] + statuses[429] == 20, statuses
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
