"""Abusive clients against one server process on loopback, with the service's default
limits; prints figures and stops by itself.

* bogus-key flood: a keyed service, one address sending `--flood` requests, each with a
  fresh random key, while a valid key keeps working from the same address. Every 401
  of a fresh key is one database lookup (the negative cache helps only repeats); the
  rest must be 429s, answered without one.
* slowloris: `--slow` sockets each sending a partial request header and then nothing,
  plus `--dribble` sockets sending a body a byte every 0.5 s, on a server whose
  descriptor limit is `--nofile` (set with prlimit): every socket must be closed
  (answered 408) within the read deadline (10 s) plus a margin, and the server must
  answer again once they are.
* revocation: a stream opened with a key, then `keys revoke` in another process: the
  stream must end within a second and the key's next request be 401.

    .venv/bin/python scripts/fault_abuse.py [--database sqlite|postgresql]
        [--flood 800] [--slow 300] [--dribble 50] [--nofile 256]

Exit status 0 when every check held.
"""

import argparse
import asyncio
import contextlib
import os
import resource
import secrets
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
from faultkit import ROOT, ServerProcess, add_database_options, run_with_server

DEADLINE = 10.0
UNKNOWN_BURST = 20
UNKNOWN_RATE = 1.0


def cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        check=True,
    )


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def flood(server: ServerProcess, key: str, count: int) -> bool:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        assert (
            await client.get("/v1/sessions", headers=bearer(key))
        ).status_code == 200
        answers: Counter[int] = Counter()
        valid: Counter[int] = Counter()
        started = time.monotonic()
        for index in range(count):
            bogus = "evm_" + secrets.token_hex(32)
            response = await client.get("/v1/sessions", headers=bearer(bogus))
            answers[response.status_code] += 1
            if index % 10 == 0:
                ok = await client.get("/v1/sessions", headers=bearer(key))
                valid[ok.status_code] += 1
        elapsed = time.monotonic() - started
    allowed = UNKNOWN_BURST + int(elapsed * UNKNOWN_RATE) + 1
    print(
        f"bogus-key flood: {count} requests in {elapsed:.2f} s: {answers[429]} x 429, "
        f"{answers[401]} x 401 (= database lookups; at most {allowed} allowed); "
        f"the valid key meanwhile: {dict(valid)}"
    )
    return (
        answers[401] <= allowed
        and answers[401] + answers[429] == count
        and set(valid) == {200}
    )


async def open_socket(
    server: ServerProcess,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    try:
        return await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", server.port), 5
        )
    except (OSError, TimeoutError):
        return None


async def slow_socket(
    server: ServerProcess, dribble: bool
) -> tuple[float, bool] | None:
    """Seconds until the server closed the socket, and whether it answered 408 (None:
    it never connected)."""
    conn = await open_socket(server)
    if conn is None:
        return None
    reader, writer = conn
    started = time.monotonic()
    try:
        if dribble:
            writer.write(
                b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            )
            closed = asyncio.create_task(reader.read())
            while not closed.done() and time.monotonic() - started < 60:
                with contextlib.suppress(OSError):
                    writer.write(b" ")
                await asyncio.wait({closed}, timeout=0.5)
            received = await asyncio.wait_for(closed, 1)
        else:
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            received = await asyncio.wait_for(reader.read(), 60)
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
    return time.monotonic() - started, received.startswith(b"HTTP/1.1 408 ")


async def slowloris(server: ServerProcess, slow: int, dribble: int) -> bool:
    started = time.monotonic()
    sockets = [
        asyncio.create_task(slow_socket(server, dribble=i < dribble))
        for i in range(slow + dribble)
    ]
    await asyncio.sleep(1)
    recovered_at: float | None = None
    async with httpx.AsyncClient(base_url=server.url, timeout=2) as client:
        while time.monotonic() - started < DEADLINE * 4:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get("/health")).status_code == 200:
                    recovered_at = time.monotonic() - started
                    if all(task.done() for task in sockets):
                        break
            await asyncio.sleep(0.25)
    results = [r for r in await asyncio.gather(*sockets) if r is not None]
    answered = [seconds for seconds, timed_out in results if timed_out]
    dropped = len(results) - len(answered)
    print(
        f"slowloris: {slow} partial headers + {dribble} dribbled bodies; "
        f"{len(answered)} answered 408 and closed after {min(answered):.1f}-"
        f"{max(answered):.1f} s, {dropped} closed unanswered (beyond the descriptor "
        f"limit); /health answered {recovered_at:.1f} s after the start"
        if answered and recovered_at is not None
        else f"slowloris: results={len(results)} recovered={recovered_at}"
    )
    return (
        bool(answered)
        and max(seconds for seconds, _ in results) < DEADLINE + 3
        and recovered_at is not None
        and recovered_at < DEADLINE + 5
    )


async def revocation(server: ServerProcess, database_url: str, key: str) -> bool:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        created = await client.post(
            "/v1/sessions", json={"title": "revoked"}, headers=bearer(key)
        )
        sid = created.json()["id"]
        async with client.stream(
            "GET",
            f"/v1/sessions/{sid}/sse",
            headers=bearer(key),
            timeout=httpx.Timeout(10, read=30),
        ) as stream:
            ended = asyncio.Event()
            ended_at = 0.0

            async def read() -> None:
                nonlocal ended_at
                with contextlib.suppress(httpx.HTTPError):
                    async for _ in stream.aiter_raw():
                        pass
                ended_at = time.monotonic()
                ended.set()

            reader = asyncio.create_task(read())
            await asyncio.sleep(0.5)
            cli_started = time.monotonic()
            await asyncio.to_thread(cli, database_url, "keys", "revoke", key)
            cli_done = time.monotonic()
            status = (await client.get("/v1/sessions", headers=bearer(key))).status_code
            try:
                await asyncio.wait_for(ended.wait(), 5)
            except TimeoutError:
                reader.cancel()
                print("revocation: the stream did not end")
                return False
    print(
        f"revocation: `keys revoke` ran {cli_done - cli_started:.2f} s (process start "
        f"included); the stream ended {ended_at - cli_started:.2f} s after it started, "
        f"{cli_done - ended_at:.2f} s before it returned; the next request: {status}"
    )
    return ended_at - cli_done < 1.0 and status == 401


async def scenario(server: ServerProcess, args: argparse.Namespace) -> bool:
    key = cli(server.database_url, "keys", "create", "--org", "org_" + "d4" * 16)
    key_value = key.stdout.strip()
    # Keys created after start-up take effect at once (announced, or polled on SQLite).
    await asyncio.sleep(1)
    ok = await flood(server, key_value, args.flood)
    resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (args.nofile, args.nofile))
    ok = await slowloris(server, args.slow, args.dribble) and ok
    return await revocation(server, server.database_url, key_value) and ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_database_options(parser)
    parser.add_argument("--flood", type=int, default=800)
    parser.add_argument("--slow", type=int, default=300)
    parser.add_argument("--dribble", type=int, default=50)
    parser.add_argument("--nofile", type=int, default=256)
    args = parser.parse_args()

    async def run(server: ServerProcess, _sqlite: Path | None) -> bool:
        return await scenario(server, args)

    run_with_server(
        args,
        prefix="evm-abuse-",
        # The service's own defaults for the limits (faultkit turns rate limits off).
        env={"RATE_LIMIT_PER_SECOND": "100"},
        scenario=run,
    )


if __name__ == "__main__":
    main()
