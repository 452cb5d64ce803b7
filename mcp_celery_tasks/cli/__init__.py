"""The command line: ``commands`` is its composition root (``python -m mcp_celery_tasks.cli`` runs it);
``admin/`` holds the operator's ``tasks`` commands, ``dev/`` the one-command development stack."""
