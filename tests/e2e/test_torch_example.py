"""The PyTorch example (workers/train_torch.py) end to end on a GPU worker's real processes.

The worker consumes the ``gpu`` queue with ``--gpus 0`` (a simulated device: no GPU here, so the
job trains on PyTorch's CPU build, pinned all the same). The child running the job is killed
with SIGKILL mid-training; the rerun, in the child that replaced it, resumes after the last
checkpointed epoch and saves the model in the caller's folder. Skipped where torch is not
installed (scripts/test installs the CPU build in CI, on Python 3.11).
"""

from __future__ import annotations

import base64
import os
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import support
from tests.support import Stack
from workers.model_files import principal_folder

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the [torch] extra)")

# It trains on the CPU (one core) for several seconds: alone, so neither it nor a neighbour is slowed.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def torch_stack(template_db: str) -> Iterator[Stack]:
    name = f"mcpt_torch_{uuid.uuid4().hex[:8]}"
    dsn = support.create_database(name, template=template_db)
    suffix = f"t{uuid.uuid4().hex[:6]}"
    env = support.stack_env(
        dsn,
        support.REDIS_URL,
        suffix,
        MCP_TASKS_TOOL_MODULES='["workers", "tests.fixtures.conformance"]',
        MCP_TASKS_LEASE_SECONDS="2",
        MCP_TASKS_LEASE_GRACE_SECONDS="1",
        MCP_TASKS_WATCHDOG_INTERVAL_SECONDS="0.5",
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)
    for directory in support.examples_dirs(suffix):
        directory.mkdir(parents=True, exist_ok=True)
    queues = f"gpu,{env['MCP_TASKS_DEFAULT_QUEUE']}"
    worker = support.spawn(
        "torch-worker",
        [
            "worker",
            "--gpus",
            "0",
            "-Q",
            queues,
            "-n",
            f"torch-{os.getpid()}@localhost",
            "--log-level",
            "info",
        ],
        env,
    )
    api: support.Proc | None = None
    try:
        api, url = support.start_api("torch-api", env)
        stack = Stack(url, dsn, support.REDIS_URL, env, api, worker)
        client = stack.client()
        support.wait_until(
            lambda: client.call_tool("greet", {"name": "ready"}, extension=False).status == 200,
            60,
            0.2,
            what="the torch worker to run a job",
        )
        client.close()
        yield stack
    finally:
        if api is not None:
            api.stop()
        worker.stop(signal.SIGQUIT, timeout=20)
        support.drop_database(name)


@pytest.mark.timeout(150)
def test_training_killed_mid_run_resumes_at_the_last_epoch_and_saves_the_model(torch_stack: Stack) -> None:
    client = torch_stack.client()
    epochs = 10
    task_id = client.start(
        "train_torch", {"model": "runs/moons", "epochs": epochs, "samples": 40_000, "seed": 7}
    )

    def epoch_reached() -> int | None:
        message = client.get(task_id).result.get("statusMessage") or ""
        found = re.match(rf"epoch (\d+)/{epochs}: loss", message)
        return int(found.group(1)) if found and int(found.group(1)) >= 1 else None

    support.wait_until(epoch_reached, 60, 0.02, what="an epoch trained and checkpointed")
    row = torch_stack.row(task_id)
    assert row["device"] == "0" and row["queue"] == "gpu"
    child = int(row["worker"].split(":")[1])
    os.kill(child, signal.SIGKILL)  # a crash: no goodbye, no give-back

    done = client.wait_status(task_id, timeout=90)
    assert done["status"] == "completed" and not done["result"]["isError"], done
    result = done["result"]["structuredContent"]
    assert result["resumed_after_epoch"] >= 1  # the checkpointed epochs were not trained again
    assert len(result["losses"]) == epochs and result["final_loss"] < 0.2  # from ~0.69 untrained
    assert result["accuracy"] > 0.9 and result["gpu"] == "0" and result["device"] == "cpu"
    assert torch_stack.row(task_id)["attempts"] == 2
    models = Path(torch_stack.env["MCP_EXAMPLES_MODELS_DIR"]) / principal_folder("anon")
    assert result["model_path"] == str(models / "runs" / "moons.pt")
    weights = torch.load(models / "runs" / "moons.pt", weights_only=True)
    assert weights["0.weight"].shape == (32, 2)
    assert os.listdir(models / "runs") == ["moons.pt"]  # no temp file left by the killed run
    # The result links the weights: resources/read returns the model file's very bytes.
    [link] = [block for block in done["result"]["content"] if block["type"] == "resource_link"]
    assert link["name"] == "moons.pt" and result["weights"] == link["uri"]
    [read] = client.request("resources/read", {"uri": link["uri"]}, name=link["uri"]).result["contents"]
    assert base64.b64decode(read["blob"]) == (models / "runs" / "moons.pt").read_bytes()
    client.close()
