FROM python:3.12-slim
# The package is built from /src and installed as a wheel; only the tool code stays on PYTHONPATH.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY mcp_celery_tasks ./mcp_celery_tasks
COPY migrations ./migrations
# The examples extra: what the example tools import (numpy, google-re2). Add your tools' own
# dependencies here.
RUN pip install --no-cache-dir ".[examples]" flower && rm -rf /src
# The team's tool code: workers/ holds the examples; replace it with your own package and name
# that in MCP_TASKS_TOOL_MODULES (docker-compose.yml).
WORKDIR /app
COPY workers ./workers
ENV PYTHONPATH=/app
# /srv/mcp/models belongs to mcp so that a fresh named volume mounted there is writable; the uid is
# fixed (1000) for Kubernetes' runAsUser (deploy/k8s: runAsNonRoot needs a numeric user).
RUN useradd --uid 1000 --create-home mcp && install -d -o mcp -g mcp /srv/mcp/files /srv/mcp/models
USER mcp
ENTRYPOINT ["mcp-celery-tasks"]
