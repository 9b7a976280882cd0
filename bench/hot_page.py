"""`python -m bench.hot_page [--etag] [APP_ROOT ...]`: the Python cost of a cached newest
page on the hot path, in process (no server, no sockets): the ASGI application of each
checkout answers the same request 10,000 times, five times over; the best microseconds
per request are printed. With `--etag` the request carries the page's ETag and is
answered 304. Side by side for two checkouts, it tells the application's own
cost apart from the server's and the machine's."""

import asyncio
import os
import subprocess
import sys
import tempfile
import time

import httpx

REQUESTS = 10_000


async def measure() -> float:
    from app.main import create_app
    from app.settings import Settings

    directory = tempfile.mkdtemp()
    app = create_app(Settings(database_url=f"sqlite+aiosqlite:///{directory}/bench.db"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://x"
        ) as client:
            session_id = (await client.post("/v1/sessions", json={})).json()["id"]
            message = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
            await client.post(
                f"/v1/sessions/{session_id}/messages", json={"message": message}
            )
            await asyncio.sleep(1.5)  # the scripted turn ends
            page = await client.get(f"/v1/sessions/{session_id}/messages")
        headers = [(b"host", b"x")]
        if os.environ.get("HOT_PAGE_ETAG"):
            headers.append((b"if-none-match", page.headers["etag"].encode()))
        scope = {
            "type": "http",
            "method": "GET",
            "path": f"/v1/sessions/{session_id}/messages",
            "query_string": b"",
            "headers": headers,
            "root_path": "",
            "scheme": "http",
            "server": ("x", 80),
            "client": ("c", 1),
            "http_version": "1.1",
            "raw_path": b"",
            "asgi": {"version": "3.0"},
        }

        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: object) -> None:
            return None

        best = float("inf")
        for _ in range(5):
            began = time.perf_counter()
            for _ in range(REQUESTS):
                await app(dict(scope), receive, send)
            best = min(best, (time.perf_counter() - began) / REQUESTS)
        return best


def main() -> None:
    roots = [arg for arg in sys.argv[1:] if arg != "--etag"]
    what = "cached page"
    if "--etag" in sys.argv[1:]:
        os.environ["HOT_PAGE_ETAG"] = "1"
        what = "304"
    if not roots:
        sys.stdout.write(f"{asyncio.run(measure()) * 1e6:.2f}\n")
        return
    for root in roots:
        # Each checkout in a process of its own, importing its own `app`.
        env = {**os.environ, "PYTHONPATH": root}
        result = subprocess.run(
            [sys.executable, os.path.abspath(__file__)],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        sys.stdout.write(f"{root}: {result.stdout.strip()} us per {what}\n")


if __name__ == "__main__":
    main()
