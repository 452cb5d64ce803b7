"""The public surface is ``__all__``, and the server side and the worker side never import each other."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

import mcp_celery_tasks

PACKAGE = "mcp_celery_tasks"
PACKAGE_DIR = Path(mcp_celery_tasks.__file__).resolve().parent

LAYERS: dict[str, frozenset[str]] = {
    "root": frozenset(),
    "telemetry": frozenset({"root"}),
    "store": frozenset({"root"}),
    "tools": frozenset({"root"}),
    "client": frozenset({"root"}),
    "broker": frozenset({"root", "telemetry", "tools"}),
    "backlog": frozenset({"root", "telemetry", "store", "broker"}),
    "maintenance": frozenset({"root", "telemetry", "store", "backlog"}),
    "worker": frozenset({"root", "telemetry", "store", "tools", "broker", "maintenance"}),
    "tasks": frozenset({"root", "telemetry", "store", "tools"}),
    "protocol": frozenset({"root", "telemetry", "store", "tools", "tasks"}),
    "api": frozenset(
        {"root", "telemetry", "store", "tools", "broker", "backlog", "tasks", "protocol", "console"}
    ),
    "console": frozenset({"root", "store", "tools", "tasks", "protocol", "client"}),
    "cli": frozenset(
        {"root", "telemetry", "store", "tools", "broker", "worker", "tasks", "protocol", "api", "client"}
    ),
    "testing": frozenset({"root", "store", "tools", "worker"}),
    "contrib": frozenset({"root", "store", "broker"}),
    "entry": frozenset({"root", "broker"}),
}
"""Folder -> the folders its modules may import at run time (its own always). The root's shared
leaves (errors, lifecycle, settings, wire, transient) are the floor; ``celery_main`` is an entry
point of Celery's own tools. The server side (tasks, protocol, api) and the worker side (worker,
maintenance) meet only in the folders both stand on. ``testing`` (the shipped test kit) runs the
worker side in memory: nothing imports it. ``contrib`` holds the optional framework
integrations (the Django admin app): nothing imports them either. ``console`` (the admins' web
pages) is mounted by ``api.server`` and stands on what the API does (it borrows the client's
``terminal.plain`` for untrusted text)."""
ENTRY_MODULES = frozenset({f"{PACKAGE}.celery_main"})
SERVER_FOLDERS = frozenset({"tasks", "protocol", "api"})
WORKER_FOLDERS = frozenset({"worker", "maintenance"})
CELERY_GLUE = frozenset({f"{PACKAGE}.worker.celery_glue"})
"""The only worker module that imports Celery (the package itself loads it lazily, for
``install``): the rest of the job pipeline is tested without it."""


def test_public_api_is_pinned() -> None:
    assert sorted(mcp_celery_tasks.__all__) == [
        "CheckpointTooLarge",
        "Elicit",
        "FileRoot",
        "InputNotSupported",
        "InputTimedOut",
        "McpError",
        "Mode",
        "SoftTimeLimitExceeded",
        "StepOrderError",
        "StepResultError",
        "TaskCancelled",
        "TaskContext",
        "ToolError",
        "current_context",
        "exponential",
        "fixed",
        "get_current_context",
        "tool",
    ]
    assert len(set(mcp_celery_tasks.__all__)) == len(mcp_celery_tasks.__all__)


def test_the_test_kit_is_pinned_and_ships_in_the_wheel() -> None:
    import tomllib

    from mcp_celery_tasks import testing

    assert sorted(testing.__all__) == [
        "ALL_CAPABILITIES",
        "InputRequest",
        "LogEntry",
        "MemoryInbox",
        "MemoryStore",
        "Report",
        "Row",
        "ToolRun",
        "UnansweredInput",
        "answer_everything",
        "run_tool",
    ]
    pyproject = tomllib.loads((PACKAGE_DIR.parent / "pyproject.toml").read_text())
    listed = set(pyproject["tool"]["setuptools"]["packages"])
    folders = {
        ".".join([PACKAGE, *init.parent.relative_to(PACKAGE_DIR).parts])
        for init in PACKAGE_DIR.rglob("__init__.py")
    }
    assert f"{PACKAGE}.testing" in folders
    assert folders <= listed, sorted(folders - listed)


def test_every_public_name_resolves() -> None:
    for name in mcp_celery_tasks.__all__:
        assert getattr(mcp_celery_tasks, name) is not None


# ---- the import graph, read with ast (nothing is imported) ------------------------------------


def _module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (subpackages included)."""
    modules: dict[str, Path] = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE_DIR).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join([PACKAGE, *parts])] = path
    return modules


MODULES = _module_files()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(nodes: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements that run when the module is imported (``if TYPE_CHECKING:`` skipped)."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _runtime_imports(node.orelse)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from _runtime_imports([child])


def _with_parents(module: str) -> set[str]:
    """Importing ``a.b.c`` runs ``a`` and ``a.b`` first."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & MODULES.keys()


def _resolve_relative(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


@functools.cache
def direct_imports(module: str) -> frozenset[str]:
    """Modules of the package that ``module`` imports at run time."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    found: set[str] = set()
    for node in _runtime_imports(tree.body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found |= _with_parents(alias.name)
            continue
        source = _resolve_relative(module, node)
        found |= _with_parents(source)
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            if submodule in MODULES:  # ``from pkg import submodule``
                found |= _with_parents(submodule)
    found.discard(module)
    return frozenset(found)


@functools.cache
def library_imports(module: str) -> frozenset[str]:
    """Top-level names of the libraries ``module`` imports at run time."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    found: set[str] = set()
    for node in _runtime_imports(tree.body):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return frozenset(found - {PACKAGE})


def reachable(module: str) -> set[str]:
    """Every package module that importing ``module`` runs, itself and its parents included."""
    seen: set[str] = set()
    todo = list(_with_parents(module))
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        todo.extend(direct_imports(current))
    return seen


def folder(module: str) -> str:
    """The layer a module lives in: its top folder under the package, or the root's leaves."""
    if module in ENTRY_MODULES:
        return "entry"
    parts = module.split(".")[1:]
    top = parts[0] if parts else ""
    return top if top in LAYERS and (len(parts) > 1 or MODULES[module].name == "__init__.py") else "root"


def test_every_folder_has_a_rule() -> None:
    folders = {folder(module) for module in MODULES}
    assert folders == LAYERS.keys()
    root = sorted(module for module in MODULES if folder(module) == "root")
    assert len(root) <= 8, root  # the package root stays a few shared leaves


def test_the_import_graph_sees_known_edges() -> None:
    # Guards the tests below against passing because the graph came out empty.
    assert f"{PACKAGE}.protocol.methods" in direct_imports(f"{PACKAGE}.protocol.dispatch")
    assert f"{PACKAGE}.maintenance.gc" in reachable(f"{PACKAGE}.worker.celery_glue")  # from pkg import gc
    assert f"{PACKAGE}.store.aio" in reachable(f"{PACKAGE}.api.server")  # via the store package
    assert f"{PACKAGE}.tasks.events" in reachable(f"{PACKAGE}.api.server")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_module_imports_only_the_layers_below_it(module: str) -> None:
    home = folder(module)
    upward = {
        target
        for target in direct_imports(module) - {PACKAGE}
        if folder(target) != home and folder(target) not in LAYERS[home]
    }
    assert not upward, f"{module} ({home}/) imports {sorted(upward)}"


def test_the_worker_side_never_reaches_the_server_side() -> None:
    for module in MODULES:
        if folder(module) in WORKER_FOLDERS:
            reached = {folder(name) for name in reachable(module)}
            assert not reached & SERVER_FOLDERS, module


def test_the_server_side_never_reaches_the_worker_side() -> None:
    for module in MODULES:
        if folder(module) in SERVER_FOLDERS:
            reached = {folder(name) for name in reachable(module)}
            assert not reached & WORKER_FOLDERS, module


@pytest.mark.parametrize(
    "module",
    sorted(
        m for m in MODULES if folder(m) in {"worker", "tools", "store", "testing"} and m not in CELERY_GLUE
    ),
)
def test_the_job_pipeline_never_imports_celery(module: str) -> None:
    reached = reachable(module)
    assert not reached & (CELERY_GLUE | {f"{PACKAGE}.broker.celery_app"})
    assert not any("celery" in library_imports(name) for name in reached)


def test_the_import_graph_sees_known_libraries() -> None:
    # Guards the test above against passing because no library import was seen.
    assert "celery" in library_imports(f"{PACKAGE}.worker.celery_glue")
    assert "kombu" in library_imports(f"{PACKAGE}.broker.channel")


def test_the_flat_paths_of_0_1_still_import_with_a_warning() -> None:
    import importlib
    import sys

    from mcp_celery_tasks import _moved

    for old, new in _moved.MOVED.items():
        assert f"{PACKAGE}.{new}" in MODULES, new
        sys.modules.pop(f"{PACKAGE}.{old}", None)
        with pytest.warns(DeprecationWarning, match=f"{PACKAGE}.{old} moved to {PACKAGE}.{new}"):
            module = importlib.import_module(f"{PACKAGE}.{old}")
        assert module is importlib.import_module(f"{PACKAGE}.{new}")
    sys.modules.pop(f"{PACKAGE}.server")
    with pytest.warns(DeprecationWarning):
        # the uvicorn factory of 0.1 (`from mcp_celery_tasks.server import from_environment`)
        from_environment = importlib.import_module(f"{PACKAGE}.server").from_environment
    assert callable(from_environment)
    from mcp_celery_tasks.client import TasksClient  # packages now, the same imports as before
    from mcp_celery_tasks.worker import install

    assert callable(install) and TasksClient.__module__ == f"{PACKAGE}.client.protocol"


def _service_fields_reached(path: Path) -> set[str]:
    """The ``services.<field>.<...>`` fields one module reaches through (``services.tasks.get``
    reaches ``tasks``; a bare ``services.settings`` read is a field, not a reach)."""
    reached: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "services"
        ):
            reached.add(node.value.attr)
    return reached


@pytest.mark.parametrize("path", sorted((PACKAGE_DIR / "protocol").glob("*.py")), ids=lambda p: p.name)
def test_handlers_reach_tasks_only_through_the_task_service(path: Path) -> None:
    """The store and the event hub sit behind ``TaskService``: no handler calls them itself."""
    assert not _service_fields_reached(path) & {"store", "events", "publisher"}


def test_the_reach_check_sees_a_store_call() -> None:
    probe = PACKAGE_DIR / "protocol" / "v2025_11_25.py"
    assert "tasks" in _service_fields_reached(probe)
