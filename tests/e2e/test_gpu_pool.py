"""GPU pools on real worker processes, without a GPU: device ids are simulated (``--gpus 0,1``).

A prefork worker started with ``--gpus 0,1`` runs two pool children, each pinned to one device
(``CUDA_VISIBLE_DEVICES``); the fixture tools (tests/fixtures/gpu.py) report what their process
sees. While one child holds device 0 busy, every other job (after a crash, or in a child recycled
after each job, the GPU default) must land on device 1, never on the busy one. Also: the
refusals at start (bad ``--gpus``, ``--slots-per-gpu 0``, ``--gpu-max-tasks-per-child 0``, the
threads pool, CUDA initialised in the main process by a tool module), and the recycling flag
reaching Celery.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import support
from tests.support import ROOT, Client, Stack

TOOLS = '["tests.fixtures.gpu", "tests.fixtures.conformance"]'


def _gpu_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p)
    return env


@pytest.fixture(scope="module")
def gpu_stack(template_db: str) -> Iterator[Stack]:
    name = f"mcpt_gpu_{uuid.uuid4().hex[:8]}"
    dsn = support.create_database(name, template=template_db)
    suffix = f"g{uuid.uuid4().hex[:6]}"
    env = support.stack_env(
        dsn,
        support.REDIS_URL,
        suffix,
        MCP_TASKS_TOOL_MODULES=TOOLS,
        # A crashed child's lease lapses within ~3 s, so its job reruns soon.
        MCP_TASKS_LEASE_SECONDS="2",
        MCP_TASKS_LEASE_GRACE_SECONDS="1",
        MCP_TASKS_WATCHDOG_INTERVAL_SECONDS="0.5",
    )
    env = {**_gpu_env(), **{k: v for k, v in env.items() if k not in ("CUDA_VISIBLE_DEVICES",)}}
    queues = f"{env['MCP_TASKS_DEFAULT_QUEUE']},{env['MCP_TASKS_MAINTENANCE_QUEUE']}"
    worker = support.spawn(
        "gpu-worker",
        [
            "worker",
            "--gpus",
            "0,1",
            "-Q",
            queues,
            "-n",
            f"gpu-{os.getpid()}@localhost",
            "--log-level",
            "info",
        ],
        env,
    )
    api: support.Proc | None = None
    try:
        api, url = support.start_api("gpu-api", env)
        stack = Stack(url, dsn, support.REDIS_URL, env, api, worker)
        client = stack.client()
        support.wait_until(
            lambda: client.call_tool("greet", {"name": "ready"}, extension=False).status == 200,
            60,
            0.2,
            what="the GPU worker to run a job",
        )
        client.close()
        yield stack
    finally:
        if api is not None:
            api.stop()
        worker.stop(signal.SIGQUIT, timeout=20)
        support.drop_database(name)


def _result(client: Client, task_id: str, timeout: float = 40) -> dict[str, Any]:
    done = client.wait_status(task_id, timeout=timeout)
    assert done["status"] == "completed", done
    assert not done["result"].get("isError"), done
    result: dict[str, Any] = done["result"]["structuredContent"]
    return result


@pytest.mark.timeout(120)
def test_each_child_sees_exactly_its_own_device(gpu_stack: Stack, tmp_path: Path) -> None:
    release = tmp_path / "release"
    client = gpu_stack.client()
    # Both held at once: the two children are busy together, so they must be on both devices.
    first = client.start("g_device", {"hold_until": str(release), "hold_s": 20})
    second = client.start("g_device", {"hold_until": str(release), "hold_s": 20})
    support.wait_until(
        lambda: all(gpu_stack.row(t)["started_at"] is not None for t in (first, second)),
        30,
        what="both jobs running",
    )
    release.touch()
    seen = [_result(client, task) for task in (first, second)]
    assert sorted(s["visible"] for s in seen) == ["0", "1"]
    assert seen[0]["pid"] != seen[1]["pid"]
    for task, view in zip((first, second), seen, strict=True):
        assert view["device"] == view["visible"]  # ctx.device names the pinned device
        assert view["order"] == "PCI_BUS_ID"  # the numbering nvidia-smi and NVML use
        assert view["principal"] == "anon"  # ctx.principal: the stack has no auth
        assert gpu_stack.row(task)["device"] == view["visible"]  # the row names it too
    # The admin view, the worker's log and its metrics name the device too.
    shown = subprocess.run(
        # A task id may start with "-" (one in 64): it goes after "--", as the README says.
        [sys.executable, "-m", "mcp_celery_tasks.cli", "tasks", "show", "--json", "--", first],
        env=gpu_stack.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["task"]["device"] == seen[0]["visible"], shown.stderr
    assert f"runs on GPU {seen[0]['visible']}" in gpu_stack.worker.log.read_text()
    metrics = httpx.get(
        f"http://127.0.0.1:{gpu_stack.env['MCP_TASKS_WORKER_METRICS_PORT']}/metrics", timeout=10
    )
    assert re.search(r'mcp_gpu_jobs_total\{device="1",tool="g_device"\} [1-9]', metrics.text), metrics.text[
        -2000:
    ]
    # The worker registry (issue 30) lists the worker with its devices.
    with gpu_stack.db() as conn:
        registered = conn.execute("SELECT devices, slots FROM mcp_workers WHERE kind = 'worker'").fetchall()
    assert registered == [(["0", "1"], 2)], registered


@pytest.mark.timeout(150)
def test_replaced_children_get_the_freed_device_never_the_busy_one(gpu_stack: Stack, tmp_path: Path) -> None:
    release = tmp_path / "release"
    client = gpu_stack.client()
    holder = client.start("g_device", {"hold_until": str(release), "hold_s": 90})
    support.wait_until(lambda: gpu_stack.row(holder)["device"] is not None, 30, what="the holder to start")
    busy = gpu_stack.row(holder)["device"]
    free = {"0": "1", "1": "0"}[busy]
    # A crash: the child dies with SIGKILL mid-job; its replacement runs the rerun.
    crashed = client.start("g_crash_once")
    rerun = _result(client, crashed, timeout=60)
    assert rerun["attempt"] == 2 and rerun["visible"] == free
    # Recycling (one job per child on a GPU worker): every job in a new process, on the free device.
    pids = {rerun["pid"]}
    for _ in range(3):
        view = _result(client, client.start("g_device"))
        assert view["visible"] == free, view
        pids.add(view["pid"])
    assert len(pids) == 4  # each job ran in a process of its own
    release.touch()
    assert _result(client, holder)["visible"] == busy


# ---- refusals at start ----------------------------------------------------------------------


def _start_worker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in _gpu_env().items() if not k.startswith("MCP_TASKS_")}
    base["MCP_TASKS_TOOL_MODULES"] = '["tests.fixtures.gpu"]'
    return subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "worker", *args],
        env={**base, **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _fake_smi(folder: Path) -> str:
    """A PATH whose nvidia-smi lists two devices (as the real one prints them)."""
    smi = folder / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU 0: Fake A100 (UUID: GPU-aaaa)'\necho 'GPU 1: Fake A100 (UUID: GPU-bbbb)'\n"
    )
    smi.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--gpus", "0,0"], {}, "--gpus names 0 twice"),
        (["--gpus", "0", "--slots-per-gpu", "0"], {}, "--slots-per-gpu must be at least 1"),
        (["--slots-per-gpu", "2"], {}, "--slots-per-gpu needs --gpus"),
        (["--gpus", "0,1", "-P", "threads"], {}, "--gpus needs the prefork pool"),
        (["--gpus", "0,1", "-c", "3"], {}, "-c 3 does not match --gpus"),
        (["--gpus", "zero"], {}, "'zero' is not a device index"),
        (
            ["--gpus", "0,5"],
            {"CUDA_VISIBLE_DEVICES": "0,1"},
            "no device 5 on this machine (CUDA_VISIBLE_DEVICES: 0, 1)",
        ),
        (["--gpus", "auto"], {"CUDA_VISIBLE_DEVICES": ""}, "CUDA_VISIBLE_DEVICES lists no device"),
        (["--gpus", "3"], {"PATH": "smi"}, "no device 3 on this machine (nvidia-smi -L: 0, 1)"),
        (
            ["--gpus", "0", "--gpu-max-tasks-per-child", "0"],
            {},
            "--gpu-max-tasks-per-child must be at least 1 (got 0); to never recycle a GPU child, "
            "set MCP_TASKS_WORKER_GPU_MAX_TASKS_PER_CHILD=0",
        ),
        (
            ["--gpus", "0", "--gpu-max-tasks-per-child", "-2"],
            {},
            "--gpu-max-tasks-per-child must be at least 1",
        ),
        (["--gpu-max-tasks-per-child", "2"], {}, "--gpu-max-tasks-per-child needs --gpus"),
        (
            ["--gpus", "0"],
            {"MCP_TASKS_WORKER_GPU_MAX_TASKS_PER_CHILD": "-1"},
            "MCP_TASKS_WORKER_GPU_MAX_TASKS_PER_CHILD='-1': Input should be greater than or equal to 0",
        ),
    ],
)
def test_bad_gpu_settings_are_refused_with_one_line(
    args: list[str], env: dict[str, str], says: str, tmp_path: Path
) -> None:
    if env.get("PATH") == "smi":
        env = {"PATH": _fake_smi(tmp_path)}
    done = _start_worker(*args, env=env)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr


def test_the_recycling_flag_sets_how_many_jobs_a_gpu_child_runs(db_url: str) -> None:
    env = {**_gpu_env(), **support.stack_env(db_url, support.REDIS_URL, f"r{uuid.uuid4().hex[:6]}")}
    env["MCP_TASKS_TOOL_MODULES"] = '["tests.fixtures.gpu"]'
    worker = support.spawn(
        "gpu-recycle-worker",
        ["worker", "--gpus", "0,1", "--gpu-max-tasks-per-child", "3", "-Q", env["MCP_TASKS_DEFAULT_QUEUE"],
         "-n", f"gpu-recycle-{os.getpid()}@localhost"],
        env,
    )  # fmt: skip
    try:
        line = support.wait_until(
            lambda: next(
                (x for x in worker.log.read_text().splitlines() if "GPU worker: devices" in x), None
            ),
            30,
            0.1,
            what="the GPU worker's start-up line",
        )
        # Celery's own max_tasks_per_child, as the worker set it before the pool forked.
        assert "devices 0,1, 1 slot(s) each, children recycled after 3 job(s)" in line, line
    finally:
        worker.stop(signal.SIGQUIT, timeout=20)


def test_gpus_auto_without_any_way_to_list_devices_is_refused(tmp_path: Path) -> None:
    if any((Path(p) / "nvidia-smi").exists() for p in os.environ.get("PATH", "").split(os.pathsep) if p):
        pytest.skip("this machine has nvidia-smi")
    done = _start_worker("--gpus", "auto")
    assert done.returncode == 2
    assert "--gpus auto: cannot list the devices" in done.stderr.strip().splitlines()[-1]


def test_a_tool_module_that_initialises_cuda_at_import_is_refused_by_name() -> None:
    done = _start_worker(env={"MCP_TASKS_TOOL_MODULES": '["tests.fixtures.gpu", "tests.fixtures.fake_cuda"]'})
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert (
        "CUDA was initialised in the main process by the tool module 'tests.fixtures.fake_cuda'" in lines[0]
    )
    assert "libcuda.so.1 is loaded" in lines[0] and "inside the tool function" in lines[0]


def _celery_worker(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The team's own ``celery -A … worker`` (tests/fixtures/gpu_app.py), not our CLI."""
    base = {k: v for k, v in _gpu_env().items() if not k.startswith("MCP_TASKS_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.fixtures.gpu_app",
            "worker",
            "--loglevel",
            "warning",
            *args,
        ],
        env={**base, "GPU_APP_BROKER_URL": support.REDIS_URL, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_teams_own_celery_worker_refuses_cuda_in_its_main_process() -> None:
    done = _celery_worker(GPU_APP_TOOLS="tests.fixtures.gpu,tests.fixtures.fake_cuda")
    assert done.returncode != 0
    assert (
        "CUDA was initialised in the main process by the tool module 'tests.fixtures.fake_cuda'"
        in done.stderr
    )


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (
            ["-P", "threads"],
            {"MCP_TASKS_WORKER_GPUS": "0,1"},
            "needs the prefork pool (one process per device); the threads pool",
        ),
        ([], {"MCP_TASKS_WORKER_GPUS": "1,1"}, "--gpus names 1 twice"),
    ],
)
def test_a_teams_own_celery_worker_refuses_bad_gpu_settings(
    args: list[str], env: dict[str, str], says: str
) -> None:
    done = _celery_worker(*args, **env)
    assert done.returncode != 0 and says in done.stderr, done.stderr
