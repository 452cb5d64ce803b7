"""The API and worker processes never load Alembic or SQLAlchemy (about 24 MiB per process):
only migration commands do. ``migrate.head_revision`` reads the migration files itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from alembic.script import ScriptDirectory

from mcp_celery_tasks.store import migrate

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_ONLY = ("alembic", "sqlalchemy")


def _loaded_after(statement: str) -> list[str]:
    probe = (
        "import json, sys\n"
        f"{statement}\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({SCHEMA_ONLY!r}))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def test_the_api_process_modules_load_neither_alembic_nor_sqlalchemy() -> None:
    statement = (
        "import mcp_celery_tasks.api.server, mcp_celery_tasks.api.compose\n"
        "from mcp_celery_tasks.settings import Settings\n"
        "mcp_celery_tasks.api.server.create_server(Settings())"  # reads the head revision
    )
    assert _loaded_after(statement) == []


def test_the_worker_modules_load_neither_alembic_nor_sqlalchemy() -> None:
    assert _loaded_after("import mcp_celery_tasks.worker.celery_glue, mcp_celery_tasks.celery_main") == []


def test_the_migration_modules_still_have_them() -> None:
    assert _loaded_after("import mcp_celery_tasks.store.schema") == ["sqlalchemy"]


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
