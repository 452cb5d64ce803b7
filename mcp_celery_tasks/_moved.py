"""The flat module paths of 0.1 (``mcp_celery_tasks.server``, ``.context``, ``.files``, …), kept
importable for one release: each resolves to its module in the package tree with a
``DeprecationWarning`` naming the new path. Nothing of ours imports them."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

PACKAGE = "mcp_celery_tasks"

MOVED = {
    "admin": "cli.admin.tasks",
    "admin_limits": "cli.admin.limits",
    "admincommon": "cli.admin.connect",
    "adminview": "cli.admin.view",
    "app": "api.compose",
    "asks": "worker.replay",
    "auth": "api.auth",
    "blips": "transient",
    "callcli": "client.call",
    "callforms": "client.forms",
    "callview": "client.view",
    "celery_app": "broker.celery_app",
    "channel": "broker.channel",
    "clihelp": "cli.help",
    "context": "tools.context",
    "db": "store.schema",
    "devguard": "cli.dev.guard",
    "devprocs": "cli.dev.procs",
    "devrecord": "cli.dev.record",
    "devstack": "cli.dev.stack",
    "dispatch": "protocol.dispatch",
    "embedded": "cli.dev.embedded",
    "events": "tasks.events",
    "fair": "backlog.release",
    "files": "tools.files",
    "gc": "maintenance.gc",
    "httpserver": "api.httpserver",
    "inputs": "tools.inputs",
    "intake": "api.intake",
    "jobprocess": "worker.child",
    "leases": "worker.leases",
    "legacy": "protocol.v2025_11_25",
    "logs": "telemetry.logs",
    "methods": "protocol.methods",
    "metrics": "telemetry.metrics",
    "migrate": "store.migrate",
    "modern": "protocol.v2026_07_28",
    "mrtr": "protocol.rounds",
    "observe": "worker.observe",
    "outbox": "backlog.publisher",
    "outcomes": "worker.outcomes",
    "push": "protocol.push",
    "quotas": "tasks.quotas",
    "registry": "tools.registry",
    "relay": "protocol.relay",
    "results": "tools.results",
    "rpc": "protocol.rpc",
    "runner": "worker.runner",
    "runtime": "worker.runtime",
    "sealing": "protocol.sealing",
    "server": "api.server",
    "service": "tasks.service",
    "tracing": "telemetry.tracing",
    "watchdog": "worker.watchdog",
}
"""Old module (under ``mcp_celery_tasks.``) -> its home now. ``worker``, ``client`` and ``cli`` are
packages now and answer their old imports themselves (``worker.install``, ``client.TasksClient``,
``python -m …cli``)."""


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != PACKAGE or name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, loader_state=f"{PACKAGE}.{MOVED[name]}")

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        home = str(spec.loader_state)
        warnings.warn(
            f"{spec.name} moved to {home}; the old path goes away in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(home)

    def exec_module(self, module: ModuleType) -> None:
        """The module ran when it was imported under its own name."""


def install() -> None:
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
