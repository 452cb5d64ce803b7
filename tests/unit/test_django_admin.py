"""The Django admin app (``mcp_celery_tasks.contrib.django``) without a server: its admin is
read-only, offers exactly two actions, and reports an unusable database as one error message.

Django is configured in a fresh interpreter (its settings are process-wide), on SQLite: nothing
here reaches the ``mcp_tasks`` table (tests/e2e/test_django.py does, on Postgres and a broker).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import ROOT, free_port

pytest.importorskip("django")

PROBE = """
import json
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                    "django.contrib.sessions", "django.contrib.messages",
                    "mcp_celery_tasks.contrib.django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
)
django.setup()
from django.contrib import admin
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory
from mcp_celery_tasks.contrib.django.models import Task

model_admin = admin.site._registry[Task]
request = RequestFactory().get("/admin/mcp_tasks/task/")
request.user = AnonymousUser()
shown = []
model_admin.message_user = lambda request, text, level: shown.append([text, level])


class Selected:
    def values_list(self, *fields, flat=False):
        return ["task-1", "task-2"]

    def filter(self, **lookups):
        return self

    def count(self):
        return 2


model_admin.cancel_tasks(request, Selected())
model_admin.retry_now(request, Selected())
refused = []
for write in (Task(task_id="t").save, Task(task_id="t").delete):
    try:
        write()
    except TypeError as exc:
        refused.append(str(exc))
print(json.dumps({
    "managed": Task._meta.managed,
    "table": Task._meta.db_table,
    "add": model_admin.has_add_permission(request),
    "change": model_admin.has_change_permission(request),
    "delete": model_admin.has_delete_permission(request),
    "actions": sorted(model_admin.actions),
    "readonly": sorted(model_admin.get_readonly_fields(request)),
    "fields": sorted(field.name for field in Task._meta.get_fields()),
    "shown": shown,
    "refused": refused,
}))
"""


def test_the_admin_is_read_only_and_an_unusable_database_is_one_error_message() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "DJANGO_"))}
    env["MCP_TASKS_DATABASE_URL"] = f"postgresql://nobody:hunter2@127.0.0.1:{free_port()}/none"
    env["MCP_TASKS_DB_CONNECT_TIMEOUT_SECONDS"] = "2"
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["managed"] is False and seen["table"] == "mcp_tasks"
    assert (seen["add"], seen["change"], seen["delete"]) == (False, False, False)
    assert seen["actions"] == ["cancel_tasks", "retry_now"]
    assert seen["readonly"] == seen["fields"] and "task_id" in seen["fields"] and "retry_at" in seen["fields"]
    error = 40  # django.contrib.messages.ERROR
    assert seen["shown"] == [
        ["Stopped: the MCP tasks database cannot be used (the server log says why).", error],
        ["Nothing was retried: the MCP tasks database cannot be used (the server log says why).", error],
    ]
    assert "hunter2" not in done.stdout  # the URL's password is never shown to the admin's user
    assert len(seen["refused"]) == 2 and all("read-only" in text for text in seen["refused"])
