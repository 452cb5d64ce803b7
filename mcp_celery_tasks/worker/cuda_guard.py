"""No CUDA before fork: a worker whose main process initialised CUDA refuses to start.

A prefork pool forks its children from the main process, and CUDA cannot be initialised again in
a forked child ("Cannot re-initialize CUDA in forked subprocess"): a tool module that touches
``torch.cuda`` (or any CUDA library) when it is imported breaks every job of the pool, late and
obscurely. So the worker imports its tool modules one at a time and looks, after each, for the
signs that CUDA came up in this process, whatever the framework:

- ``torch.cuda.is_initialized()``, when torch is imported;
- a descriptor open on ``/dev/nvidia*`` (the driver's device files, opened by ``cuInit``);
- the CUDA driver library (``libcuda.so``) mapped into the process (``/proc/self/maps``): it is
  loaded only by something about to use CUDA.

The first module after which a sign shows is named in a one-line refusal with the fix: import the
framework inside the tool function, where it runs in the child, after its device is chosen.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["CudaInParent", "cuda_sign", "load_checked"]

DRIVER_LIBRARY = "libcuda.so"
DEVICE_FILES = "/dev/nvidia"


class CudaInParent(RuntimeError):
    """CUDA was initialised in the worker's main process; the message is the one-line refusal."""


def cuda_sign() -> str | None:
    """What shows that CUDA is initialised (or about to be) in this process; None if nothing."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    if callable(is_initialized) and is_initialized():
        return "torch.cuda is initialised"
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(DEVICE_FILES):
            return f"{target} is open"
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        path = parts[5] if len(parts) == 6 else ""
        if os.path.basename(path).startswith(DRIVER_LIBRARY):
            return f"the CUDA driver {path} is loaded"
    return None


def refusal(module: str, sign: str) -> str:
    return (
        f"worker: CUDA was initialised in the main process by {module} ({sign}); a prefork pool "
        "cannot use CUDA in its children after that. Import torch (or the CUDA library) inside "
        "the tool function, not at module level"
    )


def load_checked(modules: Iterable[str], load: Callable[[list[str]], None]) -> None:
    """Load the tool modules one by one with ``load``; refuse once CUDA shows.

    Raises:
        CudaInParent: naming the first module after which CUDA was initialised (or "a module
            imported before the tool modules" when it already was).
    """
    sign = cuda_sign()
    if sign is not None:
        raise CudaInParent(refusal("a module imported before the tool modules", sign))
    for module in modules:
        load([module])
        sign = cuda_sign()
        if sign is not None:
            raise CudaInParent(refusal(f"the tool module {module!r}", sign))
