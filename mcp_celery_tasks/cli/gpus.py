"""The ``worker`` command's GPU options: ``--gpus``, ``--slots-per-gpu`` and
``--gpu-max-tasks-per-child``, checked at start.

A bad value is a one-line refusal (exit 2) before anything connects, forks or imports a tool;
the worker's main process checks the same settings again when Celery starts it
(``worker.celery_glue``), so a team's own ``celery -A … worker`` refuses them too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from mcp_celery_tasks.settings import Settings

__all__ = ["GpuMaxTasksOpt", "GpusOpt", "SlotsOpt", "apply_gpu_options"]

GpusOpt = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        help="GPU worker: auto, or device ids such as 0,1,2,3; one pool child per device "
        "(MCP_TASKS_WORKER_GPUS)",
    ),
]
SlotsOpt = Annotated[
    int | None,
    typer.Option(
        "--slots-per-gpu", help="Pool children per device, default 1 (MCP_TASKS_WORKER_SLOTS_PER_GPU)"
    ),
]

GpuMaxTasksOpt = Annotated[
    int | None,
    typer.Option(
        "--gpu-max-tasks-per-child",
        metavar="N",
        help="Replace a GPU pool child after N jobs, giving its device memory back; default 1 "
        "(MCP_TASKS_WORKER_GPU_MAX_TASKS_PER_CHILD, where 0 keeps children)",
    ),
]


def _refuse(reason: str) -> typer.Exit:
    typer.echo(f"worker: {reason}", err=True)
    return typer.Exit(2)


def apply_gpu_options(
    settings: Settings,
    gpus: str | None,
    slots_per_gpu: int | None,
    pool: str,
    concurrency: int | None,
    gpu_max_tasks_per_child: int | None = None,
) -> tuple[Settings, int | None]:
    """The settings with the flags applied, and the worker's concurrency: devices x slots on a
    GPU worker (a ``-c`` that disagrees is refused), else ``concurrency`` unchanged.

    ``--gpu-max-tasks-per-child`` takes 1 or more: a flag given on a GPU worker's command line is
    there to recycle, so 0 reads as a typo; keeping children for good (device memory never given
    back) stays a deliberate setting of the environment variable."""
    from mcp_celery_tasks.worker.devices import DeviceError, plan_devices

    if gpu_max_tasks_per_child is not None and gpu_max_tasks_per_child < 1:
        raise _refuse(
            f"--gpu-max-tasks-per-child must be at least 1 (got {gpu_max_tasks_per_child}); to never "
            "recycle a GPU child, set MCP_TASKS_WORKER_GPU_MAX_TASKS_PER_CHILD=0"
        )
    given = {"worker_gpus": gpus, "worker_slots_per_gpu": slots_per_gpu,
             "worker_gpu_max_tasks_per_child": gpu_max_tasks_per_child}  # fmt: skip
    if any(value is not None for value in given.values()):
        settings = settings.model_copy(update={k: v for k, v in given.items() if v is not None})
    if not settings.worker_gpus:
        for flag, value in (
            ("--slots-per-gpu", slots_per_gpu),
            ("--gpu-max-tasks-per-child", gpu_max_tasks_per_child),
        ):
            if value is not None:
                raise _refuse(f"{flag} needs --gpus (or MCP_TASKS_WORKER_GPUS)")
        return settings, concurrency
    if pool != "prefork":
        raise _refuse(f"--gpus needs the prefork pool (one process per device), not -P {pool}")
    try:
        plan = plan_devices(settings.worker_gpus, settings.worker_slots_per_gpu)
    except DeviceError as exc:
        raise _refuse(str(exc)) from None
    if concurrency and concurrency != plan.concurrency:
        raise _refuse(
            f"-c {concurrency} does not match --gpus: {len(plan.devices)} device(s) x "
            f"{plan.slots_per_gpu} slot(s) = {plan.concurrency} children (leave -c out)"
        )
    return settings, plan.concurrency
