"""docker-compose.yml is valid and says what production needs (no Docker engine needed)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from tests.support import ROOT

SECRETS = {
    "POSTGRES_PASSWORD": "p",
    "RABBITMQ_PASSWORD": "r",
    "MCP_TASKS_TOKEN": "t",
    "MCP_TASKS_SECRET_KEY": "k",
}


def _compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker-compose"):
        command = ["docker-compose", *args]
    elif (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        command = ["docker", "compose", *args]
    elif os.environ.get("CI") == "true":
        pytest.fail("CI needs docker compose (or docker-compose) to validate docker-compose.yml")
    else:
        pytest.skip("neither docker compose nor docker-compose is installed")
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run(command, cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=60)


def test_compose_file_is_valid_with_its_secrets_set() -> None:
    result = _compose("-f", "docker-compose.yml", "config", env=SECRETS)
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    services = config["services"]
    expected = {
        "postgres",
        "rabbitmq",
        "redis",
        "migrate",
        "api",
        "worker",
        "worker-gpu",
        "maintenance",
        "beat",
        "flower",
    }
    assert expected <= set(services)
    for name in ("worker", "worker-gpu", "maintenance"):
        service = services[name]
        assert service["environment"]["REMAP_SIGTERM"] == "SIGQUIT"
        assert "healthcheck" in service
        grace = int(str(service["stop_grace_period"]).rstrip("s"))
        assert float(service["environment"]["MCP_TASKS_WORKER_SOFT_SHUTDOWN_SECONDS"]) < grace
    assert (
        "token" in services["api"]["environment"]["MCP_TASKS_AUTH_TOKENS"]
        or "default" in (services["api"]["environment"]["MCP_TASKS_AUTH_TOKENS"])
    )
    assert services["migrate"]["command"] == ["migrate"]
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "-Q" in services["worker-gpu"]["command"] and "gpu" in services["worker-gpu"]["command"]


def test_compose_file_refuses_to_start_without_its_secrets() -> None:
    result = _compose("-f", "docker-compose.yml", "config", "-q", env={})
    assert result.returncode != 0
    assert "POSTGRES_PASSWORD" in result.stderr or "set " in result.stderr


def test_grafana_dashboard_queries_only_metrics_the_code_defines() -> None:
    import json
    import re

    from mcp_celery_tasks import metrics

    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "mcp-celery-tasks.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {
        re.sub(r"_(total|bucket|count|sum)$", "", name)
        for e in exprs
        for name in re.findall(r"mcp_[a-z_]+", e)
    }
    defined = {
        collector._name  # type: ignore[attr-defined]
        for collector in vars(metrics).values()
        if hasattr(collector, "_name") and str(getattr(collector, "_name", "")).startswith("mcp_")
    }
    assert used and used <= defined, used - defined
