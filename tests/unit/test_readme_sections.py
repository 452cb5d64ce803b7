"""The README's tools table and tool-module recipe stay true to the code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

# Prints the markdown table of the tools some modules register (run in a fresh interpreter:
# the registry is process-wide).
TABLE = """
import sys
from mcp_celery_tasks.tools.registry import all_tools, load_tool_modules
load_tool_modules(sys.argv[1:])
print("| Tool | Mode | Queue | Arguments (`[optional]`) | What it does |")
print("|---|---|---|---|---|")
for spec in all_tools():
    required = set(spec.input_schema.get("required") or [])
    names = spec.input_schema.get("properties") or {}
    args = ", ".join(f"`{n}`" if n in required else f"`[{n}]`" for n in names)
    summary = (spec.description or "").splitlines()[0]
    print(f"| `{spec.name}` | {spec.mode} | `{spec.queue or 'mcp.default'}` | {args} | {summary} |")
"""


def _section(marker: str) -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split(f"<!-- {marker} -->\n", 1)[1].split(f"\n<!-- /{marker} -->", 1)[0]


def test_readme_tools_table_matches_what_dev_serves() -> None:
    from mcp_celery_tasks.cli.dev.stack import EXAMPLES

    ran = subprocess.run(
        [sys.executable, "-c", TABLE, *EXAMPLES], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert _section("tools-table").strip() == ran.stdout.strip()


def _python_block(first_line: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if b.startswith(first_line)]
    return str(block)


def _probe_example(tmp_path: Path, module: str, probe: str) -> object:
    """Write the README's ``# myproject/<module>.py`` block as a package, run ``probe`` (Python
    that prints JSON) beside it in a fresh interpreter, and return what it printed."""
    package = tmp_path / "myproject"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / f"{module}.py").write_text(_python_block(f"# myproject/{module}.py"))
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path, env={"PYTHONPATH": f"{tmp_path}:{ROOT}"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def test_readme_tool_module_recipe_registers_its_tool(tmp_path: Path) -> None:
    probe = (
        "import json; from mcp_celery_tasks.tools.registry import all_tools, load_tool_modules; "
        "load_tool_modules(['myproject.tools']); "
        "print(json.dumps({s.name: s.input_schema for s in all_tools()}))"
    )
    schemas = _probe_example(tmp_path, "tools", probe)
    assert isinstance(schemas, dict)
    schema = schemas["countdown"]
    assert schema["properties"]["seconds"]["type"] == "integer" and "required" not in schema


def test_readme_testing_example_runs_and_passes(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_my_tools.py").write_text(_python_block("# tests/test_my_tools.py"))
    # anyio's pytest plugin is not the example's business (before anyio 4.15 it imports a name
    # pytest 9.2 deprecated, an error under -W error on the floors' venv).
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:asyncio",
        "-p",
        "no:anyio",
    ]
    ran = subprocess.run(
        [*command, "-W", "error", "tests"],
        cwd=tmp_path, env={"PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 passed" in ran.stdout, ran.stdout


def test_readme_durable_steps_example_runs_and_records_its_step_and_checkpoint(tmp_path: Path) -> None:
    package = tmp_path / "myproject"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pipeline.py").write_text(_python_block("# myproject/pipeline.py"))
    probe = (
        "import json; from mcp_celery_tasks.testing import run_tool; from myproject.pipeline import score; "
        "run = run_tool(score, {'source': 'db', 'rounds': 3}); "
        "print(json.dumps([run.structured, [r.message for r in run.reports], run.is_error]))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path, env={"PYTHONPATH": f"{tmp_path}:{ROOT}"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    structured, reports, is_error = json.loads(ran.stdout)
    total = sum(i * i for i in range(100))
    assert not is_error and structured == {"round": 3, "total": total + total / 2 + total / 3}
    assert reports == ["round 1/3", "round 2/3", "round 3/3"]


def test_readme_concurrency_example_declares_its_limits(tmp_path: Path) -> None:
    probe = (
        "import json; from mcp_celery_tasks.tools.registry import get_tool, load_tool_modules; "
        "load_tool_modules(['myproject.train']); t, r = get_tool('train_model'), get_tool('render'); "
        "print(json.dumps([t.concurrency_group({'model': 'moons'}), r.concurrency_group({'scene': 'x'})]))"
    )
    assert _probe_example(tmp_path, "train", probe) == [["model=moons", 1], ["", 8]]
