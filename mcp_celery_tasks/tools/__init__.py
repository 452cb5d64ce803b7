"""The tool author's kit: ``@tool`` and its registry, ``TaskContext``, input requests, the file roots
and the result conversion. ``mcp_celery_tasks`` re-exports the public names."""
