"""Benchmark of the ``search_logs`` example tool (run by hand; pytest never collects this file).

    # the scanning core in this process (generates the logs on first use, then reuses them)
    .venv/bin/python tests/bench/search_logs_bench.py inprocess --dir /tmp/search-logs-bench

    # end to end: the tool called as a task on a running server (./scripts/dev), polled to the
    # end, then a second call cancelled mid-scan; --dir must lie inside the server's
    # MCP_EXAMPLES_FILES_ROOT (with dev: <data dir>/files)
    .venv/bin/python tests/bench/search_logs_bench.py e2e --dir .mcp-tasks/files/bench \
        --url http://127.0.0.1:8000/mcp [--token T] [--database-url postgresql://…/mcp_tasks]

The log directory holds ``--files`` files with ``--lines`` lines in all (5 million by default),
realistic application log lines with a known number of lines matching the default pattern
(``manifest.json`` records it; the benchmark checks the count). The server's worker must be able
to read the directory (same machine). The pattern runs on RE2, as in the tool
(``compile_pattern``); ``--naive`` also times a plain per-line loop with Python's ``re``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_celery_tasks import FileRoot  # noqa: E402
from workers.line_regex import compile_pattern  # noqa: E402
from workers.search_logs import find_files, scan  # noqa: E402

DEFAULT_PATTERN = r"ERROR \[payments\] .*timeout"
GENERATOR_VERSION = 1

SERVICES = ["api-gateway", "orders", "payments", "inventory", "auth", "search", "billing", "mailer"]
PATHS = ["/v1/orders", "/v1/orders/{id}", "/v1/cart", "/v1/users/{id}", "/v1/search", "/healthz", "/v1/pay"]
METHODS = ["GET", "GET", "GET", "POST", "PUT", "DELETE"]
INFO = [
    "{method} {path} {status} {ms}ms user=u{user} request_id={rid}",
    "cache hit ratio {pct}% over {n} keys",
    "processed batch of {n} events in {ms}ms",
    "connection pool: {n} active, {m} idle",
]
DEBUG = ["sql: SELECT * FROM orders WHERE id = {id} ({ms}ms)", "retry budget {n}/{m} request_id={rid}"]
WARN = [
    "slow response {ms}ms for {method} {path} request_id={rid}",
    "upstream timeout after {ms}ms, retrying ({n}/3) request_id={rid}",
    "deprecated header X-Api-Version from client c{user}",
]
ERRORS = [
    "upstream timeout after {ms}ms calling {other} request_id={rid}",
    "failed to charge card: declined (code {n}) request_id={rid}",
    "unhandled exception in worker {n}: KeyError('sku') request_id={rid}",
    "database deadlock detected, transaction rolled back after {ms}ms",
]


def _line(rng: random.Random, second: int) -> str:
    roll = rng.random()
    level, templates = (
        ("INFO ", INFO) if roll < 0.80 else ("DEBUG", DEBUG) if roll < 0.90 else
        ("WARN ", WARN) if roll < 0.97 else ("ERROR", ERRORS)
    )  # fmt: skip
    fields = {
        "method": rng.choice(METHODS),
        "path": rng.choice(PATHS).replace("{id}", str(rng.randrange(1, 99999))),
        "status": rng.choice((200, 200, 200, 201, 204, 404, 500)),
        "ms": rng.randrange(1, 5000),
        "user": rng.randrange(1, 10000),
        "rid": f"{rng.getrandbits(32):08x}",
        "pct": rng.randrange(50, 100),
        "n": rng.randrange(1, 500),
        "m": rng.randrange(1, 50),
        "id": rng.randrange(1, 10**6),
        "other": rng.choice(SERVICES),
    }
    hours, rest = divmod(second % 86400, 3600)
    stamp = f"2026-03-14T{hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{rng.randrange(1000):03d}Z"
    return f"{stamp} {level} [{rng.choice(SERVICES)}] {rng.choice(templates).format(**fields)}\n"


def ensure_logs(directory: Path, lines: int, files: int, pattern: str) -> dict[str, Any]:
    """Generate the log directory (or reuse it) and return its manifest."""
    manifest_path = directory / "manifest.json"
    wanted = {"version": GENERATOR_VERSION, "lines": lines, "files": files, "pattern": pattern}
    if manifest_path.exists():
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        if {k: manifest.get(k) for k in wanted} == wanted:
            return manifest
    directory.mkdir(parents=True, exist_ok=True)
    regex = re.compile(pattern)
    rng = random.Random(20260314)
    matches = 0
    started = time.perf_counter()
    per_file = [lines // files + (1 if i < lines % files else 0) for i in range(files)]
    for index, count in enumerate(per_file):
        sub = directory / f"host-{index % 3}"
        sub.mkdir(exist_ok=True)
        with open(sub / f"app-{index:02d}.log", "w", encoding="utf-8") as out:
            batch: list[str] = []
            for n in range(count):
                line = _line(rng, n // 40)
                if regex.search(line):
                    matches += 1
                batch.append(line)
                if len(batch) == 10_000:
                    out.writelines(batch)
                    batch.clear()
            out.writelines(batch)
    manifest = {
        **wanted,
        "matches": matches,
        "bytes": sum(p.stat().st_size for p in directory.rglob("*.log")),
    }
    manifest_path.write_text(json.dumps(manifest, indent=2))
    print(f"generated {lines} lines in {files} files in {time.perf_counter() - started:.1f}s", flush=True)
    return manifest


def run_inprocess(args: argparse.Namespace, manifest: dict[str, Any]) -> None:
    root = FileRoot(args.dir.resolve())
    paths = find_files(root, ".", "*.log")
    regex = compile_pattern(args.pattern)
    progress_calls = 0

    def on_progress(lines: int, matches: int) -> None:
        nonlocal progress_calls
        progress_calls += 1

    def should_stop(lines: int, matches: int) -> bool:
        return False

    rates: list[float] = []
    for run in range(1, args.repeat + 1):
        started = time.perf_counter()
        result = scan(root, paths, regex, on_progress, should_stop, pause_every=None)
        elapsed = time.perf_counter() - started
        rate = result.lines_scanned / elapsed
        rates.append(rate)
        expected = manifest["matches"] if args.pattern == manifest["pattern"] else None
        check = "" if expected is None else (" (expected)" if result.match_count == expected else " MISMATCH")
        print(
            f"run {run}: {result.lines_scanned} lines, {result.match_count} matches{check} "
            f"in {elapsed:.3f}s = {rate / 1e6:.2f} M lines/s, {manifest['bytes'] / elapsed / 1e6:.0f} MB/s"
        )
    print(f"median {statistics.median(rates) / 1e6:.2f} M lines/s over {args.repeat} runs")
    if args.naive:
        started = time.perf_counter()
        count = lines = 0
        plain = re.compile(args.pattern)
        for path in paths:
            with open(path, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    lines += 1
                    if plain.search(line):
                        count += 1
        elapsed = time.perf_counter() - started
        rate = lines / elapsed / 1e6
        print(f"naive loop: {lines} lines, {count} matches in {elapsed:.3f}s = {rate:.2f} M lines/s")


class Mcp:
    """Just enough of a 2026-07-28 HTTP client for tools/call and tasks/*."""

    def __init__(self, url: str, token: str | None) -> None:
        import httpx

        self.url = url
        self.http = httpx.Client(timeout=60)
        self.token = token
        self.next_id = 0

    def request(self, method: str, params: dict[str, Any], name: str) -> dict[str, Any]:
        self.next_id += 1
        params = {
            **params,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {
                    "extensions": {"io.modelcontextprotocol/tasks": {}}
                },
                "io.modelcontextprotocol/clientInfo": {"name": "search-logs-bench", "version": "0"},
            },
        }
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": method,
            "Mcp-Name": name,
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        reply = self.http.post(self.url, json=body, headers=headers).json()
        if "error" in reply:
            raise SystemExit(f"{method} failed: {reply['error']}")
        result: dict[str, Any] = reply["result"]
        return result

    def start(self, arguments: dict[str, Any]) -> str:
        created = self.request("tools/call", {"name": "search_logs", "arguments": arguments}, "search_logs")
        if created.get("resultType") != "task":
            raise SystemExit(f"expected a task, got {created}")
        return str(created["taskId"])

    def get(self, task_id: str) -> dict[str, Any]:
        return self.request("tasks/get", {"taskId": task_id}, task_id)


def run_e2e(args: argparse.Namespace, manifest: dict[str, Any]) -> None:
    mcp = Mcp(args.url, args.token)
    arguments = {"directory": str(args.dir), "pattern": args.pattern, "max_matches": 10**9}
    # 1. A whole scan, polled every 50 ms.
    started = time.perf_counter()
    task_id = mcp.start(arguments)
    while (task := mcp.get(task_id))["status"] in ("working", "input_required"):
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    if task["status"] != "completed" or task["result"].get("isError"):
        raise SystemExit(f"the search did not complete: {task}")
    found = task["result"]["structuredContent"]
    ok = "expected" if found["match_count"] == manifest["matches"] else "MISMATCH"
    print(
        f"e2e: {found['lines_scanned']} lines, {found['match_count']} matches ({ok}) in {elapsed:.3f}s "
        f"(call to completed status) = {found['lines_scanned'] / elapsed / 1e6:.2f} M lines/s"
    )
    if args.database_url:
        runtime, waited = _row_times(
            args.database_url, task_id, "finished_at - started_at, started_at - created_at"
        )
        print(f"e2e: the job ran {runtime * 1000:.0f} ms in the worker after waiting {waited * 1000:.0f} ms")
    # 2. Cancel mid-scan, once progress shows.
    task_id = mcp.start(arguments)
    while not re.match(r"[1-9]\d* lines scanned", mcp.get(task_id).get("statusMessage") or ""):
        time.sleep(0.02)
    message = mcp.get(task_id).get("statusMessage")
    cancel_sent = time.perf_counter()
    mcp.request("tasks/cancel", {"taskId": task_id}, task_id)
    while mcp.get(task_id)["status"] != "cancelled":
        time.sleep(0.005)
    seen = time.perf_counter() - cancel_sent
    print(f"e2e cancel at {message!r}: tasks/cancel to cancelled status {seen * 1000:.1f} ms")
    if args.database_url:
        (stopped,) = _row_times(args.database_url, task_id, "finished_at - cancel_requested_at")
        print(f"e2e cancel: the worker stopped {stopped * 1000:.1f} ms after the cancel")


def _row_times(database_url: str, task_id: str, columns: str) -> tuple[float, ...]:
    """Intervals (seconds) read from the task's row once the worker has finished with it."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                f"SELECT {columns} FROM mcp_tasks WHERE task_id = %s AND finished_at IS NOT NULL",
                (task_id,),
            ).fetchone()
            if row is not None:
                return tuple(interval.total_seconds() for interval in row)
            time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("mode", choices=["inprocess", "e2e"])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/search-logs-bench"))
    parser.add_argument("--lines", type=int, default=5_000_000)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--pattern", default=DEFAULT_PATTERN)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--naive", action="store_true", help="also time a plain per-line Python loop")
    parser.add_argument("--url", default="http://127.0.0.1:8000/mcp")
    parser.add_argument("--token")
    parser.add_argument("--database-url", help="also measure when the worker stopped (mcp_tasks)")
    args = parser.parse_args()
    manifest = ensure_logs(args.dir, args.lines, args.files, DEFAULT_PATTERN)
    print(
        f"{manifest['lines']} lines, {manifest['bytes'] / 1e6:.0f} MB in {manifest['files']} files under "
        f"{args.dir}; {manifest['matches']} lines match {manifest['pattern']!r}"
    )
    if args.mode == "inprocess":
        run_inprocess(args, manifest)
    else:
        run_e2e(args, manifest)


if __name__ == "__main__":
    main()
