"""Commits per second with and without ``pg_notify`` vs concurrent committers (run by hand).

    .venv/bin/python tests/bench/notify_commits.py [--admin-url postgresql://postgres@127.0.0.1:5432/postgres]

Plain single-row ``UPDATE`` commits scale with concurrency (group commit: one WAL flush for many
commits); commits of transactions that called ``NOTIFY`` are serialized by Postgres, so they stay
near one per WAL flush however many connections commit. Every outcome write of ours notifies
(docs/SCALING.md). Uses a scratch database ``mcp_perf_notify``.
"""

from __future__ import annotations

import argparse
import threading
import time

import psycopg

DB = "mcp_perf_notify"
PLAIN = "UPDATE t SET n = n + 1 WHERE id = %s"
NOTIFYING = (
    "WITH u AS (UPDATE t SET n = n + 1 WHERE id = %s RETURNING id) SELECT pg_notify('ch', id::text) FROM u"
)


def rate(dsn: str, threads: int, sql: str, per_thread: int) -> float:
    def work(k: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(per_thread):
                conn.execute(sql, ((k * per_thread + i) % 100_000 + 1,))

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return threads * per_thread / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--per-thread", type=int, default=400)
    args = parser.parse_args()
    with psycopg.connect(args.admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB}")
    dsn = args.admin_url.rsplit("/", 1)[0] + "/" + DB
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
            conn.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 100000) AS g")
        print("| concurrent committers | plain UPDATE commits/s | UPDATE + pg_notify commits/s |")
        print("| ---: | ---: | ---: |")
        for threads in (1, 8, 16):
            plain = rate(dsn, threads, PLAIN, args.per_thread)
            notifying = rate(dsn, threads, NOTIFYING, args.per_thread)
            print(f"| {threads} | {plain:,.0f} | {notifying:,.0f} |", flush=True)
    finally:
        with psycopg.connect(args.admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
