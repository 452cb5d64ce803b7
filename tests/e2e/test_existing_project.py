"""Add MCP to an existing Celery project: the team's own app, worker command and task.

The project (tests/sample_project) keeps its configuration (compression, its exchange, queue
names and routes, a result backend, a signal handler). Its own ``celery -A … worker`` runs the
MCP jobs beside its other tasks; the API publishes through the same app (MCP_TASKS_CELERY_APP);
its existing ``word_stats`` task is called both from Python and as an MCP tool.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import support
from tests.support import ROOT, Client, Proc, start_api, wait_until

BROKERS = {
    "redis": (support.REDIS_URL, support.REDIS_URL),
    "rabbitmq": (support.AMQP_URL, "rpc://"),
}


@pytest.fixture(params=sorted(BROKERS))
def project(request: pytest.FixtureRequest, template_db: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    broker, backend = BROKERS[request.param]
    if request.param == "rabbitmq" and not support.rabbitmq_reachable():
        pytest.skip("no RabbitMQ on this machine")
    name = f"mcpt_sample_{request.param}_{os.getpid()}"
    database_url = support.create_database(name, template=template_db)
    prefix = f"sample{support.free_port()}"
    signal_log = tmp_path / "signals.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "SAMPLE_"))}
    env.update(
        SAMPLE_BROKER_URL=broker,
        SAMPLE_RESULT_BACKEND=backend,
        SAMPLE_QUEUE_PREFIX=prefix,
        SAMPLE_SIGNAL_LOG=str(signal_log),
        MCP_TASKS_DATABASE_URL=database_url,
        MCP_TASKS_CELERY_APP="tests.sample_project.celeryapp:app",
        MCP_TASKS_MAINTENANCE_QUEUE=f"{prefix}.maintenance",
        PYTHONUNBUFFERED="1",
    )
    log = support.log_path(f"sample-{request.param}-worker")
    # The team's own worker command, consuming its own queue and the one it routes MCP jobs to.
    worker = Proc(
        "sample-worker",
        subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.sample_project.celeryapp", "worker",
             "-P", "prefork", "-c", "2", "-Q", f"{prefix}.default,{prefix}.mcp",
             "-n", f"{prefix}@localhost", "--loglevel", "info"],
            env=env, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        ),
        log,
    )  # fmt: skip
    api: Proc | None = None
    try:
        api, url = start_api(f"sample-{request.param}-api", env)
        yield {"url": url, "env": env, "signal_log": signal_log, "prefix": prefix, "worker": worker}
    finally:
        if api is not None:
            api.stop()
        worker.stop(signal.SIGQUIT, timeout=20)
        support.drop_database(name)


def _in_project(env: dict[str, str], code: str) -> Any:
    """Run ``code`` in the project's Python (its app, its result backend); returns its JSON output."""
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(180)
def test_an_existing_task_runs_as_an_mcp_tool_and_from_python(project: dict[str, Any]) -> None:
    client = Client(project["url"])
    try:
        listed = client.request("tools/list").result["tools"]
        assert [tool["name"] for tool in listed] == ["word_stats"]  # nothing else is served
        schema = listed[0]["inputSchema"]
        assert schema["required"] == ["text"] and schema["properties"]["top"]["default"] == 3

        task_id = wait_until(
            lambda: client.call_tool("word_stats", {"text": "a b a c a b", "top": 2}).body.get("result"),
            60,
            0.5,
            what="the API to accept a call",
        )["taskId"]
        final = client.wait_status(task_id, timeout=60)
        assert final["status"] == "completed", final
        assert final["result"]["structuredContent"] == {
            "words": 6,
            "top": [["a", 3], ["b", 2]],
            "as_mcp_tool": True,
        }
    finally:
        client.close()

    # The same task, called the project's usual way (its serializer, its result backend).
    direct = _in_project(
        project["env"],
        "import json; from tests.sample_project.tasks import word_stats; "
        "print(json.dumps(word_stats.delay('x y x').get(timeout=60)))",
    )
    assert direct == {"words": 3, "top": [["x", 2], ["y", 1]], "as_mcp_tool": False}

    # The team's signal handler saw both: MCP jobs run through their worker like any task.
    seen = project["signal_log"].read_text().split()
    assert "mcp_celery_tasks.run_tool" in seen and "tests.sample_project.tasks.word_stats" in seen


def test_mcp_jobs_follow_the_projects_routes(project: dict[str, Any]) -> None:
    client = Client(project["url"])
    try:
        task_id = client.start("word_stats", {"text": "one"})
        client.wait_status(task_id, timeout=60)
    finally:
        client.close()
    with contextlib.closing(psycopg.connect(project["env"]["MCP_TASKS_DATABASE_URL"])) as conn:
        found = conn.execute("SELECT queue FROM mcp_tasks WHERE task_id = %s", (task_id,)).fetchone()
    assert found is not None
    (queue,) = found
    assert queue == f"{project['prefix']}.mcp"


@pytest.mark.timeout(120)
def test_a_projects_worker_holding_the_apis_secrets_warns_once_naming_them(
    template_db: str, tmp_path: Path
) -> None:
    # Red team N10: `celery -A proj worker` kept AUTH_TOKENS and SECRET_KEYS in /proc/*/environ
    # of the worker and its children, silently (`mcp-celery-tasks worker` drops them itself).
    name = f"mcpt_sample_secrets_{os.getpid()}"
    database_url = support.create_database(name, template=template_db)
    prefix = f"sample{support.free_port()}"
    keys = tmp_path / "keys"
    keys.write_text(support.TEST_SECRET_KEY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "SAMPLE_"))}
    env.update(
        SAMPLE_BROKER_URL=support.REDIS_URL,
        SAMPLE_QUEUE_PREFIX=prefix,
        MCP_TASKS_DATABASE_URL=database_url,
        MCP_TASKS_MAINTENANCE_QUEUE=f"{prefix}.maintenance",
        MCP_TASKS_AUTH_TOKENS='{"alice": "alice-token-value"}',
        MCP_TASKS_SECRET_KEYS_FILE=str(keys),
        PYTHONUNBUFFERED="1",
    )
    log = support.log_path("sample-secrets-worker")
    worker = Proc(
        "sample-secrets-worker",
        subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.sample_project.celeryapp", "worker",
             "-P", "prefork", "-c", "2", "-Q", f"{prefix}.mcp", "-n", f"{prefix}@localhost",
             "--loglevel", "info"],
            env=env, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        ),
        log,
    )  # fmt: skip
    try:
        wait_until(lambda: "ready." in log.read_text(), 60, 0.2, what="the project's worker to start")
        text = log.read_text()
    finally:
        worker.stop(signal.SIGQUIT, timeout=20)
        support.drop_database(name)
    warnings = [line for line in text.splitlines() if "only the API uses" in line]
    assert len(warnings) == 1, text[-3000:]
    assert "MCP_TASKS_AUTH_TOKENS, MCP_TASKS_SECRET_KEYS_FILE" in warnings[0]
    assert "env -u MCP_TASKS_AUTH_TOKENS -u MCP_TASKS_SECRET_KEYS_FILE" in warnings[0]
    assert "alice-token-value" not in text and support.TEST_SECRET_KEY not in text
