"""A module-level Celery app for Celery's own tools: ``celery -A mcp_celery_tasks.celery_main
inspect active``, Flower, ``celery events``. Built from ``MCP_TASKS_*`` like every process."""

from mcp_celery_tasks.broker.celery_app import create_app
from mcp_celery_tasks.settings import get_settings

app = create_app(get_settings())
