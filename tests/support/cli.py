"""The service's command line (`python -m app ...`) as a test runs it."""

import asyncio
import os
import re
import subprocess
import sys

from tests.support.lanes import ROOT

KEY_PATTERN = re.compile(r"evm_[0-9a-f]{64}")


async def run_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m app <args>` on `database_url`, with its stdout and stderr."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def create_cli_key(database_url: str, org: str, name: str | None = None) -> str:
    """`keys create`: stdout is exactly the new key, which stderr never shows."""
    extra = ["--name", name] if name else []
    result = await run_cli(database_url, "keys", "create", "--org", org, *extra)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, f"stdout must hold exactly the key: {result.stdout!r}"
    key = lines[0]
    assert KEY_PATTERN.fullmatch(key), key
    assert key not in result.stderr
    return key
