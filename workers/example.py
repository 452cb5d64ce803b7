from mcp_celery_tasks import FileRoot, TaskContext, tool


@tool(retention_seconds=3600, poll_interval_ms=500)
def count_words(ctx: TaskContext, paths: list[str]) -> dict[str, int]:
    """Count the words of each file, one by one (paths in the files directory, or file:// URLs)."""
    root = FileRoot.require_env("MCP_EXAMPLES_FILES_ROOT")  # nothing outside it is ever read
    counts: dict[str, int] = {}
    for done, path in enumerate(paths, start=1):
        ctx.raise_if_cancelled()
        ctx.report(f"{done}/{len(paths)}: reading {path}")
        counts[path] = len(root.read_text(path).split())
    return counts
