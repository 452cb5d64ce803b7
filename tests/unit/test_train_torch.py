"""The PyTorch example run by ``run_tool`` (no services): bounds, names, consent, the saved
weights, and that importing it never imports torch (the worker's main process imports it before
the pool forks). The training tests skip where torch is not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from mcp_celery_tasks.testing import run_tool
from mcp_celery_tasks.tools.registry import get_tool
from tests.support import ROOT
from workers.model_files import principal_folder
from workers.train_torch import MAX_WORK, _ask_overwrite, train_torch

ACCEPT = {"overwrite": {"action": "accept", "content": {}}}


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MCP_EXAMPLES_MODELS_DIR", str(tmp_path / "models"))
    return tmp_path / "models" / principal_folder("anon")


def test_importing_the_example_does_not_import_torch() -> None:
    code = "import sys, workers.train_torch; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_work_above_the_bound_is_refused_before_anything_runs(models: Path) -> None:
    run = run_tool(train_torch, {"model": "m", "epochs": 500, "samples": 100_000}, capabilities={})
    assert run.is_error and run.reports == [] and f"{MAX_WORK:,}" in str(run.result)
    too_many = run_tool(train_torch, {"model": "m", "epochs": 501}, capabilities={})
    assert too_many.is_error and "epochs" in str(too_many.result)
    spec = get_tool("train_torch")
    assert spec is not None and spec.time_limit == 600 and spec.queue == "gpu"


@pytest.mark.parametrize("model", ["/tmp/escape", "../escape", "a/../../escape", ""])
def test_names_outside_the_callers_folder_are_refused_before_training(models: Path, model: str) -> None:
    run = run_tool(train_torch, {"model": model, "epochs": 1, "samples": 16}, capabilities={})
    assert run.is_error and run.reports == []
    assert not Path("/tmp/escape.pt").exists() and not (models.parent / "escape.pt").exists()


def test_the_overwrite_question_is_about_the_callers_own_file(models: Path) -> None:
    models.mkdir(parents=True)
    (models / "m.pt").write_bytes(b"previous")
    question = _ask_overwrite({"model": "m"}, "anon")
    assert question is not None and question.message.startswith("m.pt already exists")
    assert _ask_overwrite({"model": "m"}, "token:someone-else") is None


def test_training_saves_weights_that_load_and_a_decline_keeps_the_file(models: Path) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the [torch] extra)")
    run = run_tool(train_torch, {"model": "runs/m", "epochs": 3, "samples": 2000}, capabilities={})
    assert not run.is_error, run.result
    result = run.structured
    assert result["model_path"] == str(models / "runs" / "m.pt") and result["device"] == "cpu"
    assert len(result["losses"]) == 3 and result["losses"][-1] < 0.69  # below an untrained net's loss
    assert [r.message for r in run.reports][-1].startswith("epoch 3/3: loss")
    state = torch.load(models / "runs" / "m.pt", weights_only=True)
    assert state["0.weight"].shape == (32, 2)
    before = (models / "runs" / "m.pt").read_bytes()
    content = cast(list[dict[str, Any]], (run.result or {})["content"])
    [link] = [block for block in content if block["type"] == "resource_link"]
    assert link["name"] == "m.pt" and result["weights"] == link["uri"]
    assert run.artifacts[link["uri"]] == before and link["size"] == len(before)  # the file's very bytes
    kept = run_tool(
        train_torch,
        {"model": "runs/m", "epochs": 1},
        preflight={"overwrite": {"action": "decline"}},
        capabilities={},
    )
    assert kept.structured["kept_existing"] is True and (models / "runs" / "m.pt").read_bytes() == before
    again = run_tool(
        train_torch, {"model": "runs/m", "epochs": 1, "samples": 100}, preflight=ACCEPT, capabilities={}
    )
    assert not again.is_error and (models / "runs" / "m.pt").read_bytes() != before


def test_torch_is_only_in_its_own_extra_so_dev_and_test_installs_stay_light() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    with_torch = sorted(name for name, wanted in extras.items() if any(w.startswith("torch") for w in wanted))
    assert with_torch == ["torch"]
