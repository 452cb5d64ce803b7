"""Alembic migrations; shipped in the wheel as ``mcp_celery_tasks._migrations``."""
