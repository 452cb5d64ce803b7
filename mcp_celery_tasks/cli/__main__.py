"""``python -m mcp_celery_tasks.cli``: the ``mcp-celery-tasks`` command."""

from mcp_celery_tasks.cli.commands import main

main()
