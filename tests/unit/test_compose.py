"""docker-compose.yml is valid and safe to copy: secrets reach containers only as files, only
the API gets its own secrets, nothing is published beyond loopback (no Docker engine needed)."""

from __future__ import annotations

import base64
import json
import os
import re
import runpy
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from mcp_celery_tasks.protocol.sealing import Sealer
from mcp_celery_tasks.settings import API_ONLY_SECRETS, Settings
from tests.support import ROOT

SERVICES = {
    "postgres",
    "rabbitmq",
    "migrate",
    "api",
    "worker",
    "worker-gpu",
    "maintenance",
    "beat",
    "flower",
    "prometheus",
    "grafana",
}
WORKERS = ("worker", "worker-gpu", "maintenance")
TOOL_WORKERS = ("worker", "worker-gpu")
SECRET_NAME = re.compile(r"(^|_)(PASS|PASSWORD|SECRET|SECRETS|TOKEN|TOKENS|KEY|KEYS|BASIC_AUTH)(_|$)")
INTERPOLATION = re.compile(r"(?<!\$)\$(?:\{([A-Za-z_]\w*)|([A-Za-z_]\w*))")
URL_CREDENTIALS = re.compile(r"://[^/@\s]*:[^/@\s]*@")


def _compose(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker-compose"):
        command = ["docker-compose"]
    elif (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        command = ["docker", "compose"]
    elif os.environ.get("CI") == "true":
        pytest.fail("CI needs docker compose (or docker-compose) to validate docker-compose.yml")
    else:
        pytest.skip("neither docker compose nor docker-compose is installed")
    # The defaults of the file, not whatever this machine's .env or environment holds.
    env = {k: v for k, v in os.environ.items() if k not in _interpolated()}
    with tempfile.TemporaryDirectory() as empty:
        (Path(empty) / ".env").touch()
        return subprocess.run(
            [*command, "--env-file", str(Path(empty) / ".env"), "-f", "docker-compose.yml", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    result = _compose("config")
    assert result.returncode == 0, result.stderr
    parsed: dict[str, Any] = yaml.safe_load(result.stdout)
    return parsed


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


def _raw() -> Any:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _interpolated() -> set[str]:
    return {a or b for text in _strings(_raw()) for a, b in INTERPOLATION.findall(text)}


def _host_ip(port: str | dict[str, Any]) -> str:
    """The address a ports entry binds on the host ("" when every interface)."""
    if isinstance(port, dict):  # docker compose v2: the long form
        return str(port.get("host_ip", ""))
    parts = str(port).rsplit("/", 1)[0].split(":")  # docker-compose v1: [ip:]host:container
    return parts[0] if len(parts) == 3 else ""


def _mounted_secrets(service: dict[str, Any]) -> dict[str, str]:
    """Path in the container → secret name, for every secret the service mounts."""
    mounted = {}
    for entry in service.get("secrets", []):
        source = entry if isinstance(entry, str) else entry["source"]
        target = (None if isinstance(entry, str) else entry.get("target")) or source
        path = target if target.startswith("/") else f"/run/secrets/{target}"
        mounted[path] = source
    return mounted


def _volumes(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Path in the container → (source, read-only), for every volume the service mounts."""
    volumes = {}
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):  # docker compose v2: the long form
            volumes[entry["target"]] = (str(entry["source"]), bool(entry.get("read_only")))
        else:  # docker-compose v1: source:target[:mode]
            source, target, *mode = str(entry).split(":")
            volumes[target] = (source, mode == ["ro"])
    return volumes


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def test_compose_file_is_valid_and_keeps_what_production_needs(config: dict[str, Any]) -> None:
    services = config["services"]
    assert set(services) == SERVICES  # nothing started that nothing uses (no Redis beside RabbitMQ)
    for name in WORKERS:
        service = services[name]
        assert _environment(service)["REMAP_SIGTERM"] == "SIGQUIT"
        assert "healthcheck" in service
        grace = int(str(service["stop_grace_period"]).rstrip("s"))
        assert float(_environment(service)["MCP_TASKS_WORKER_SOFT_SHUTDOWN_SECONDS"]) < grace
    assert services["migrate"]["command"] == ["migrate", "--roles"]
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "-Q" in services["worker-gpu"]["command"] and "gpu" in services["worker-gpu"]["command"]
    assert "mcp.maintenance" in services["maintenance"]["command"]
    assert sum(1 for s in services.values() if (s.get("command") or [None])[0] == "beat") == 1


def test_tools_are_configured_for_the_api_and_tool_workers_only(config: dict[str, Any]) -> None:
    services = config["services"]
    for name in ("api", *TOOL_WORKERS):
        env = _environment(services[name])
        assert json.loads(env["MCP_TASKS_TOOL_MODULES"]) == ["workers"]
        volumes = _volumes(services[name])
        assert volumes[env["MCP_EXAMPLES_FILES_ROOT"]][1]  # read-only
        assert volumes[env["MCP_EXAMPLES_MODELS_DIR"]][1] == (name == "api")  # only workers write
    for name in ("migrate", "maintenance", "beat", "flower"):
        assert "MCP_TASKS_TOOL_MODULES" not in _environment(services[name])


def test_nothing_is_published_beyond_loopback(config: dict[str, Any]) -> None:
    published = {name: s["ports"] for name, s in config["services"].items() if s.get("ports")}
    assert set(published) == {"api", "flower", "prometheus", "grafana"}  # no worker metrics port
    for name, ports in published.items():
        assert [_host_ip(port) for port in ports] == ["127.0.0.1"] * len(ports), name


def test_no_secret_reaches_a_container_environment(config: dict[str, Any]) -> None:
    for name, service in config["services"].items():
        for variable, value in _environment(service).items():
            if SECRET_NAME.search(variable):
                assert variable.endswith("_FILE"), f"{name}: {variable} holds a secret value"
            assert not URL_CREDENTIALS.search(value), f"{name}: {variable} holds a URL with a password"
    interpolated = _interpolated()
    assert not {v for v in interpolated if SECRET_NAME.search(v)}, "secrets come from files, not .env"
    raw_urls = [text for text in _strings(_raw()) if "://" in text and INTERPOLATION.search(text)]
    assert not raw_urls


def test_every_file_variable_names_a_secret_its_service_mounts(config: dict[str, Any]) -> None:
    secrets_dir = (ROOT / "secrets").resolve()
    for secret in config["secrets"].values():
        assert Path(secret["file"]).resolve().parent == secrets_dir
    for name, service in config["services"].items():
        mounted = _mounted_secrets(service)
        assert set(mounted.values()) <= set(config["secrets"]), name
        for variable, value in _environment(service).items():
            if variable.endswith("_FILE"):
                assert value in mounted, f"{name}: {variable}={value} is not a secret it mounts"


def test_only_the_api_gets_the_sealing_keys_and_the_tokens(config: dict[str, Any]) -> None:
    services = config["services"]
    api_env = _environment(services["api"])
    api_mounted = _mounted_secrets(services["api"])
    keys = api_mounted[api_env["MCP_TASKS_SECRET_KEYS_FILE"]]
    tokens = api_mounted[api_env["MCP_TASKS_AUTH_TOKENS_FILE"]]  # auth is on
    only_api = {f"MCP_TASKS_{name.upper()}" for name in API_ONLY_SECRETS}
    for name, service in services.items():
        if name == "api":
            continue
        assert not {v.removesuffix("_FILE") for v in _environment(service)} & only_api, name
        assert not {keys, tokens} & set(_mounted_secrets(service).values()), name
    # and the bearer token of /metrics, which Prometheus holds too (the scraper must send it)
    assert api_mounted.keys() == {
        api_env[f"MCP_TASKS_{n}_FILE"]
        for n in ("DATABASE_URL", "BROKER_URL", "SECRET_KEYS", "AUTH_TOKENS", "METRICS_TOKEN")
    }


def test_each_process_connects_as_its_own_login_and_none_as_the_superuser(config: dict[str, Any]) -> None:
    """deploy/postgres/init-roles.sh makes the logins (tests/integration/test_compose_roles.py
    runs it on a real Postgres); here: who mounts which DSN."""
    services = config["services"]
    expected = {"migrate": "database_url_owner", "api": "database_url_api", "worker": "database_url_worker",
                "worker-gpu": "database_url_worker", "maintenance": "database_url_maintenance"}  # fmt: skip
    for name, service in services.items():
        env = _environment(service)
        dsn = env.get("MCP_TASKS_DATABASE_URL_FILE")
        assert (dsn and _mounted_secrets(service)[dsn]) == expected.get(name), name
        assert "postgres_password" not in _mounted_secrets(service).values() or name == "postgres", name
    postgres = services["postgres"]
    assert _environment(postgres)["POSTGRES_USER"] == "postgres"
    assert set(expected.values()) <= set(_mounted_secrets(postgres).values())  # the init script reads them
    init = _volumes(postgres)["/docker-entrypoint-initdb.d/10-mcp-roles.sh"]
    assert Path(init[0]).resolve() == (ROOT / "deploy" / "postgres" / "init-roles.sh").resolve() and init[1]


def test_grafana_admin_password_comes_from_a_file_and_anonymous_access_is_off(
    config: dict[str, Any],
) -> None:
    grafana = config["services"]["grafana"]
    env = _environment(grafana)
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] in _mounted_secrets(grafana)
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


def test_flower_takes_basic_auth_from_its_secret(
    config: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flower = config["services"]["flower"]
    conf = next(arg.split("=", 1)[1] for arg in flower["entrypoint"] if arg.startswith("--conf="))
    source, read_only = _volumes(flower)[conf]
    assert read_only
    assert _environment(flower)["FLOWER_BASIC_AUTH_FILE"] in _mounted_secrets(flower)
    secret = tmp_path / "flower_basic_auth"
    monkeypatch.delenv("FLOWER_BASIC_AUTH_FILE", raising=False)
    with pytest.raises(KeyError):  # no secret named: Flower does not start
        runpy.run_path(source)
    monkeypatch.setenv("FLOWER_BASIC_AUTH_FILE", str(secret))
    with pytest.raises(FileNotFoundError):
        runpy.run_path(source)
    secret.write_text("\n")
    with pytest.raises(SystemExit):
        runpy.run_path(source)
    secret.write_text("admin:s3cret\n")
    assert runpy.run_path(source)["basic_auth"] == ["admin:s3cret"]


def test_env_example_names_every_variable_the_compose_file_interpolates() -> None:
    lines = (ROOT / ".env.example").read_text().splitlines()
    named = {line.split("=", 1)[0].strip() for line in lines if "=" in line and not line.startswith("#")}
    assert _interpolated() and _interpolated() <= named
    assert not {v for v in named if SECRET_NAME.search(v)}


def test_secrets_readme_commands_make_every_secret_in_a_form_the_services_accept(
    config: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not shutil.which("openssl"):
        pytest.skip("the documented commands need openssl")
    readme = (ROOT / "secrets" / "README.md").read_text()
    script = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert script
    (tmp_path / "secrets").mkdir()
    subprocess.run(["sh", "-c", script.group(1)], cwd=tmp_path, check=True, timeout=60)
    made = tmp_path / "secrets"
    files = {name: Path(secret["file"]).name for name, secret in config["secrets"].items()}
    assert {p.name for p in made.iterdir()} == set(files.values())

    # The api container's view: each *_FILE variable names the file its secret comes from.
    for variable in list(os.environ):
        if variable.startswith("MCP_TASKS_"):
            monkeypatch.delenv(variable)
    api = config["services"]["api"]
    mounted = _mounted_secrets(api)
    for variable, path in _environment(api).items():
        if variable.endswith("_FILE"):
            monkeypatch.setenv(variable, str(made / files[mounted[path]]))
    settings = Settings()
    postgres_password = (made / "postgres_password").read_text()
    api_login = urlsplit(settings.database_url)
    assert (api_login.username, api_login.hostname) == ("mcp_api", "postgres")
    logins = {
        urlsplit((made / f"database_url_{k}").read_text()) for k in ("owner", "api", "worker", "maintenance")
    }
    assert len({url.username for url in logins}) == 4  # one login per kind of process
    assert all(re.fullmatch(r"[0-9a-f]{64}", url.password or "") for url in logins)
    assert postgres_password not in {url.password for url in logins}
    credentials = dict(
        line.split(" = ", 1) for line in (made / "rabbitmq_credentials.conf").read_text().splitlines()
    )
    assert urlsplit(settings.broker_url).username == credentials["default_user"]
    assert urlsplit(settings.broker_url).password == credentials["default_pass"]
    assert len(settings.secret_keys) == 1
    Sealer(settings.secret_keys)  # valid URL-safe base64 of an AES key, or it raises
    key = settings.secret_keys[0]
    assert len(base64.urlsafe_b64decode(key + "=" * (-len(key) % 4))) == 32
    assert settings.auth_tokens and all(len(t) == 64 for t in settings.auth_tokens.values())
    assert re.fullmatch(r"\w+:[0-9a-f]{64}", (made / "flower_basic_auth").read_text())
    assert re.fullmatch(r"[0-9a-f]{64}", (made / "grafana_admin_password").read_text())
    assert len(postgres_password) == 64 and postgres_password != credentials["default_pass"]


def test_secret_files_are_never_committed(config: dict[str, Any]) -> None:
    def ignored(path: str) -> bool:
        check = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT)
        assert check.returncode in (0, 1), check
        return check.returncode == 0

    for secret in config["secrets"].values():
        assert ignored(str(Path(secret["file"]).relative_to(ROOT)))
    assert ignored(".env")
    assert not ignored("secrets/README.md") and not ignored(".env.example")


def test_grafana_dashboard_queries_only_metrics_the_code_defines() -> None:
    from mcp_celery_tasks.telemetry import metrics

    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "mcp-celery-tasks.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {
        re.sub(r"_(total|bucket|count|sum)$", "", name)
        for e in exprs
        for name in re.findall(r"mcp_[a-z_]+", e)
    }
    defined = {
        collector._name
        for collector in vars(metrics).values()
        if hasattr(collector, "_name") and str(getattr(collector, "_name", "")).startswith("mcp_")
    }
    assert used and used <= defined, used - defined
