"""``mcp-celery-tasks tasks ...``: what an operator needs, straight from Postgres."""
