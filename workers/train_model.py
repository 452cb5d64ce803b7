"""A real (small) training job: a 2-layer MLP on a synthetic two-moons dataset, with numpy.

Shows ``queue="gpu"`` routing, per-epoch ``ctx.report`` and ``ctx.raise_if_cancelled``, and an
``ask_first`` question that depends on the arguments: overwriting an existing model file is
confirmed before the task exists, so no worker slot is held while a human thinks. Each epoch
ends with ``ctx.checkpoint.save`` (the weights, the epoch, the losses): a run that is killed or
redelivered resumes after the last saved epoch. Each epoch shuffles with a generator seeded by
``(seed, epoch)``, so a resumed run trains exactly as an uninterrupted one would. The result
links the weights it wrote as an artifact (``ctx.artifact``): the client reads the exact bytes
of the model file with ``resources/read``.

The model is a name under the caller's own folder of ``MCP_EXAMPLES_MODELS_DIR`` (a
``FileRoot`` per principal, ``model_files``), never a path chosen freely: one principal never
replaces another's model, directories are created only under that folder, no symlink is written
through, and the file is replaced atomically, only with the user's consent. The work is bounded by
the arguments (epochs x samples) and by the tool's own time limit, so no call holds a GPU slot
for the worker's 6 h default.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, BinaryIO

import numpy as np
from mcp_types import CallToolResult
from numpy.typing import NDArray
from pydantic import Field

from mcp_celery_tasks import Elicit, TaskContext, ToolError, tool
from workers.model_files import MODELS_DIR, check_writable, principal_models, result_with_link, save_and_link

__all__ = ["Mlp", "make_moons", "train_model"]

Array = NDArray[np.float64]

HIDDEN_UNITS = 16
BATCH_SIZE = 64
HOLDOUT_FRACTION = 0.2
MAX_EPOCHS = 1_000_000
MAX_SAMPLES = 1_000_000
MAX_WORK = 200_000_000
"""Most samples x epochs one call may train (a few minutes of a CPU core); more is refused."""
TIME_LIMIT_S = 15 * 60.0
MAX_LOSS_HISTORY = 100

OVERWRITE_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
"""A yes/no question: accepting is the consent, so the form has no field to fill in (a boolean
field would ask the same question a second time after "accept")."""


def _model_file(model: str) -> str:
    """The file name of a model under the models directory: ``.npz`` added when missing."""
    if not model.strip():
        raise ToolError("model must name a file under the models directory, e.g. 'moons'")
    return model if model.endswith(".npz") else f"{model}.npz"


def _ask_overwrite(arguments: dict[str, Any], principal: str = "anon") -> Elicit | None:
    """The overwrite question, only when the model file already exists.

    Evaluated by the API process when the call arrives (before the task exists), with the same
    resolution as the worker's; the tool checks again when it runs, so a file that appears in
    between is never replaced without consent. Without a models directory here, or for a name the
    worker will refuse, nothing is asked: the worker refuses the call with the reason.
    """
    try:
        root = principal_models(principal, create=False)
        name = _model_file(str(arguments.get("model", "")))
        target = root.output_path(name) if root is not None else None
    except ToolError:
        return None
    if target is not None and os.path.lexists(target):
        return Elicit(f"{name} already exists. Overwrite it with the newly trained model?", OVERWRITE_SCHEMA)
    return None


def make_moons(samples: int, rng: np.random.Generator, noise: float = 0.15) -> tuple[Array, Array]:
    """Two interleaving half circles with Gaussian noise (standardized features, labels 0/1)."""
    half = samples // 2
    angle = rng.uniform(0.0, np.pi, samples)
    x = np.empty((samples, 2))
    x[:half, 0] = np.cos(angle[:half])
    x[:half, 1] = np.sin(angle[:half])
    x[half:, 0] = 1.0 - np.cos(angle[half:])
    x[half:, 1] = 0.5 - np.sin(angle[half:])
    x += rng.normal(0.0, noise, x.shape)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    y = np.concatenate([np.zeros(half), np.ones(samples - half)])
    return x, y


@dataclass
class Mlp:
    """inputs -> tanh hidden layer -> one logit; binary cross-entropy, mini-batch SGD."""

    w1: Array
    b1: Array
    w2: Array
    b2: Array

    @classmethod
    def initial(cls, inputs: int, hidden: int, rng: np.random.Generator) -> Mlp:
        return cls(
            w1=rng.normal(0.0, 1.0 / np.sqrt(inputs), (inputs, hidden)),
            b1=np.zeros(hidden),
            w2=rng.normal(0.0, 1.0 / np.sqrt(hidden), hidden),
            b2=np.zeros(1),
        )

    def logits(self, x: Array) -> Array:
        result: Array = np.tanh(x @ self.w1 + self.b1) @ self.w2 + self.b2
        return result

    def loss(self, x: Array, y: Array) -> float:
        z = self.logits(x)
        # log(1 + e^z) - y z, computed without overflow
        return float(np.mean(np.logaddexp(0.0, z) - y * z))

    def accuracy(self, x: Array, y: Array) -> float:
        return float(np.mean((self.logits(x) > 0) == (y > 0.5)))

    def sgd_epoch(self, x: Array, y: Array, learning_rate: float, rng: np.random.Generator) -> None:
        order = rng.permutation(len(x))
        for start in range(0, len(x), BATCH_SIZE):
            batch = order[start : start + BATCH_SIZE]
            xb, yb = x[batch], y[batch]
            hidden = np.tanh(xb @ self.w1 + self.b1)
            z = hidden @ self.w2 + self.b2
            dz = (1.0 / (1.0 + np.exp(-z)) - yb) / len(batch)
            dhidden = np.outer(dz, self.w2) * (1.0 - hidden * hidden)
            self.w2 -= learning_rate * (hidden.T @ dz)
            self.b2 -= learning_rate * dz.sum()
            self.w1 -= learning_rate * (xb.T @ dhidden)
            self.b1 -= learning_rate * dhidden.sum(axis=0)

    def save(self, handle: BinaryIO, **extra: Any) -> None:
        """Write the weights (and ``extra`` arrays) with ``np.savez`` (a file object: savez adds
        no ".npz" suffix)."""
        np.savez(handle, w1=self.w1, b1=self.b1, w2=self.w2, b2=self.b2, **extra)


CHECKPOINT = "training"


def _save_checkpoint(ctx: TaskContext, mlp: Mlp, epoch: int, history: list[float]) -> None:
    """The weights, the epoch they reached and the losses kept so far (the latest save wins)."""
    buffer = io.BytesIO()
    mlp.save(buffer, epoch=np.array(epoch), losses=np.array(history))
    ctx.checkpoint.save(CHECKPOINT, buffer.getvalue())


def _resume(ctx: TaskContext, mlp: Mlp, history: list[float]) -> int:
    """Load the last checkpoint of this task into ``mlp`` and ``history``: the epoch it reached
    (0 on the first run)."""
    saved = ctx.checkpoint.load(CHECKPOINT)
    if saved is None:
        return 0
    with np.load(io.BytesIO(saved)) as state:  # never pickles: allow_pickle stays False
        mlp.w1, mlp.b1, mlp.w2, mlp.b2 = state["w1"], state["b1"], state["w2"], state["b2"]
        history[:] = [float(loss) for loss in state["losses"]]
        return int(state["epoch"])


def _overwrite_agreed(ctx: TaskContext, name: str, target: str) -> bool | None:
    """True: replace the model file (the user accepted); False: there was none to replace when
    the call arrived; None: the user declined or dismissed the question, so the file is kept.

    A decline is an answer, not a failure: the task completes, without ``isError``, saying what it
    kept. A file that appeared after the call arrived (nobody was asked) is refused as an error.
    """
    answer = ctx.preflight.get("overwrite")
    if answer is None:
        if os.path.lexists(target):
            raise ToolError(f"{name} already exists and nobody agreed to replace it; call the tool again")
        return False
    content = answer.get("content") or {}
    # ``"overwrite": false`` with accept: an answers file written for the older form.
    if answer.get("action") == "accept" and content.get("overwrite") is not False:
        return True
    return None


def _reported(epochs: int) -> set[int]:
    """The epochs whose loss the result lists: at most MAX_LOSS_HISTORY, evenly spaced, always
    with the first and the last (only those are kept, so a checkpoint stays small)."""
    if epochs <= MAX_LOSS_HISTORY:
        return set(range(1, epochs + 1))
    step = (epochs - 1) / (MAX_LOSS_HISTORY - 1)
    return {round(i * step) + 1 for i in range(MAX_LOSS_HISTORY)}


def _one_run_per_file(arguments: Mapping[str, object], principal: str) -> str:
    """The concurrency key: one run at a time per model file of each caller (two runs writing one
    file would race for it); other files, and other callers' files of the same name, run on."""
    return f"{_model_file(str(arguments['model']))} of {principal}"


@tool(
    queue="gpu",
    retention_seconds=24 * 3600,
    ask_first={"overwrite": _ask_overwrite},
    time_limit=TIME_LIMIT_S,
    concurrency_key=_one_run_per_file,
    concurrency=1,
)
def train_model(
    ctx: TaskContext,
    model: str,
    epochs: Annotated[int, Field(ge=1, le=MAX_EPOCHS)] = 20,
    samples: Annotated[int, Field(ge=10, le=MAX_SAMPLES)] = 2000,
    learning_rate: Annotated[float, Field(gt=0, le=10)] = 0.1,
    seed: int = 0,
) -> dict[str, Any] | CallToolResult:
    """Train a small MLP classifier on a seeded synthetic dataset and save its weights (npz).

    `model` names the file in the caller's folder of the models directory (e.g. "moons" or
    "runs/moons.npz"); epochs x samples is at most 200 million.
    Reports the loss after every epoch and stops between epochs when cancelled. Asks before
    overwriting an existing model file; declined, it keeps the file and trains nothing. The
    result links the trained weights (an artifact, read with resources/read).
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
    overwrite = _overwrite_agreed(ctx, name, target)
    if overwrite is None:
        kept = f"kept the existing model {name}: the user chose not to overwrite it; nothing was trained"
        return {"model": name, "model_path": target, "kept_existing": True, "message": kept}
    check_writable(root, name, overwrite=overwrite)  # a refused name: before any training
    mlp, stats = _fit(ctx, epochs, samples, learning_rate, seed)
    ctx.raise_if_cancelled()
    weights = io.BytesIO()
    mlp.save(weights)
    link = save_and_link(ctx, root, name, weights, overwrite=overwrite)
    summary = {"model": name, "model_path": target, "epochs": epochs, "weights": link["uri"], **stats}
    return result_with_link(summary, link)


def _fit(
    ctx: TaskContext, epochs: int, samples: int, learning_rate: float, seed: int
) -> tuple[Mlp, dict[str, Any]]:
    """The trained network and what the result reports about the run."""
    rng = np.random.default_rng(seed)
    x, y = make_moons(samples, rng)
    order = rng.permutation(samples)
    holdout = max(1, int(samples * HOLDOUT_FRACTION))
    test, train = order[:holdout], order[holdout:]
    x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]

    mlp = Mlp.initial(x.shape[1], HIDDEN_UNITS, rng)
    initial_loss = mlp.loss(x_train, y_train)
    history: list[float] = []
    resumed = _resume(ctx, mlp, history)
    ctx.report(f"epoch {resumed}/{epochs}" if resumed else f"epoch 0/{epochs}: loss {initial_loss:.4f}")
    reported = _reported(epochs)
    for epoch in range(resumed + 1, epochs + 1):
        ctx.raise_if_cancelled()
        mlp.sgd_epoch(x_train, y_train, learning_rate, np.random.default_rng([seed, epoch]))
        loss = mlp.loss(x_train, y_train)
        if not np.isfinite(loss):
            raise ToolError(f"training diverged at epoch {epoch} (loss {loss}); lower the learning_rate")
        if epoch in reported:
            history.append(loss)
        _save_checkpoint(ctx, mlp, epoch, history)
        ctx.report(f"epoch {epoch}/{epochs}: loss {loss:.4f}")
    return mlp, {
        "resumed_after_epoch": resumed,
        "initial_loss": initial_loss,
        "final_loss": history[-1],
        "losses": history,
        "accuracy": mlp.accuracy(x_test, y_test),
        "train_samples": len(train),
        "test_samples": holdout,
    }
