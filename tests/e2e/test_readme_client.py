"""The README's Python SDK snippet, run as written against a live stack."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from mcp_celery_tasks.cli.dev.stack import seed_example_files
from tests.support import ROOT, Stack


def test_readme_sdk_snippet_lists_the_tools_and_counts_words(stack: Stack, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (snippet,) = [b for b in blocks if "from mcp import Client" in b]
    assert 'Client("http://127.0.0.1:8000/mcp")' in snippet  # the dev stack's address, as documented
    files = Path(stack.env["MCP_EXAMPLES_FILES_ROOT"])
    seed_example_files(files)  # what dev puts in .mcp-tasks/files
    script = tmp_path / "client.py"
    script.write_text(snippet.replace("http://127.0.0.1:8000/mcp", stack.url))
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    tools_line, result_line = ran.stdout.strip().splitlines()
    assert {"count_words", "search_logs", "summarize_file", "train_model"} <= set(
        ast.literal_eval(tools_line)
    )
    words = len((files / "notes.txt").read_text().split())
    assert ast.literal_eval(result_line) == {"notes.txt": words}
    seed_example_files(tmp_path / "dev-files")
    dev_words = len((tmp_path / "dev-files" / "notes.txt").read_text().split())
    assert f"{{'notes.txt': {dev_words}}}" in snippet  # the comment shows what dev's notes.txt gives
