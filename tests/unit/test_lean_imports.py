"""The API and worker processes never load Alembic or SQLAlchemy (about 24 MiB per process):
only migration commands do. ``migrate.head_revision`` reads the migration files itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from mcp_celery_tasks.store import migrate
from tests import cliprobe

SCHEMA_ONLY = ("alembic", "sqlalchemy")


API = (
    "import mcp_celery_tasks.api.server, mcp_celery_tasks.api.compose\n"
    "from mcp_celery_tasks.settings import Settings\n"
    "mcp_celery_tasks.api.server.create_server(Settings())"  # reads the head revision
)
WORKER = "import mcp_celery_tasks.worker.celery_glue, mcp_celery_tasks.celery_main"
MIGRATIONS = "import mcp_celery_tasks.store.schema"


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    """What each process's modules had loaded, in one fresh interpreter: the API's, then the
    worker's on top, then the schema's. ``sys.modules`` only grows, so the schema modules are
    seen to bring in SQLAlchemy only if the two before did not."""
    steps = {"api": API, "worker": WORKER, "migrations": MIGRATIONS}
    return dict(zip(steps, cliprobe.loaded_after_each(list(steps.values()), SCHEMA_ONLY), strict=True))


def test_the_api_process_modules_load_neither_alembic_nor_sqlalchemy(loaded: dict[str, list[str]]) -> None:
    assert loaded["api"] == []


def test_the_worker_modules_load_neither_alembic_nor_sqlalchemy(loaded: dict[str, list[str]]) -> None:
    assert loaded["worker"] == []


def test_the_migration_modules_still_have_them(loaded: dict[str, list[str]]) -> None:
    assert loaded["migrations"] == ["sqlalchemy"]


def test_the_head_revision_is_alembics() -> None:
    assert migrate.head_revision() == ScriptDirectory(migrate._scripts()).get_current_head()


def test_revision_literals_are_read_in_either_spelling(tmp_path: Path) -> None:
    path = tmp_path / "0009_x.py"
    path.write_text(
        'revision: str = "0009_x"\n'
        'down_revision: str | tuple[str, ...] | None = ("0008_a", "0008_b")\n'
        "branch_labels = None\n"
        "depends_on = some_call()\n"
    )
    assert migrate._literals(path) == {
        "revision": "0009_x",
        "down_revision": ("0008_a", "0008_b"),
        "branch_labels": None,
    }
