FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY mcp_celery_tasks ./mcp_celery_tasks
COPY migrations ./migrations
COPY workers ./workers
RUN pip install --no-cache-dir -e . flower
RUN useradd --create-home mcp
USER mcp
ENTRYPOINT ["mcp-celery-tasks"]
