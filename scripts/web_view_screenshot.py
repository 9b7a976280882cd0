"""The README's screenshot of the web view (docs/web-view.png): a scratch server on a
temporary SQLite file, one session through the scripted scenarios, its chat page in
headless Chromium.

    .venv/bin/python scripts/web_view_screenshot.py [--output docs/web-view.png]
        [--chromium /usr/bin/chromium]

Needs the playwright package and a Chromium (Debian: apt-get install chromium).
"""

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.async_api import Page, async_playwright

ROOT = Path(__file__).resolve().parents[1]
TURNS = [
    "Plan a day in Lisbon, please.",
    "/scenario reasoning",
    "/scenario tool weather in Lisbon",
    "/scenario citations",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite+aiosqlite:///{directory / 'shot.db'}",
        "SCRIPTED_DELAY_MS": "5",
        "LOG_LEVEL": "warning",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("the server did not start")


async def converse(page: Page) -> None:
    for count, text in enumerate(TURNS, start=1):
        await page.fill("#text", text)
        await page.press("#text", "Enter")
        await page.wait_for_function(
            "(n) => document.querySelectorAll('#list > .message').length >= n"
            " && !document.querySelector('#list > .message[data-state=\"streaming\"]')",
            arg=2 * count,
        )


async def shoot(url: str, output: Path, chromium: str) -> None:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=chromium)
        page = await browser.new_page(viewport={"width": 1000, "height": 820})
        await page.goto(f"{url}/sessions")
        await page.fill("#new-title", "Trip planning")
        await page.click("#create button")
        await page.wait_for_selector('#status[data-status="live"]')
        await converse(page)
        await page.locator("details.reasoning").first.evaluate("(d) => d.open = true")
        await page.fill("#text", "Thanks! What should I see first?")
        await page.evaluate(
            "() => { const b = document.querySelector('#messages');"
            " b.scrollTop = b.scrollHeight }"
        )
        await page.screenshot(path=str(output))
        await browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/web_view_screenshot.py")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "web-view.png")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        process, url = serve(Path(directory))
        try:
            asyncio.run(shoot(url, args.output, args.chromium))
        finally:
            process.terminate()
            process.wait(10)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
