"""The project's Celery app, the usual Django way, then ``install`` adds the MCP jobs.

Its worker is the project's own: ``celery -A tests.sample_django.celery worker``. Django is set
up before the tools load (they import the ORM's models), in the worker and in the API alike;
Celery's Django fixup (on, since ``DJANGO_SETTINGS_MODULE`` is set) closes stale database
connections around every task, MCP jobs included, and after each prefork child's fork.
"""

from __future__ import annotations

import os

import django
from celery import Celery

from mcp_celery_tasks.worker import install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.sample_django.settings")
django.setup()

app = Celery("sample_django", set_as_current=False)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

install(app, tools=["tests.sample_django.shop.tools"])
