"""Machine facts, the per-database table and the JSON document."""

import math
import platform
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.rows import Line, Profile
from bench.servers import Pinning, git_revision


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def wrk_version() -> str:
    path = shutil.which("wrk")
    if path is None:
        return "missing"
    result = subprocess.run(
        [path, "--version"], capture_output=True, text=True, timeout=10, check=False
    )
    first = (result.stdout or result.stderr).strip().splitlines()
    return first[0].split(" [")[0] if first else "unknown"


def machine(
    pinning: Pinning, app_root: Path, app_file: str, profile: Profile
) -> dict[str, Any]:
    import os

    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "pinning": pinning.describe(),
        "app_root": str(app_root),
        "app_module": app_file,
        "app_revision": git_revision(app_root),
        "wrk": wrk_version(),
        "mode": "smoke" if profile.smoke else "full",
        "runs": profile.runs,
        "duration_s": profile.duration,
    }


def header(facts: dict[str, Any]) -> str:
    return (
        f"evermirror bench, {facts['date']}: {facts['cpu']}, {facts['cores']} cores, "
        f"Python {facts['python']}, pinning {facts['pinning']}; "
        f"app {facts['app_root']} @ {facts['app_revision']}; {facts['wrk']}; "
        f"{facts['mode']} run, median of {facts['runs']}, {facts['duration_s']:g} s per wrk measurement"
    )


def number(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):
        return "—"
    if unit in ("req/s", "/s") or abs(value) >= 1000:
        return f"{value:,.0f}"
    if unit == "":
        return f"{value:,.0f}"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"


def cells(line: Line) -> list[str]:
    name = f"{line.row}: {line.label}" if line.label else line.row
    if line.note:
        return [name, line.note, "", "", "", ""]
    ratio = "—" if line.ratio is None or math.isnan(line.ratio) else f"{line.ratio:.2f}"
    met = "—" if line.met is None else ("yes" if line.met else "no")
    return [
        name,
        number(line.service, line.unit),
        number(line.baseline, line.unit),
        ratio,
        line.goal,
        met,
    ]


def table(database: str, lines: list[Line]) -> str:
    head = ["row", "service", "baseline", "ratio", "goal", "met?"]
    rows = [head, *(cells(line) for line in lines)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]

    def render(row: list[str]) -> str:
        return (
            "| "
            + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
            + " |"
        )

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join(
        [f"## {database}", "", render(head), rule, *(render(r) for r in rows[1:])]
    )
