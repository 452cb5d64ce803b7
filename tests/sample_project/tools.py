"""The MCP tools of the project: an existing task, exposed as it is."""

from __future__ import annotations

from mcp_celery_tasks import tool
from tests.sample_project.tasks import word_stats

tool(description="Count the words of a text (the project's word_stats task).")(word_stats)
