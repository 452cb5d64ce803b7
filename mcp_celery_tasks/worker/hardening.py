"""Keeping a tool's isolated body away from the worker's credentials (Linux). No Celery here.

Three kernel switches, through ``ctypes`` (no dependency):

- ``undumpable()``: ``prctl(PR_SET_DUMPABLE, 0)`` on the worker's main process and its pool
  children. A process that is not dumpable has its ``/proc/<pid>/environ``, ``mem``, ``maps`` …
  guarded by the ptrace check, which then needs ``CAP_SYS_PTRACE``: a same-uid process without
  it can neither read them nor attach. Forked children inherit the flag; an ``exec`` resets it,
  so the body itself stays an ordinary process.
- ``die_with_parent()``: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` in the body: when the pool child
  dies (killed by the watchdog, the OOM killer, a deploy), the kernel kills the body with it.
- ``drop_capabilities()``: the body gives up every capability (bounding set emptied, then
  ``capset`` to nothing) and sets ``no_new_privs``: a worker running as root would otherwise
  pass the ptrace check by capability, and a setuid program could not give them back.

``clean_environment`` is what the body's environment keeps: everything but the server's
settings, the well-known variables that carry a database or broker URL, and any variable whose
value contains the configured database or broker URL or its password (an alias of the DSN).
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

__all__ = ["clean_environment", "die_with_parent", "drop_capabilities", "is_dumpable", "undumpable"]

_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4
_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_CAP_VERSION_3 = 0x20080522
_LAST_CAP = 63

SECRET_VARIABLES = frozenset(
    {
        "DATABASE_URL",
        "BROKER_URL",
        "CELERY_BROKER_URL",
        "CELERY_RESULT_BACKEND",
        "REDIS_URL",
        "AMQP_URL",
        "RABBITMQ_URL",
        "PGPASSWORD",
        "PGPASSFILE",
        "PGSERVICEFILE",
        "PGSERVICE",
        "PGUSER",
        "PGHOST",
        "PGHOSTADDR",
        "PGPORT",
        "PGDATABASE",
    }
)
"""Variables dropped by name (besides every ``MCP_TASKS_*`` one)."""


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc().prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}, {value}): {os.strerror(errno)}")


def undumpable() -> None:
    """Make this process (and the children it forks from now on) not dumpable."""
    _prctl(_PR_SET_DUMPABLE, 0)


def is_dumpable() -> bool:
    return bool(_libc().prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0))


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies; if the parent is gone already, die now."""
    parent = os.getppid()
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the prctl: no signal would come
        os.kill(os.getpid(), signal.SIGKILL)


def drop_capabilities() -> None:
    """Give up every capability for good (bounding set, effective, permitted, inheritable) and
    forbid regaining privileges through exec (``no_new_privs``)."""
    libc = _libc()
    for cap in range(_LAST_CAP + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last cap; EPERM unprivileged
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"capset: {os.strerror(errno)}")
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def _secret_fragments(urls: Iterable[str]) -> set[str]:
    """The URLs themselves and the passwords in them (a variable holding either is dropped)."""
    found: set[str] = set()
    for url in urls:
        if not url:
            continue
        found.add(url)
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        if password and len(password) >= 4:  # a one-letter password would match everything
            found.add(password)
    return found


def clean_environment(environ: Mapping[str, str], secret_urls: Iterable[str]) -> dict[str, str]:
    """``environ`` without what could reach the database or the broker (see the module doc)."""
    fragments = _secret_fragments(secret_urls)
    kept: dict[str, str] = {}
    for name, value in environ.items():
        if name.startswith("MCP_TASKS_") or name.upper() in SECRET_VARIABLES:
            continue
        if any(fragment in value for fragment in fragments):
            continue
        kept[name] = value
    return kept
