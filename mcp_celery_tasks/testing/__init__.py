"""Test a team's tools without services: ``run_tool`` and the worker side in memory.

``run_tool`` calls a ``@tool`` as the server and a worker would (the same argument check, the
same ``JobRunner``, ``TaskContext`` and result mapping) on an in-memory store, and returns what
it came to::

    from mcp_celery_tasks.testing import run_tool

    def test_count_words() -> None:
        run = run_tool("count_words", {"text": "a b c"})
        assert run.structured == {"words": 3}

``MemoryStore`` and ``MemoryInbox`` are what it stands on: the store calls a running job makes,
with the SQL store's guards, held to ``WorkerStore`` by one contract suite.
"""

from __future__ import annotations

from mcp_celery_tasks.testing.memory import MemoryInbox, MemoryStore, Row, answer_everything
from mcp_celery_tasks.testing.run import (
    ALL_CAPABILITIES,
    InputRequest,
    LogEntry,
    Report,
    ToolRun,
    UnansweredInput,
    run_tool,
)

__all__ = [
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
