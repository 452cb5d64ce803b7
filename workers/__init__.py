"""Example tool modules: what a team reads, runs with ``mcp-celery-tasks dev``, then replaces.

Importing this package registers every example tool below it. The benchmark and conformance
fixtures live under ``tests/fixtures`` and are never served unless a test configures them.
"""

from workers import example, search_logs, summarize, train_model, train_torch

__all__ = ["example", "search_logs", "summarize", "train_model", "train_torch"]
