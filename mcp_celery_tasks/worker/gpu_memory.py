"""The device memory each pool child of a GPU worker holds, through NVML (``pynvml``).

The watchdog's memory limit reads a child's RSS from ``/proc``; a GPU job's large allocation is
on the device, where ``/proc`` does not see it. NVML lists the compute processes on each device
with the memory each one holds, so the main process can check a child against its tool's
``gpu_memory_limit_mb`` without touching CUDA (NVML is not CUDA: it never creates a context, and
children forked after it was initialised are unaffected).

Without ``pynvml`` (or without a driver) there is nothing to measure: ``DeviceMemory.of`` returns
None and the watchdog checks RSS only. In a container whose PID namespace differs from the
host's, NVML reports host pids and no child matches: the limit then cannot hold (documented).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from mcp_celery_tasks.worker.devices import DeviceTable
from mcp_celery_tasks.worker.watchdog import process_tree

__all__ = ["DeviceMemory", "held_by"]

logger = logging.getLogger("mcp_celery_tasks.worker")

ProcessList = Callable[[str], list[tuple[int, int]]]
"""``device id -> [(pid, bytes held)]`` for the compute processes on that device."""


def held_by(pid: int, device: str, processes: ProcessList) -> int:
    """Bytes of device memory ``pid`` and the processes below it (an isolated body) hold on
    ``device`` (0 when they hold none)."""
    tree = set(process_tree(pid))
    return sum(used for holder, used in processes(device) if holder in tree)


def _nvml_processes() -> ProcessList | None:
    try:
        import pynvml  # optional: the [gpu] extra (nvidia-ml-py)
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver here
        return None
    lock = threading.Lock()

    def processes(device: str) -> list[tuple[int, int]]:
        with lock:
            handle: Any = (
                pynvml.nvmlDeviceGetHandleByIndex(int(device))
                if device.isdigit()
                else pynvml.nvmlDeviceGetHandleByUUID(device)
            )
            running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return [(int(p.pid), int(p.usedGpuMemory or 0)) for p in running]

    return processes


class DeviceMemory:
    """``memory(pid) -> (device, bytes)`` for the watchdog: the device a child is pinned to (from
    the worker's slot table) and what it holds there; None for a child with no device."""

    def __init__(self, table: DeviceTable, processes: ProcessList) -> None:
        self._table = table
        self._processes = processes

    @classmethod
    def of(cls, table: DeviceTable) -> DeviceMemory | None:
        """The measure for ``table``'s children, or None without NVML."""
        processes = _nvml_processes()
        if processes is None:
            logger.info("GPU worker: no NVML (pip install nvidia-ml-py): device memory limits are off")
            return None
        return cls(table, processes)

    def __call__(self, pid: int) -> tuple[str, int] | None:
        device = self._table.holders().get(pid)
        if device is None:
            return None
        try:
            return device, held_by(pid, device, self._processes)
        except Exception:  # NVMLError (a device fell off the bus): no measure this tick
            logger.warning("GPU worker: NVML could not list the processes on GPU %s", device, exc_info=True)
            return None
