"""A real PyTorch training job for a GPU pool: an MLP on a seeded two-moons dataset.

What a GPU tool needs, in one file:

- **torch is imported inside the tool**, never at module level: the worker's main process
  imports this module before its pool forks, and CUDA brought up there breaks every child (the
  worker refuses to start, ``worker.cuda_guard``). In the child, ``CUDA_VISIBLE_DEVICES`` already
  names its own device (``worker --gpus``), so ``cuda`` is that device and ``ctx.device`` says
  which one it is; without a GPU (or on a worker without ``--gpus``) it trains on the CPU.
- **Each epoch is checkpointed** through ``ctx.checkpoint`` (the weights, the optimizer's state,
  the epoch, the losses): a run killed or redelivered (a crash, a deploy, a suspend) resumes after
  the last saved epoch. Every epoch shuffles with a generator seeded by ``(seed, epoch)``, so a
  resumed run trains as an uninterrupted one would.
- **It asks before overwriting** (``ask_first``: before the task exists, so no GPU slot waits on
  a human) and writes the weights in the caller's own folder of ``MCP_EXAMPLES_MODELS_DIR``
  (``model_files``), atomically; the result links the same bytes as an artifact.
- **Its work is bounded**: epochs, samples and width by the schema, epochs x samples by the tool,
  and the whole run by its own time limit, far below the worker's 6 h default.

PyTorch is the ``torch`` extra (``pip install 'mcp-celery-tasks[torch]'``); without it the tool
says so. The NumPy ``train_model`` stays the default example.
"""

from __future__ import annotations

import io
import time
from typing import Annotated, Any

from mcp_types import CallToolResult
from pydantic import Field

from mcp_celery_tasks import Elicit, TaskContext, ToolError, tool
from workers.model_files import MODELS_DIR, check_writable, principal_models, result_with_link, save_and_link
from workers.train_model import OVERWRITE_SCHEMA

__all__ = ["train_torch"]

MAX_EPOCHS = 500
MAX_SAMPLES = 100_000
MAX_WORK = 5_000_000
"""Most samples x epochs one call trains (about a minute on one CPU core)."""
TIME_LIMIT_S = 10 * 60.0
BATCH_SIZE = 64
HOLDOUT_FRACTION = 0.2
CHECKPOINT = "torch-training"


def _model_file(model: str) -> str:
    if not model.strip():
        raise ToolError("model must name a file in your models folder, e.g. 'moons'")
    return model if model.endswith(".pt") else f"{model}.pt"


def _ask_overwrite(arguments: dict[str, Any], principal: str) -> Elicit | None:
    """The overwrite question, asked by the API when the caller's model file already exists."""
    try:
        root = principal_models(principal, create=False)
        name = _model_file(str(arguments.get("model", "")))
        target = root.output_path(name) if root is not None else None
    except ToolError:
        return None  # the worker refuses the name, with the reason
    if target is not None and target.exists():
        return Elicit(f"{name} already exists. Overwrite it with the newly trained model?", OVERWRITE_SCHEMA)
    return None


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ToolError("this worker has no PyTorch: pip install 'mcp-celery-tasks[torch]'") from None
    return torch


def _network(torch: Any, hidden: int) -> Any:
    layers = torch.nn
    return layers.Sequential(
        layers.Linear(2, hidden),
        layers.Tanh(),
        layers.Linear(hidden, hidden),
        layers.Tanh(),
        layers.Linear(hidden, 1),
    )


def _moons(torch: Any, samples: int, seed: int) -> tuple[Any, Any]:
    """Two interleaving half circles with noise (standardized), labels 0/1, from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    half = samples // 2
    angle = torch.rand(samples, generator=generator, dtype=torch.float64) * torch.pi
    x = torch.empty(samples, 2, dtype=torch.float64)
    x[:half, 0], x[:half, 1] = torch.cos(angle[:half]), torch.sin(angle[:half])
    x[half:, 0], x[half:, 1] = 1.0 - torch.cos(angle[half:]), 0.5 - torch.sin(angle[half:])
    x += 0.15 * torch.randn(samples, 2, generator=generator, dtype=torch.float64)
    x = (x - x.mean(dim=0)) / x.std(dim=0)
    y = torch.cat([torch.zeros(half), torch.ones(samples - half)])
    return x.float(), y


@tool(
    queue="gpu",
    retention_seconds=24 * 3600,
    ask_first={"overwrite": _ask_overwrite},
    time_limit=TIME_LIMIT_S,
    max_attempts=5,
)
def train_torch(
    ctx: TaskContext,
    model: str,
    epochs: Annotated[int, Field(ge=1, le=MAX_EPOCHS)] = 20,
    samples: Annotated[int, Field(ge=16, le=MAX_SAMPLES)] = 4000,
    hidden: Annotated[int, Field(ge=2, le=256)] = 32,
    learning_rate: Annotated[float, Field(gt=0, le=1)] = 0.01,
    seed: int = 0,
) -> dict[str, Any] | CallToolResult:
    """Train a small PyTorch MLP on a seeded dataset (on the job's GPU, if any) and save it (.pt).

    The weights (a state dict) go in your models folder, and the result links them (an
    artifact, read with resources/read). Reports the loss after each epoch,
    checkpoints each epoch (a crash resumes at the last one) and stops between epochs when
    cancelled. Asks before overwriting an existing model file. epochs x samples is at most 5
    million.
    """
    if epochs * samples > MAX_WORK:
        raise ToolError(
            f"epochs x samples = {epochs * samples:,} is more than one call may train ({MAX_WORK:,}); "
            "train fewer epochs or samples"
        )
    root = principal_models(ctx.principal, create=True)
    if root is None:
        raise ToolError(f"this tool touches no files until {MODELS_DIR} names the directories it may use")
    name = _model_file(model)
    target = str(root.output_path(name))
    answer = ctx.preflight.get("overwrite")
    if answer is not None and answer.get("action") != "accept":
        kept = f"kept the existing model {name}: the user chose not to overwrite it; nothing was trained"
        return {"model": name, "model_path": target, "kept_existing": True, "message": kept}
    torch = _torch()
    check_writable(root, name, overwrite=answer is not None)  # a refused name: before training
    net, stats = _fit(ctx, torch, epochs, samples, hidden, learning_rate, seed)
    ctx.raise_if_cancelled()
    weights = io.BytesIO()
    torch.save(net.state_dict(), weights)
    link = save_and_link(ctx, root, name, weights, overwrite=answer is not None)
    summary = {"model": name, "model_path": target, "epochs": epochs, "weights": link["uri"], **stats}
    return result_with_link(summary, link)


def _fit(
    ctx: TaskContext, torch: Any, epochs: int, samples: int, hidden: int, learning_rate: float, seed: int
) -> tuple[Any, dict[str, Any]]:
    device = torch.device("cuda" if ctx.device is not None and torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # one pool child per core: do not fight the neighbours
    torch.manual_seed(seed)
    x, y = _moons(torch, samples, seed)
    order = torch.randperm(samples, generator=torch.Generator().manual_seed(seed + 1))
    holdout = max(1, int(samples * HOLDOUT_FRACTION))
    x_test, y_test = x[order[:holdout]].to(device), y[order[:holdout]].to(device)
    x_train, y_train = x[order[holdout:]].to(device), y[order[holdout:]].to(device)
    net = _network(torch, hidden).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=learning_rate)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses: list[float] = []
    resumed = _resume(ctx, torch, net, optimizer, losses, device)
    ctx.report(f"epoch {resumed}/{epochs} on {_where(ctx, device)}", resumed, epochs)
    started = time.monotonic()
    for epoch in range(resumed + 1, epochs + 1):
        ctx.raise_if_cancelled()
        shuffle = torch.randperm(
            len(x_train), generator=torch.Generator().manual_seed(seed * 100_003 + epoch)
        )
        net.train()
        for start in range(0, len(x_train), BATCH_SIZE):
            batch = shuffle[start : start + BATCH_SIZE].to(device)
            optimizer.zero_grad()
            loss_fn(net(x_train[batch]).squeeze(1), y_train[batch]).backward()
            optimizer.step()
        with torch.no_grad():
            loss = float(loss_fn(net(x_train).squeeze(1), y_train))
        if loss != loss:  # NaN
            raise ToolError(f"training diverged at epoch {epoch}; lower the learning_rate")
        losses.append(loss)
        _checkpoint(ctx, torch, net, optimizer, epoch, losses)
        ctx.report(f"epoch {epoch}/{epochs}: loss {loss:.4f}", epoch, epochs)
    ran = max(time.monotonic() - started, 1e-9)
    with torch.no_grad():
        accuracy = float(((net(x_test).squeeze(1) > 0).float() == y_test).float().mean())
    return net, {
        "resumed_after_epoch": resumed,
        "losses": losses,
        "final_loss": losses[-1] if losses else None,
        "accuracy": accuracy,
        "device": str(device),
        "gpu": ctx.device,
        "epochs_per_second": (epochs - resumed) / ran,
    }


def _where(ctx: TaskContext, device: Any) -> str:
    return f"GPU {ctx.device}" if device.type == "cuda" else "CPU"


def _checkpoint(
    ctx: TaskContext, torch: Any, net: Any, optimizer: Any, epoch: int, losses: list[float]
) -> None:
    buffer = io.BytesIO()
    torch.save(
        {"net": net.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "losses": losses},
        buffer,
    )
    ctx.checkpoint.save(CHECKPOINT, buffer.getvalue())


def _resume(ctx: TaskContext, torch: Any, net: Any, optimizer: Any, losses: list[float], device: Any) -> int:
    """Load this task's last checkpoint (the epoch it reached; 0 on a first run)."""
    saved = ctx.checkpoint.load(CHECKPOINT)
    if saved is None:
        return 0
    # weights_only: tensors and plain containers, never arbitrary pickled objects.
    state = torch.load(io.BytesIO(saved), map_location=device, weights_only=True)
    net.load_state_dict(state["net"])
    optimizer.load_state_dict(state["optimizer"])
    losses[:] = [float(loss) for loss in state["losses"]]
    return int(state["epoch"])
