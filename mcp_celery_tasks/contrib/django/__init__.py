"""The MCP tasks in Django's admin: add ``"mcp_celery_tasks.contrib.django"`` to ``INSTALLED_APPS``.

The changelist shows the ``mcp_tasks`` rows read-only (``models.Task``, unmanaged: Django never
creates, migrates or writes the table) with two actions, cancel and retry now, that go through
the same store statements as ``mcp-celery-tasks tasks cancel`` (``admin``). Where the database
and the broker are comes from ``MCP_TASKS_*``, as for every other part of the package.
"""
