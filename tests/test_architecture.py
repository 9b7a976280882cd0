"""The floors of `app/`, written down as data, and the imports held against them.

A room is a top-level module or package of `app/` (`app/<name>.py` or `app/<name>/`).
`LAYERS` lists them from the top floor down; a room may import only rooms on a floor
below its own, and rooms that share a floor do not import each other. Every import
counts: at module level, inside a function, and under `TYPE_CHECKING`, since each of
them is a dependency someone has to understand.

The other rules of the house are checked here too: no router imports another router,
no file in `app/` is longer than `MAX_FILE_LINES` and no function longer than
`MAX_FUNCTION_LINES`, and the deployment mode (SQLite or PostgreSQL) is decided in one
module (app/backend.py), with how a statement is spelled per dialect in one more
(app/db/dialect.py): everything else is handed a `Backend`."""

import ast
import re
from collections.abc import Iterator
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"

# From the top floor down. Rooms in one tuple share a floor.
LAYERS: list[tuple[str, ...]] = [
    ("__main__",),
    ("cli",),
    ("main", "tail"),
    ("server",),
    ("ops",),  # drain and readiness: read the application state
    ("api", "web"),  # the HTTP edge: routes, dependencies, state, the hot front door
    ("frontends",),  # other clients' protocols (the AI SDK's) over the session log
    ("runner",),
    ("interactions",),
    ("sessions", "feedback"),
    ("tools",),
    ("messages",),
    ("events",),
    ("catalog",),
    ("live",),  # bus, fan-out, streams, page cache
    ("journal",),  # the write model: checkpoints, rendering, tool life cycle, locks
    ("auth",),
    ("db",),
    ("metrics",),
    ("ids",),
    ("errors",),
    ("telemetry",),  # logs and traces: importable from anywhere
    ("schemas", "wire", "settings"),
    ("backend",),  # the deployment mode, decided once
]

# Imports that still run against the floors: (importing room, imported room).
ALLOWED: set[tuple[str, str]] = set()

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 100
# Files and functions still over those lengths.
ALLOWED_LONG_FILES: set[str] = set()
ALLOWED_LONG_FUNCTIONS: set[str] = set()


def floor_of() -> dict[str, int]:
    return {room: depth for depth, rooms in enumerate(LAYERS) for room in rooms}


def python_files() -> Iterator[Path]:
    yield from sorted(APP.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """Every `app.*` module this file imports, with its line."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("app."):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "app":
                for alias in node.names:
                    yield node.lineno, f"app.{alias.name}"
            elif node.module.startswith("app."):
                yield node.lineno, node.module


def room(module: str) -> str:
    return module.split(".")[1]


def room_imports() -> Iterator[tuple[str, int, str, str]]:
    """(file, line, importing room, imported room) for every import across rooms."""
    for path in python_files():
        source = room(module_name(path)) if path.parent != APP else path.stem
        for line, target in imported_modules(path):
            if target == "app.__doc__":
                continue
            imported = room(target)
            if imported != source:
                yield str(path.relative_to(APP.parent)), line, source, imported


def test_every_room_is_on_a_floor() -> None:
    floors = floor_of()
    rooms = {p.stem for p in APP.glob("*.py")} | {
        p.name for p in APP.iterdir() if (p / "__init__.py").exists()
    }
    rooms.discard("__init__")
    assert sorted(rooms - floors.keys()) == [], "rooms missing from LAYERS"


def test_imports_only_go_down() -> None:
    floors = floor_of()
    against = []
    seen = set()
    for where, line, source, imported in room_imports():
        if floors[imported] <= floors[source]:
            seen.add((source, imported))
            if (source, imported) not in ALLOWED:
                against.append(f"{where}:{line}: {source} -> {imported}")
    assert against == [], "imports against the floors:\n" + "\n".join(against)
    assert sorted(ALLOWED - seen) == [], "ALLOWED holds imports that are gone"


def test_no_router_imports_another() -> None:
    routers = {
        module_name(p)
        for p in python_files()
        if re.search(r"^(router = APIRouter\(|def create_router)", p.read_text(), re.M)
    }
    against = [
        f"{module_name(p)}:{line} -> {target}"
        for p in python_files()
        if module_name(p) in routers
        for line, target in imported_modules(p)
        if target in routers and target != module_name(p)
    ]
    assert against == []


def long_functions(path: Path) -> Iterator[tuple[str, int]]:
    """(`file:function`, lines) of each function of this file over the limit."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                yield f"{path.relative_to(APP.parent)}:{node.name}", length


def test_no_file_is_too_long() -> None:
    lengths = {
        str(p.relative_to(APP.parent)): len(p.read_text().splitlines())
        for p in python_files()
    }
    long = {name for name, n in lengths.items() if n > MAX_FILE_LINES}
    assert (
        sorted(f"{name} ({lengths[name]})" for name in long - ALLOWED_LONG_FILES) == []
    )
    assert sorted(ALLOWED_LONG_FILES - long) == [], (
        "ALLOWED_LONG_FILES holds files now short"
    )


def test_no_function_is_too_long() -> None:
    lengths = dict(entry for p in python_files() for entry in long_functions(p))
    assert (
        sorted(
            f"{name} ({lengths[name]})"
            for name in lengths.keys() - ALLOWED_LONG_FUNCTIONS
        )
        == []
    )
    assert sorted(ALLOWED_LONG_FUNCTIONS - lengths.keys()) == [], (
        "ALLOWED_LONG_FUNCTIONS holds functions now short"
    )


# Reading the deployment mode from the URL or the dialect, instead of a `Backend`.
MODE_READS = re.compile(
    r"""startswith\(["'](sqlite|postgres)|dialect\.name|[!=]= ["'](sqlite|postgresql)["']"""
)
MODE_MODULES = {"app/backend.py", "app/db/dialect.py"}


def test_the_deployment_mode_is_decided_in_one_module() -> None:
    found = [
        f"{path.relative_to(APP.parent)}:{number}: {line.strip()}"
        for path in python_files()
        if str(path.relative_to(APP.parent)) not in MODE_MODULES
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if MODE_READS.search(line)
    ]
    assert found == [], "use settings.backend (app/backend.py)"
