"""Soak test, run by hand (bounded): N clients creating, polling, answering and cancelling.

Starts its own API and prefork worker (JSON logs to files) on a fresh database and the
given broker, runs the clients for --minutes, waits for every task to settle, then reports
created, lost (never terminal), duplicated (a job that finished twice, from the worker's
task.finished log events), and the RSS of the API and the worker tree at start and end.

    .venv/bin/python tests/bench/soak.py --broker redis://127.0.0.1:6379/8 --minutes 10 --clients 50
    .venv/bin/python tests/bench/soak.py --broker amqp://guest:guest@127.0.0.1:5672// --minutes 10
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import signal
import threading
import time
import uuid

import psutil
import psycopg

from tests import support


def rss_mib(pid: int) -> float:
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


def client_loop(url: str, deadline: float, seen: list[str], lock: threading.Lock, errors: list[str]) -> None:
    client = support.Client(url)
    rng = random.Random()
    elicit = support.meta(elicitation={})
    while time.monotonic() < deadline:
        action = rng.random()
        try:
            if action < 0.5:
                task_id = client.start("sleep_ms", {"ms": rng.choice([0, 10, 50, 200])})
            elif action < 0.7:
                reply = client.request(
                    "tools/call", {"name": "confirm_delete", "arguments": {"filename": "s"}, "_meta": elicit}
                )
                task_id = reply.result["taskId"]
                task = client.wait_status(task_id, ("input_required", "completed", "failed", "cancelled"), 60)
                if task["status"] == "input_required":
                    key = next(iter(task["inputRequests"]))
                    client.update(task_id, {key: {"action": "accept", "content": {"confirm": True}}})
            else:
                task_id = client.start("spin", {"seconds": 5})
                time.sleep(rng.uniform(0.01, 0.3))
                client.cancel(task_id)
            with lock:
                seen.append(task_id)
            client.wait_status(task_id, timeout=120)
        except Exception as exc:  # report, keep going: the soak measures the server
            errors.append(repr(exc)[:200])
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/8")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=4, help="prefork children of the worker")
    args = parser.parse_args()

    name = f"mcp_soak_{uuid.uuid4().hex[:6]}"
    template = f"{name}_t"
    support.create_database(template)
    from mcp_celery_tasks.settings import Settings
    from mcp_celery_tasks.store import migrate

    migrate.upgrade(Settings(database_url=support.dsn_for(template)))
    dsn = support.create_database(name, template=template)
    env = support.stack_env(dsn, args.broker, name, MCP_TASKS_LEASE_SECONDS="10")
    worker = support.start_worker(f"soak-worker-{name}", env, concurrency=args.concurrency)
    api, url = support.start_api(f"soak-api-{name}", env)
    try:
        support.wait_until(
            lambda: support.Client(url).call_tool("greet", {"name": "x"}, extension=False).status == 200, 60
        )
        start_rss = (rss_mib(api.popen.pid), rss_mib(worker.popen.pid))
        seen: list[str] = []
        errors: list[str] = []
        lock = threading.Lock()
        deadline = time.monotonic() + args.minutes * 60
        threads = [
            threading.Thread(target=client_loop, args=(url, deadline, seen, lock, errors), daemon=True)
            for _ in range(args.clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(args.minutes * 60 + 300)
        end_rss = (rss_mib(api.popen.pid), rss_mib(worker.popen.pid))
        with psycopg.connect(dsn) as conn:
            rows: dict[str, str] = dict(
                conn.execute(
                    "SELECT task_id, status FROM mcp_tasks WHERE task_id = ANY(%s)", (seen,)
                ).fetchall()
            )
        lost = [t for t in seen if rows.get(t) not in ("completed", "failed", "cancelled")]
        finished: collections.Counter[str] = collections.Counter()
        for line in worker.log.read_text().splitlines():
            if line.startswith("{") and '"task.finished"' in line:
                finished[json.loads(line)["job_id"]] += 1
        duplicated = [job for job, count in finished.items() if count > 1]
        statuses = collections.Counter(rows.values())
        print(json.dumps({
            "broker": args.broker.split(":")[0], "minutes": args.minutes, "clients": args.clients,
            "created": len(seen), "statuses": statuses, "lost": len(lost), "duplicated": len(duplicated),
            "client_errors": len(errors), "first_errors": errors[:3],
            "rss_mib_start": {"api": round(start_rss[0], 1), "worker": round(start_rss[1], 1)},
            "rss_mib_end": {"api": round(end_rss[0], 1), "worker": round(end_rss[1], 1)},
        }, indent=2))  # fmt: skip
    finally:
        api.stop()
        worker.stop(signal.SIGQUIT, 20)
        support.drop_database(name)
        support.drop_database(template)


if __name__ == "__main__":
    main()
