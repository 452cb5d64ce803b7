"""GPU pools: each prefork pool child is pinned to one device (``--gpus``). No Celery here.

CUDA cannot be initialised again in a forked child, and a child that sees every device picks the
first one like all its siblings. So the worker's main process never touches CUDA (``cuda_guard``),
and each pool child, right after its fork and before any job, takes a free *slot* (a device, or a
share of one with ``--slots-per-gpu``) and sets ``CUDA_VISIBLE_DEVICES`` to that device alone: the
tool then sees exactly one device, ``cuda:0``.

The assignment table is a small file the main process creates before the pool forks. A child
takes its slot under an exclusive ``flock`` (each child opens the file itself: a lock is per open
file, so two children starting at once are serialised, and a child killed while holding it drops
it), writing its pid and its kernel start time. A slot is free when its holder is gone (no such
process, a zombie, or a pid reused by a process that started at another time), so a child
replaced after a crash, a memory-limit kill or ``max_tasks_per_child`` gets exactly the slot its
predecessor freed, never a busy one: there is one slot per child. The main process reads the
table to know which device each child holds (the watchdog's device-memory limit).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "DeviceError",
    "DevicePlan",
    "DeviceTable",
    "current_device",
    "open_table",
    "opened_table",
    "plan_devices",
    "release_device",
    "take_device",
    "visible_devices",
]

logger = logging.getLogger("mcp_celery_tasks.worker")

VISIBLE_ENV: Final = "CUDA_VISIBLE_DEVICES"
ORDER_ENV: Final = "CUDA_DEVICE_ORDER"
TAKE_WAIT_S: Final = 30.0
"""How long a new child waits for a slot whose holder is still exiting before it gives up."""
_ID = re.compile(r"^(\d{1,4}|(GPU|MIG)-[0-9A-Za-z/-]{1,80})$")
_SMI_LINE = re.compile(r"^GPU (\d+):")


class DeviceError(ValueError):
    """A ``--gpus`` / ``--slots-per-gpu`` value that cannot be used; the message is one line."""


@dataclass(frozen=True, slots=True)
class DevicePlan:
    """The devices of a worker and how many pool children share each one."""

    devices: tuple[str, ...]
    slots_per_gpu: int = 1

    @property
    def concurrency(self) -> int:
        return len(self.devices) * self.slots_per_gpu

    def slots(self) -> list[str]:
        """The device of each slot, spread first: with two slots per device on 0,1 the children
        get 0, 1, 0, 1 (the second child on a device comes only when every device has one)."""
        return [device for _ in range(self.slots_per_gpu) for device in self.devices]


def _nvml_devices() -> list[str] | None:
    try:
        import pynvml  # optional: the [gpu] extra (nvidia-ml-py)
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver on this machine
        return None
    try:
        return [str(index) for index in range(int(pynvml.nvmlDeviceGetCount()))]
    finally:
        # NVML holds /dev/nvidia* open while initialised: closed before the pool forks.
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _smi_devices() -> list[str] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    return [m.group(1) for line in listed.stdout.splitlines() if (m := _SMI_LINE.match(line.strip()))]


def visible_devices() -> tuple[list[str], str] | None:
    """The devices this machine lets the worker use, and where that came from; None when unknown.

    ``CUDA_VISIBLE_DEVICES`` first (a scheduler or the operator already chose), then NVML
    (``pynvml``), then ``nvidia-smi -L``. NVML and nvidia-smi number devices in PCI bus order,
    which is why the children also get ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
    """
    given = os.environ.get(VISIBLE_ENV)
    if given is not None:
        return [part.strip() for part in given.split(",") if part.strip()], VISIBLE_ENV
    for source, probe in (("NVML", _nvml_devices), ("nvidia-smi -L", _smi_devices)):
        found = probe()
        if found is not None:
            return found, source
    return None


def plan_devices(gpus: str, slots_per_gpu: int = 1) -> DevicePlan:
    """``--gpus`` (``auto`` or a comma-separated list of device ids or UUIDs) as a plan.

    Raises:
        DeviceError: a one-line reason: no devices, a malformed or duplicate id, a device the
            machine does not have (when its devices are known), or fewer than one slot per device.
    """
    if slots_per_gpu < 1:
        raise DeviceError(f"--slots-per-gpu must be at least 1 (got {slots_per_gpu})")
    visible = visible_devices()
    if gpus.strip().lower() == "auto":
        if visible is None:
            raise DeviceError(
                "--gpus auto: cannot list the devices (no CUDA_VISIBLE_DEVICES, no NVML (pynvml), "
                "no nvidia-smi); name them, e.g. --gpus 0,1"
            )
        if not visible[0]:
            raise DeviceError(f"--gpus auto: {visible[1]} lists no device")
        return DevicePlan(tuple(visible[0]), slots_per_gpu)
    ids = [part.strip() for part in gpus.split(",")]
    if not any(ids):
        raise DeviceError("--gpus needs device ids, e.g. --gpus 0,1 (or auto)")
    for device in ids:
        if not _ID.match(device):
            raise DeviceError(f"--gpus: {device!r} is not a device index or UUID (e.g. 0 or GPU-8f3c…)")
    duplicates = sorted({device for device in ids if ids.count(device) > 1})
    if duplicates:
        raise DeviceError(
            f"--gpus names {', '.join(duplicates)} twice; to share a device use --slots-per-gpu N"
        )
    if visible is not None:
        missing = [device for device in ids if device not in visible[0]]
        if missing:
            have = ", ".join(visible[0]) or "none"
            raise DeviceError(
                f"--gpus: no device {', '.join(missing)} on this machine ({visible[1]}: {have})"
            )
    return DevicePlan(tuple(ids), slots_per_gpu)


def _start_time(pid: int) -> int | None:
    """The kernel start time of ``pid`` (clock ticks since boot); None if gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X", b"x"):
        return None
    return int(fields[19])


class DeviceTable:
    """The slots of one worker and the child holding each (a file shared across the fork)."""

    def __init__(self, plan: DevicePlan, path: Path) -> None:
        self.plan = plan
        self.path = path
        self._owner = os.getpid()

    @classmethod
    def create(cls, plan: DevicePlan) -> DeviceTable:
        folder = Path(tempfile.mkdtemp(prefix="mcp-worker-devices-"))
        path = folder / "slots.json"
        path.write_text("{}")
        return cls(plan, path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[tuple[dict[int, tuple[int, int]], list[dict[int, tuple[int, int]]]]]:
        """The live holders by slot, under the lock; a table appended to ``out`` is written back."""
        with open(self.path, "r+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                raw = json.loads(handle.read() or "{}")
                held = {
                    int(slot): (int(pid), int(started))
                    for slot, (pid, started) in raw.items()
                    if _start_time(int(pid)) == int(started)
                }
                out: list[dict[int, tuple[int, int]]] = []
                yield held, out
                if out:
                    handle.seek(0)
                    handle.truncate()
                    handle.write(json.dumps({str(slot): list(entry) for slot, entry in out[0].items()}))
                    handle.flush()
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def take(self, pid: int | None = None, wait_s: float = TAKE_WAIT_S) -> str:
        """Give the calling child (``pid``) a free slot and return its device.

        A slot still held by a child that is exiting frees up in moments: the caller waits up to
        ``wait_s`` for it, then raises ``DeviceError`` (the pool then starts another child).
        """
        pid = pid or os.getpid()
        started = _start_time(pid)
        if started is None:
            raise DeviceError(f"process {pid} is not running")
        slots = self.plan.slots()
        deadline = time.monotonic() + wait_s
        while True:
            with self._locked() as (held, out):
                for slot, (holder, _) in held.items():
                    if holder == pid:
                        out.append(held)
                        return slots[slot]
                free = [slot for slot in range(len(slots)) if slot not in held]
                if free:
                    held[free[0]] = (pid, started)
                    out.append(held)
                    return slots[free[0]]
            if time.monotonic() >= deadline:
                raise DeviceError(f"no free device slot for process {pid}: all {len(slots)} are held")
            time.sleep(0.05)

    def release(self, pid: int | None = None) -> None:
        """Free the slot of ``pid`` (a child on its way out; a killed one is freed by its death)."""
        pid = pid or os.getpid()
        with self._locked() as (held, out):
            out.append({slot: entry for slot, entry in held.items() if entry[0] != pid})

    def holders(self) -> dict[int, str]:
        """The device of each live child, by pid (for the main process)."""
        slots = self.plan.slots()
        with self._locked() as (held, _):
            return {pid: slots[slot] for slot, (pid, _) in held.items()}

    def remove(self) -> None:
        if os.getpid() == self._owner:
            shutil.rmtree(self.path.parent, ignore_errors=True)


_TABLE: DeviceTable | None = None
_DEVICE: str | None = None


def open_table(plan: DevicePlan) -> DeviceTable:
    """In the worker's main process, before the pool forks: the table its children take slots from."""
    global _TABLE
    if _TABLE is None or _TABLE.plan != plan:
        _TABLE = DeviceTable.create(plan)
        atexit.register(_TABLE.remove)  # the main process's exit only (``remove`` checks the pid)
    return _TABLE


def opened_table() -> DeviceTable | None:
    """This worker's table, if it is a GPU worker."""
    return _TABLE


def take_device() -> str | None:
    """In a new pool child, before any job: take a slot and see only its device (None: not a GPU
    worker). Exits the child when no slot frees up (the pool replaces it)."""
    global _DEVICE
    if _TABLE is None:
        return None
    try:
        _DEVICE = _TABLE.take()
    except DeviceError as exc:
        logger.critical("pool child %s: %s; exiting", os.getpid(), exc)
        os._exit(1)
    os.environ[VISIBLE_ENV] = _DEVICE
    os.environ.setdefault(ORDER_ENV, "PCI_BUS_ID")
    logger.info("pool child %s pinned to GPU %s", os.getpid(), _DEVICE, extra={"device": _DEVICE})
    return _DEVICE


def release_device() -> None:
    """In a pool child that exits cleanly: give its slot back at once."""
    if _TABLE is not None and _DEVICE is not None:
        with contextlib.suppress(OSError):
            _TABLE.release()


def current_device() -> str | None:
    """The device this pool child is pinned to (as named in ``--gpus``), or None."""
    return _DEVICE
