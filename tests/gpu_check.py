"""The GPU pool check, run by hand on a machine with NVIDIA GPUs (CI has none):

    .venv/bin/python -m tests.gpu_check [--gpus auto] [--slots-per-gpu 1] [--epochs 30] [--samples 20000]

It needs the test services (Postgres, Redis: ``scripts/services``) and PyTorch's CUDA build in
``.venv``. It starts an API and a worker with ``--gpus`` on the ``gpu`` queue, then checks:

1. each pool child sees exactly one device (``CUDA_VISIBLE_DEVICES`` and ``torch.cuda``), and
   distinct children see distinct devices (with ``--slots-per-gpu N``: each device N times);
2. the PyTorch example (workers/train_torch.py) trains on its child's GPU;
3. a child killed mid-training (SIGKILL) is replaced and the job resumes after its last epoch;

and prints epochs/s on the GPU next to the same training on one CPU core. Without a GPU (no
``nvidia-smi``/NVML device, or torch sees no CUDA) it says so and exits 0. Exit 1: a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import migrate
from mcp_celery_tasks.worker.devices import DeviceError, plan_devices, visible_devices
from tests import support

TOOLS = '["tests.fixtures.gpu", "tests.fixtures.conformance", "workers"]'


def why_no_gpu() -> str | None:
    """Why this machine cannot run the check (None: it can)."""
    found = visible_devices()
    if found is None or not found[0]:
        return "no NVIDIA device found (no CUDA_VISIBLE_DEVICES, NVML or nvidia-smi device)"
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True, check=False).returncode != 0:
        return "PyTorch sees no CUDA device here (install its CUDA build in .venv)"
    return None


def result_of(client: support.Client, task_id: str, timeout: float = 900) -> dict[str, Any]:
    done = client.wait_status(task_id, timeout=timeout)
    if done["status"] != "completed" or done["result"].get("isError"):
        raise AssertionError(f"the task ended {done['status']}: {done.get('result') or done.get('error')}")
    result: dict[str, Any] = done["result"]["structuredContent"]
    return result


def check_devices(stack: support.Stack, client: support.Client, children: int, slots: int) -> None:
    """Every child busy at once (each job holds its slot until released): what each one sees."""
    release = Path(tempfile.mkdtemp(prefix="gpu-check-")) / "release"
    held = [
        client.start("g_device", {"hold_until": str(release), "hold_s": 300, "count_cuda": True})
        for _ in range(children)
    ]
    support.wait_until(
        lambda: all(stack.row(task)["device"] is not None for task in held), 120, 0.1, what="every child busy"
    )
    release.touch()
    seen = [result_of(client, task) for task in held]
    for view in seen:
        assert view["visible"] and "," not in view["visible"], f"a child sees {view['visible']!r}"
        assert view["cuda_devices"] == 1, f"child {view['pid']} sees {view['cuda_devices']} CUDA devices"
        assert view["device"] == view["visible"], view
    assert len({view["pid"] for view in seen}) == children, "the jobs did not run in distinct children"
    per_device = Counter(view["visible"] for view in seen)
    assert set(per_device.values()) == {slots}, (
        f"children per device {dict(per_device)}, expected {slots} each"
    )
    print(f"ok    {children} children, one device each; children per device: {dict(per_device)}")


def train(client: support.Client, epochs: int, samples: int) -> dict[str, Any]:
    model = f"gpu-check-{uuid.uuid4().hex[:6]}"
    return result_of(
        client, client.start("train_torch", {"model": model, "epochs": epochs, "samples": samples})
    )


def check_resume(stack: support.Stack, client: support.Client, epochs: int, samples: int) -> None:
    model = f"gpu-check-{uuid.uuid4().hex[:6]}"
    task = client.start("train_torch", {"model": model, "epochs": epochs, "samples": samples})

    def reached() -> int | None:
        found = re.match(r"epoch (\d+)/", client.get(task).result.get("statusMessage") or "")
        return int(found.group(1)) if found and int(found.group(1)) >= 2 else None

    killed_at = support.wait_until(reached, 600, 0.02, what="two epochs trained")
    child = int(stack.row(task)["worker"].split(":")[1])
    os.kill(child, signal.SIGKILL)
    resumed = result_of(client, task)
    assert resumed["device"] == "cuda" and resumed["resumed_after_epoch"] >= 2, resumed
    assert len(resumed["losses"]) == epochs, resumed
    print(f"ok    killed child {child} at epoch {killed_at}; the rerun resumed after epoch "
          f"{resumed['resumed_after_epoch']} on GPU {resumed['gpu']}")  # fmt: skip


def cpu_epochs_per_second(epochs: int, samples: int) -> float:
    """The same training on one CPU core, in a process of its own with no GPU visible."""
    code = (
        "import json, os, sys, tempfile\n"
        "os.environ['MCP_EXAMPLES_MODELS_DIR'] = tempfile.mkdtemp()\n"
        "from mcp_celery_tasks.testing import run_tool\n"
        "from workers.train_torch import train_torch\n"
        f"arguments = {{'model': 'cpu', 'epochs': {epochs}, 'samples': {samples}}}\n"
        "run = run_tool(train_torch, arguments, capabilities={})\n"
        "print(json.dumps(run.structured))\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=support.ROOT, capture_output=True,
                          text=True, check=True, timeout=3600)  # fmt: skip
    return float(json.loads(done.stdout.strip().splitlines()[-1])["epochs_per_second"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default="auto")
    parser.add_argument("--slots-per-gpu", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--samples", type=int, default=20_000)
    args = parser.parse_args()
    reason = why_no_gpu()
    if reason is not None:
        print(f"gpu_check: skipped: {reason}")
        return 0
    try:
        plan = plan_devices(args.gpus, args.slots_per_gpu)
    except DeviceError as exc:
        print(f"gpu_check: {exc}")
        return 1
    name = f"mcpt_gpucheck_{uuid.uuid4().hex[:8]}"
    dsn = support.create_database(name)
    migrate.upgrade(Settings(database_url=dsn))
    suffix = f"gc{uuid.uuid4().hex[:6]}"
    env = support.stack_env(dsn, support.REDIS_URL, suffix, MCP_TASKS_TOOL_MODULES=TOOLS,
                            MCP_TASKS_LEASE_SECONDS="3", MCP_TASKS_LEASE_GRACE_SECONDS="1")  # fmt: skip
    for directory in support.examples_dirs(suffix):
        directory.mkdir(parents=True, exist_ok=True)
    queues = f"gpu,{env['MCP_TASKS_DEFAULT_QUEUE']}"
    worker = support.spawn(
        "gpu-check-worker",
        ["worker", "--gpus", args.gpus, "--slots-per-gpu", str(args.slots_per_gpu), "-Q", queues,
         "-n", f"gpu-check-{os.getpid()}@localhost"],
        env,
    )  # fmt: skip
    api: support.Proc | None = None
    try:
        api, url = support.start_api("gpu-check-api", env)
        stack = support.Stack(url, dsn, support.REDIS_URL, env, api, worker)
        client = stack.client()
        support.wait_until(lambda: client.call_tool("greet", {"name": "x"}, extension=False).status == 200,
                           120, 0.2, what="the worker")  # fmt: skip
        check_devices(stack, client, plan.concurrency, plan.slots_per_gpu)
        started = time.monotonic()
        gpu = train(client, args.epochs, args.samples)
        assert gpu["device"] == "cuda", f"trained on {gpu['device']}, not the GPU"
        print(f"ok    trained on GPU {gpu['gpu']} in {time.monotonic() - started:.1f} s")
        check_resume(stack, client, args.epochs, args.samples)
        cpu = cpu_epochs_per_second(args.epochs, args.samples)
        print(f"speed {args.samples} samples: GPU {gpu['epochs_per_second']:.2f} epochs/s, one CPU core "
              f"{cpu:.2f} epochs/s ({gpu['epochs_per_second'] / cpu:.1f}x)")  # fmt: skip
        client.close()
        return 0
    except AssertionError as exc:
        print(f"FAIL  {exc} (worker log: {worker.log})")
        return 1
    finally:
        if api is not None:
            api.stop()
        worker.stop(signal.SIGQUIT, timeout=30)
        support.drop_database(name)


if __name__ == "__main__":
    sys.exit(main())
