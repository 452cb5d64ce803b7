"""The README's tool example is a real, tested file."""

from __future__ import annotations

import re

from tests.support import ROOT


def test_readme_example_is_identical_to_workers_example() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    example = (ROOT / "workers" / "example.py").read_text()
    assert example in blocks
    assert len(example.strip().splitlines()) <= 16


def test_readme_first_screen_gives_the_run_and_test_commands() -> None:
    first_screen = (ROOT / "README.md").read_text().splitlines()[:8]
    commands = [line.split("#")[0].strip() for line in first_screen if line.startswith("./scripts/")]
    assert commands == ["./scripts/dev", "./scripts/test"]


def test_readme_configuration_table_matches_settings() -> None:
    from mcp_celery_tasks.settings import markdown_table

    readme = (ROOT / "README.md").read_text()
    section = readme.split("<!-- settings-table -->\n", 1)[1].split("\n<!-- /settings-table -->", 1)[0]
    assert section.strip() == markdown_table().strip()
