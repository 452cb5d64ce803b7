"""The method table: every JSON-RPC method this server answers, per protocol era.

Adding a method is one ``Method`` entry here plus its handler. Dispatch validates params with
the entry's model before the handler runs; the ``Mcp-Name`` rules, the methods of each era and
the metrics labels all come from this table.

Absent from 2026-07-28 on purpose: ``tasks/result`` and ``tasks/list`` (SEP-2663 removed them;
callers MUST get -32601), ``ping`` and ``initialize`` (removed by 2026-07-28).
"""

from __future__ import annotations

from typing import Any, Final

from mcp_celery_tasks.protocol import push, resources
from mcp_celery_tasks.protocol import v2025_11_25 as legacy
from mcp_celery_tasks.protocol import v2026_07_28 as modern
from mcp_celery_tasks.protocol.rpc import Method
from mcp_celery_tasks.wire import (
    MODERN_VERSION,
    CallToolParams,
    LegacyCallToolParams,
    LegacyListParams,
    LegacyParams,
    LegacyReadResourceParams,
    LegacyTaskParams,
    ListenParams,
    MetaParams,
    PagedParams,
    ReadResourceParams,
    SetLevelParams,
    TaskIdParams,
    TaskUpdateParams,
)

__all__ = ["LEGACY", "METHODS", "MODERN", "NAMES", "SUPPORTED_VERSIONS", "lookup"]

MODERN: Final = MODERN_VERSION
LEGACY: Final = "2025-11-25"
"""The handshake era: 2025-11-25 and the earlier versions ``initialize`` negotiates."""

SUPPORTED_VERSIONS: Final = (MODERN,)
"""Versions served statelessly (per-request ``_meta``); others answer -32022."""

METHODS: Final[tuple[Method[Any], ...]] = (
    Method("server/discover", MODERN, MetaParams, modern.discover),
    Method("tools/list", MODERN, PagedParams, modern.list_tools),
    Method(
        "tools/call",
        MODERN,
        CallToolParams,
        modern.call_tool,
        name_param="name",
        name_required=True,
        param_headers=True,
    ),
    Method("tasks/get", MODERN, TaskIdParams, modern.get_task, name_param="taskId", requires_tasks=True),
    Method(
        "tasks/update", MODERN, TaskUpdateParams, modern.update_task, name_param="taskId", requires_tasks=True
    ),
    Method(
        "tasks/cancel", MODERN, TaskIdParams, modern.cancel_task, name_param="taskId", requires_tasks=True
    ),
    Method("subscriptions/listen", MODERN, ListenParams, push.listen),
    Method(
        "resources/read",
        MODERN,
        ReadResourceParams,
        resources.read_resource,
        name_param="uri",
        name_required=True,
    ),
    Method("resources/list", MODERN, PagedParams, resources.list_resources),
    Method("resources/templates/list", MODERN, PagedParams, resources.list_templates),
    Method("initialize", LEGACY, LegacyParams, legacy.initialize),
    Method("ping", LEGACY, LegacyParams, legacy.ping, needs_session=True),
    Method("logging/setLevel", LEGACY, SetLevelParams, legacy.set_level, needs_session=True),
    Method("tools/list", LEGACY, LegacyListParams, legacy.list_tools, needs_session=True),
    Method("tools/call", LEGACY, LegacyCallToolParams, legacy.call_tool, needs_session=True),
    Method("tasks/get", LEGACY, LegacyTaskParams, legacy.get_task, needs_session=True),
    Method("tasks/result", LEGACY, LegacyTaskParams, legacy.task_result, needs_session=True),
    Method("tasks/list", LEGACY, LegacyListParams, legacy.list_tasks, needs_session=True),
    Method("tasks/cancel", LEGACY, LegacyTaskParams, legacy.cancel_task, needs_session=True),
    Method(
        "resources/read", LEGACY, LegacyReadResourceParams, resources.read_resource_legacy, needs_session=True
    ),
    Method("resources/list", LEGACY, LegacyListParams, resources.list_resources_legacy, needs_session=True),
    Method(
        "resources/templates/list",
        LEGACY,
        LegacyListParams,
        resources.list_templates_legacy,
        needs_session=True,
    ),
)

_INDEX: Final = {(method.era, method.name): method for method in METHODS}

NAMES: Final = frozenset(method.name for method in METHODS)
"""Every method name we serve: the metrics label of a request (anything else is ``other``)."""


def lookup(era: str, name: str) -> Method[Any] | None:
    return _INDEX.get((era, name))
