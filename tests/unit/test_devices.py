"""GPU device plans and the slot table, on real processes (no GPU: ids are simulated).

The table's holders are real child processes (``sleep``): a slot is free once its holder is
dead, reaped or not, and a pid reused by a process that started later is not the old holder.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_celery_tasks.worker import devices
from mcp_celery_tasks.worker.devices import DeviceError, DevicePlan, DeviceTable, plan_devices
from mcp_celery_tasks.worker.gpu_memory import DeviceMemory, held_by

SLEEP = shutil.which("sleep") or "/bin/sleep"


@pytest.fixture(autouse=True)
def no_visible_devices(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No CUDA_VISIBLE_DEVICES and no nvidia-smi: the machine's devices are unknown."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def sleeper(started: list[subprocess.Popen[bytes]]) -> int:
    proc = subprocess.Popen([SLEEP, "60"])
    started.append(proc)
    return proc.pid


def test_named_devices_make_the_plan_and_its_concurrency() -> None:
    plan = plan_devices("0, 1,GPU-8f3c-aa", slots_per_gpu=2)
    assert plan.devices == ("0", "1", "GPU-8f3c-aa") and plan.concurrency == 6
    assert plan.slots() == ["0", "1", "GPU-8f3c-aa", "0", "1", "GPU-8f3c-aa"]  # spread first


@pytest.mark.parametrize(
    ("gpus", "slots", "says"),
    [
        ("0,1,0", 1, "--gpus names 0 twice"),
        ("0", 0, "--slots-per-gpu must be at least 1 (got 0)"),
        ("", 1, "--gpus needs device ids"),
        ("0;1", 1, "'0;1' is not a device index"),
        ("-1", 1, "'-1' is not a device index"),
        ("auto", 1, "--gpus auto: cannot list the devices"),
    ],
)
def test_bad_plans_are_refused_with_one_line(gpus: str, slots: int, says: str) -> None:
    with pytest.raises(DeviceError) as caught:
        plan_devices(gpus, slots)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_the_visible_set_is_known_from_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert plan_devices("auto").devices == ("2", "3")
    assert plan_devices("3").devices == ("3",)
    with pytest.raises(DeviceError, match=r"no device 0 on this machine \(CUDA_VISIBLE_DEVICES: 2, 3\)"):
        plan_devices("0,3")


def test_auto_reads_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: A (UUID: GPU-a)'\necho 'GPU 1: B (UUID: GPU-b)'\n")
    smi.chmod(0o755)
    assert plan_devices("auto", 2) == DevicePlan(("0", "1"), 2)


def test_children_take_distinct_slots_and_a_dead_ones_slot_is_reused(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    table = DeviceTable.create(DevicePlan(("0", "1")))
    try:
        first, second, third = (sleeper(sleepers) for _ in range(3))
        assert table.take(first) == "0"
        assert table.take(second) == "1"
        assert table.take(first) == "0"  # asking again keeps the slot
        with pytest.raises(DeviceError, match="all 2 are held"):
            table.take(third, wait_s=0.2)  # never a busy one
        sleepers[0].kill()
        sleepers[0].wait()
        assert table.take(third) == "0"  # the slot its predecessor freed
        assert table.holders() == {second: "1", third: "0"}
    finally:
        table.remove()


def test_a_zombie_holds_no_slot(sleepers: list[subprocess.Popen[bytes]]) -> None:
    table = DeviceTable.create(DevicePlan(("7",)))
    try:
        holder = sleeper(sleepers)
        table.take(holder)
        sleepers[0].kill()  # not reaped yet: a zombie, as a pool child between death and join
        successor = sleeper(sleepers)
        assert table.take(successor, wait_s=5) == "7"
    finally:
        table.remove()


def test_a_reused_pid_is_not_the_old_holder(sleepers: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    table = DeviceTable(DevicePlan(("0",)), tmp_path / "slots.json")
    # A holder recorded with the pid of a live process but another start time: a pid reuse.
    live = sleeper(sleepers)
    (tmp_path / "slots.json").write_text(f'{{"0": [{live}, 1]}}')
    assert table.holders() == {}
    assert table.take(sleeper(sleepers)) == "0"


def _take_in_child(path: str, queue: multiprocessing.Queue[str], done: Any) -> None:
    queue.put(DeviceTable(DevicePlan(("0", "1", "2", "3"), 2), Path(path)).take())
    done.wait(20)  # alive, holding its slot, until every child has one


def test_children_starting_at_once_never_share_a_slot() -> None:
    table = DeviceTable.create(DevicePlan(("0", "1", "2", "3"), 2))
    # spawn, not fork: forking a multi-threaded pytest process warns on 3.12+ (an error here).
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[str] = context.Queue()
    done = context.Event()
    children = [context.Process(target=_take_in_child, args=(str(table.path), queue, done)) for _ in range(8)]
    try:
        for child in children:
            child.start()
        taken = sorted(queue.get(timeout=20) for _ in children)
        assert taken == ["0", "0", "1", "1", "2", "2", "3", "3"]  # two children per device, exactly
    finally:
        done.set()
        for child in children:
            child.join(10)
        table.remove()


def test_a_child_sees_only_its_device(
    monkeypatch: pytest.MonkeyPatch, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    table = devices.open_table(DevicePlan(("5",)))
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    try:
        assert devices.take_device() == "5"
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "5" and os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert devices.current_device() == "5"
        devices.release_device()
        assert table.holders() == {}
    finally:
        monkeypatch.setattr(devices, "_TABLE", None)
        monkeypatch.setattr(devices, "_DEVICE", None)
        table.remove()


def test_device_memory_is_what_nvml_lists_for_the_childs_pid_on_its_device(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    table = DeviceTable.create(DevicePlan(("0", "1")))
    child, other = sleeper(sleepers), sleeper(sleepers)
    listed = {"0": [(child, 3 * 2**30), (other, 2**30)], "1": [(other, 5 * 2**30)]}
    try:
        table.take(child)
        memory = DeviceMemory(table, lambda device: listed[device])
        assert memory(child) == ("0", 3 * 2**30)
        assert memory(12345678) is None  # not a child of this worker: no device
        assert held_by(other, "1", lambda device: listed[device]) == 5 * 2**30
    finally:
        table.remove()


class FakeNvml:
    """What pynvml answers on a machine with two GPUs (no such machine here: the boundary)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle-{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return f"handle-{uuid}"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        held: dict[str, list[tuple[int, int | None]]] = {
            "handle-1": [(41, 5 * 2**20), (42, None)],
            "handle-GPU-x": [(43, 2**20)],
        }
        return [type("Proc", (), {"pid": pid, "usedGpuMemory": used})() for pid, used in held.get(handle, [])]


def test_auto_lists_the_devices_nvml_counts_and_lets_nvml_go_before_the_fork(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert plan_devices("auto").devices == ("0", "1")
    assert nvml.calls == ["init", "shutdown"]  # no /dev/nvidia* left open in the main process


def test_nvml_reports_each_childs_device_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    table = DeviceTable(DevicePlan(("1", "GPU-x")), Path("/nonexistent"))
    monkeypatch.setattr(table, "holders", lambda: {41: "1", 42: "1", 43: "GPU-x"})
    memory = DeviceMemory.of(table)
    assert memory is not None
    assert memory(41) == ("1", 5 * 2**20) and memory(42) == ("1", 0) and memory(43) == ("GPU-x", 2**20)


def test_without_nvml_there_is_no_device_memory_measure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert DeviceMemory.of(DeviceTable(DevicePlan(("0",)), Path("/nonexistent"))) is None
