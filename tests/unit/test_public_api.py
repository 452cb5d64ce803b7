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

SERVER_SIDE = (
    "server", "intake", "app", "dispatch", "methods", "rpc", "modern", "legacy", "push", "mrtr",
    "service", "events", "auth", "quotas",
)  # fmt: skip
"""DESIGN §4's server side: the HTTP edge, the composition root, the protocol and the service."""
WORKER_ONLY = ("worker", "gc", "runner", "runtime", "leases", "observe")
"""The worker side: the Celery glue, the job runner, the runtime under a job's context, beat jobs
(``context`` itself is the tool authors' API, which the registry reads on both sides)."""
CELERY_FREE = ("runner", "runtime", "leases", "observe", "context")
"""The job pipeline: everything but ``worker.run_tool`` itself, testable without Celery."""
SERVER_ONLY = tuple(name for name in SERVER_SIDE if name != "auth")


def test_public_api_is_pinned() -> None:
    assert sorted(mcp_celery_tasks.__all__) == [
        "Elicit",
        "FileRoot",
        "InputNotSupported",
        "InputTimedOut",
        "McpError",
        "Mode",
        "SoftTimeLimitExceeded",
        "TaskCancelled",
        "TaskContext",
        "ToolError",
        "current_context",
        "get_current_context",
        "tool",
    ]
    assert len(set(mcp_celery_tasks.__all__)) == len(mcp_celery_tasks.__all__)


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


def qualified(names: tuple[str, ...]) -> set[str]:
    return {f"{PACKAGE}.{name}" for name in names} & MODULES.keys()


def test_the_import_graph_sees_known_edges() -> None:
    # Guards the two tests below against passing because the graph came out empty.
    assert f"{PACKAGE}.methods" in direct_imports(f"{PACKAGE}.dispatch")  # from pkg import methods
    assert f"{PACKAGE}.gc" in reachable(f"{PACKAGE}.worker")
    assert f"{PACKAGE}.store.aio" in reachable(f"{PACKAGE}.server")  # via the store package
    assert f"{PACKAGE}.events" in reachable(f"{PACKAGE}.server")


@pytest.mark.parametrize("side", SERVER_SIDE)
def test_server_side_module_never_imports_the_worker_side(side: str) -> None:
    module = f"{PACKAGE}.{side}"
    assert module in MODULES
    assert not reachable(module) & qualified(WORKER_ONLY)


def test_worker_never_imports_the_server_side() -> None:
    assert not reachable(f"{PACKAGE}.worker") & qualified(SERVER_ONLY)


def test_gc_never_imports_the_server_side() -> None:
    assert not reachable(f"{PACKAGE}.gc") & qualified(SERVER_ONLY)


@pytest.mark.parametrize("module", CELERY_FREE)
def test_the_job_pipeline_never_imports_celery(module: str) -> None:
    reached = reachable(f"{PACKAGE}.{module}")
    assert not reached & qualified(("celery_app", "worker", "cli"))
    assert not any("celery" in library_imports(name) for name in reached)


def test_the_import_graph_sees_known_libraries() -> None:
    # Guards the test above against passing because no library import was seen.
    assert "celery" in library_imports(f"{PACKAGE}.worker")
    assert "kombu" in library_imports(f"{PACKAGE}.broker")
