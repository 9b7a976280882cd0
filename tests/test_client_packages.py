"""Both clients as a user gets them: the Python client's wheel (`pip wheel`) and the
JavaScript client's tarball (`npm pack`), each checked for its licence, types and
README, installed into a scratch project outside the repository, and run through the
same scenario (tests/packaged/) against a real server. Marked `network`: the wheel's
build and its dependencies come from the package index."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.servers import Server

ROOT = Path(__file__).resolve().parents[1]
PACKAGED = ROOT / "tests" / "packaged"
LICENSE = (ROOT / "LICENSE").read_bytes()

pytestmark = pytest.mark.network


def run(command: list[str], cwd: Path, timeout: float = 300, **env: str) -> str:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NODE_PATH")
    }
    result = subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean, **env},
        check=False,
    )
    assert result.returncode == 0, (
        command,
        result.stdout[-3000:],
        result.stderr[-3000:],
    )
    return result.stdout


def test_the_python_client_wheel_installs_and_runs_the_scenario(
    server: Server, tmp_path: Path
) -> None:
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            "dist",
            str(ROOT / "clients" / "python"),
        ],
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("evermirror_client-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: MIT" in metadata.splitlines()
    assert zipfile.ZipFile(wheel).read(f"{info}/licenses/LICENSE") == LICENSE
    assert "evermirror_client/py.typed" in names
    # The README is the package's description, install line included.
    assert "pip install" in metadata
    # Outside the repository, in a venv of its own: only the wheel and its dependencies.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = str(venv / "bin" / "python")
    run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(wheel),
        ],
        cwd=tmp_path,
        timeout=600,
    )
    where = run(
        [python, "-c", "import evermirror_client; print(evermirror_client.__file__)"],
        cwd=tmp_path,
    )
    assert where.startswith(str(venv)), where
    out = run(
        [python, str(PACKAGED / "scenario.py"), server.url], cwd=tmp_path, timeout=120
    )
    assert out.strip().splitlines()[-1] == "ok", out


def test_the_js_client_tarball_installs_and_runs_the_scenario(
    server: Server, tmp_path: Path
) -> None:
    npm, node = shutil.which("npm"), shutil.which("node")
    assert npm, "the JavaScript client's package test needs npm on PATH"
    assert node, "the JavaScript client's package test needs Node.js on PATH"
    packed = run(
        [npm, "pack", "--json", "--pack-destination", str(tmp_path)],
        cwd=ROOT / "clients" / "js",
    )
    (tarball,) = [tmp_path / entry["filename"] for entry in json.loads(packed)]
    with tarfile.open(tarball) as archive:
        files = {name.removeprefix("package/") for name in archive.getnames()}
        license_text = archive.extractfile("package/LICENSE")
        assert license_text is not None
        assert license_text.read() == LICENSE
        manifest = json.load(archive.extractfile("package/package.json"))  # type: ignore[arg-type]
    assert {
        "LICENSE",
        "README.md",
        "package.json",
        "src/index.js",
        "src/index.d.ts",
    } <= files
    assert manifest["license"] == "MIT"
    assert manifest["types"] == "./src/index.d.ts"
    assert "npm install" in (ROOT / "clients" / "js" / "README.md").read_text()
    project = tmp_path / "project"
    project.mkdir()
    (project / "package.json").write_text(
        '{"name": "scratch", "private": true, "type": "module"}'
    )
    run(
        [npm, "install", "--no-audit", "--no-fund", "--offline", str(tarball)],
        cwd=project,
    )
    shutil.copy(PACKAGED / "scenario.mjs", project / "scenario.mjs")
    out = run([node, "scenario.mjs", server.url], cwd=project, timeout=120)
    assert out.strip().splitlines()[-1] == "ok", out
