"""The `writes` row's second client: the same 64 writers as wrk's script, written the way
a user's own check would be (asyncio tasks over aiohttp, one session each), run as
`python -m bench.writers_client '<json config>'` pinned where wrk runs.

It prints `ready` once started, posts for `duration` seconds after the parent's `go` on
stdin, and prints one JSON object: the POSTs answered 201, the failures, the seconds from
the first request to the last answer, and its own CPU seconds. The parent counts committed
rows from the database around it, as it does around wrk, so the two clients are read the
same way.
"""

import asyncio
import sys
import time
from typing import Any

import aiohttp
import orjson


async def writer(
    http: aiohttp.ClientSession,
    url: str,
    session: str,
    index: int,
    config: dict[str, Any],
    deadline: float,
    counts: dict[str, int],
) -> None:
    path = f"{url}/v1/sessions/{session}/messages"
    headers = {
        "Content-Type": "application/json",
        "Authorization": config["authorization"],
    }
    sent = 0
    while time.monotonic() < deadline:
        sent += 1
        body = orjson.dumps(
            {
                "client_message_id": f"{config['run']}-a{index}-{sent}",
                "message": {"content": [{"type": "text", "text": config["text"]}]},
            }
        )
        try:
            async with http.post(path, data=body, headers=headers) as response:
                await response.read()
                counts["ok" if response.status == 201 else "failed"] += 1
        except aiohttp.ClientError:
            counts["failed"] += 1


async def main(config: dict[str, Any]) -> None:
    sessions: list[str] = config["sessions"]
    # One connection per writer, as wrk's -c; no compression asked for (wrk asks for
    # none, and the answers are small).
    connector = aiohttp.TCPConnector(limit=len(sessions), force_close=False)
    counts = {"ok": 0, "failed": 0}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    cpu = time.process_time()
    async with aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding",),
    ) as http:
        started = time.monotonic()
        deadline = started + config["duration"]
        await asyncio.gather(
            *(
                writer(http, config["url"], session, i, config, deadline, counts)
                for i, session in enumerate(sessions)
            )
        )
        seconds = time.monotonic() - started
    cpu = time.process_time() - cpu
    result = {**counts, "seconds": seconds, "cpu_seconds": cpu}
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    asyncio.run(main(orjson.loads(sys.argv[1])))
