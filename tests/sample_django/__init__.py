"""A Django project with Celery, MCP added the Django way (tests/e2e/test_django.py).

``settings`` is an ordinary Django settings module (its database and broker from the variables
the test sets); ``celery`` is the project's Celery app, configured from Django's settings, which
``install`` makes run MCP jobs; ``shop`` is the project's app, whose ``Order`` model the tools in
``tools`` use through the ORM; ``mcp_celery_tasks.contrib.django`` shows the tasks in the admin.
"""
