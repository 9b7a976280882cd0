"""Apply the Alembic chain programmatically (CLI `migrate`, start-up auto-migration, tests,
`/ready`).

There is one copy of the migrations: the repository's top-level `migrations/`. The wheel
build maps it into the package as `app/migrations/` (pyproject's `force-include`), so an
installed `evermirror` finds it inside the package, from any working directory, and a
source checkout (editable install, or `PYTHONPATH`) finds the repository's. Alembic is
configured here, not from `alembic.ini`, which stays for developers running `alembic`
in the repository (`alembic revision --autogenerate`, `alembic upgrade head`).
"""

from functools import lru_cache
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


@lru_cache
def script_location() -> Path:
    """The migrations folder: the installed package's, else the source checkout's."""
    package = Path(str(resources.files("app")))
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError(
        f"no migrations found in {package} or beside it: a broken installation "
        "(the wheel carries them as app/migrations)"
    )


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    config.set_main_option("path_separator", "os")
    config.attributes["url"] = url
    return config


@lru_cache
def head_revisions() -> frozenset[str]:
    """The chain's head(s), read from the migration scripts once per process."""
    script = ScriptDirectory.from_config(alembic_config("sqlite+aiosqlite://"))
    return frozenset(script.get_heads())


def upgrade(url: str, revision: str = "head") -> None:
    """Blocking: call it before the event loop starts or from a worker thread."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


async def applied_revisions(conn: AsyncConnection) -> set[str]:
    """The revisions the database is at (`alembic_version`); raises if the table is
    missing (the database was never migrated)."""
    rows = await conn.execute(text("SELECT version_num FROM alembic_version"))
    return {str(version) for version in rows.scalars()}
