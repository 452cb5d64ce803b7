from mcp_celery_tasks import TaskContext, ToolError, tool


@tool(retention_seconds=3600, poll_interval_ms=500)
def count_words(ctx: TaskContext, urls: list[str]) -> dict[str, int]:
    """Count the words of each document, one by one; cancellable between documents."""
    counts: dict[str, int] = {}
    for done, url in enumerate(urls, start=1):
        ctx.raise_if_cancelled()
        ctx.report(f"{done}/{len(urls)}: reading {url}")
        if not url.startswith("file://"):
            raise ToolError(f"only file:// URLs are supported, not {url}")
        with open(url.removeprefix("file://"), encoding="utf-8") as document:
            counts[url] = len(document.read().split())
    return counts
