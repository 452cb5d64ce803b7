"""The sample project's Django settings: its database and broker from the test's variables."""

from __future__ import annotations

import os
from urllib.parse import parse_qs, unquote, urlsplit

_db = urlsplit(os.environ.get("SAMPLE_DJANGO_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/sample"))
_prefix = os.environ.get("SAMPLE_QUEUE_PREFIX", "shop")

SECRET_KEY = "sample-django-not-a-secret"  # a test project's, public on purpose
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
ROOT_URLCONF = "tests.sample_django.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "tests.sample_django.shop",
    "mcp_celery_tasks.contrib.django",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.path.lstrip("/"),
        "USER": unquote(_db.username or ""),
        "PASSWORD": unquote(_db.password or ""),
        # A ``?host=/socket/dir`` query (the tests' embedded Postgres) is a Unix socket's folder.
        "HOST": parse_qs(_db.query).get("host", [_db.hostname or ""])[0],
        "PORT": str(_db.port or ""),
        # Celery's Django fixup closes connections older than this around each task.
        "CONN_MAX_AGE": 60,
    }
}

# The project's Celery configuration (``config_from_object(..., namespace="CELERY")``).
CELERY_BROKER_URL = os.environ.get("SAMPLE_BROKER_URL", "redis://127.0.0.1:6379/13")
CELERY_RESULT_BACKEND = os.environ.get("SAMPLE_RESULT_BACKEND")
CELERY_TASK_DEFAULT_QUEUE = f"{_prefix}.default"
CELERY_TASK_ROUTES = {"mcp_celery_tasks.run_tool": {"queue": f"{_prefix}.mcp"}}
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
