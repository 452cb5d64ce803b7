"""A team's existing Celery project, with MCP added in a few lines (tests/e2e/test_existing_project.py).

Its own app and configuration (gzip-compressed messages, its own exchange, queue names and
routes, a result backend, a signal handler); ``tasks.word_stats`` is an ordinary ``@app.task``
that ``tools`` exposes as an MCP tool without rewriting it.
"""
