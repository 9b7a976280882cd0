"""The README's first conversation, run as written: its shell block against a live
server process (only the address changed), so the front page cannot drift from what
the service does."""

import asyncio
import re
import subprocess

from tests.support.lanes import ROOT
from tests.support.servers import Server, live_server_fixture

live_server = live_server_fixture("readme")


def shell_blocks(markdown: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", markdown, flags=re.DOTALL)


def test_the_readme_has_one_conversation_block() -> None:
    blocks = [b for b in shell_blocks((ROOT / "README.md").read_text()) if "curl" in b]
    assert len(blocks) == 1, blocks


async def test_the_readme_conversation_runs_as_written(live_server: Server) -> None:
    (block,) = [
        b for b in shell_blocks((ROOT / "README.md").read_text()) if "curl" in b
    ]
    address = live_server.url.removeprefix("http://")
    script = block.replace("localhost:8000", address)
    assert script != block, "the block no longer talks to localhost:8000"
    ran = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    # The POST's answer, then the page it lists: the message was stored as sent.
    assert '"delivery":"started"' in ran.stdout, ran.stdout
    assert '"text":"hello there"' in ran.stdout, ran.stdout
