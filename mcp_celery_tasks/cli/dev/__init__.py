"""``mcp-celery-tasks dev``: a whole deployment as child processes of one command, with embedded
Postgres and Redis when no servers are given."""
