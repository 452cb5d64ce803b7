"""Honest answers while the API is cut off from Postgres (issue 28): one API process reaches the
suite's Postgres through a TCP proxy the test cuts (``proxy.CutProxy``), so nothing else that
uses the server notices. During the cut every request is answered within the short bound
(``db_unavailable_after_seconds``, 0.5 s), HTTP 503 with ``Retry-After`` and a JSON-RPC -32603
whose ``data`` says the database is unavailable and when to retry; a create whose row may have
been written says which task id to look up, and that task is there once the cut heals.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from mcp_types import jsonrpc as codes
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests import support
from tests.faults.proxy import CutProxy
from tests.faults.services import FaultServices
from tests.faults.stack import Call, FaultClient, FaultStack, percentile, running

BOUND_S = 0.5  # the default db_unavailable_after_seconds
SLACK_S = 0.5


def _proxied(dsn: str) -> tuple[CutProxy, str]:
    """A proxy to the database of ``dsn`` (a unix socket), and the DSN that goes through it."""
    info = conninfo_to_dict(dsn)
    socket_path = Path(str(info["host"])) / f".s.PGSQL.{info.get('port') or 5432}"
    proxy = CutProxy(socket_path)
    return proxy, make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))


def _assert_unavailable(call: Call, bound_s: float) -> None:
    assert call.status == 503, call.describe()
    assert call.headers.get("retry-after") == "1", call.headers
    assert call.body is not None and "Traceback" not in call.raw, call.describe()
    error = call.body["error"]
    assert error["code"] == codes.INTERNAL_ERROR, error
    assert error["message"].startswith("Temporarily unavailable"), error
    assert error["data"]["unavailable"] == "database" and error["data"]["retryAfterMs"] == 1000, error
    assert call.seconds < bound_s, f"answered after {call.seconds:.2f} s (bound {bound_s:g} s)"


@pytest.mark.timeout(120)
def test_an_api_cut_off_from_postgres_answers_503_with_retry_after_within_the_bound(
    services: FaultServices, fault_db: str
) -> None:
    proxy, through_proxy = _proxied(fault_db)
    stack = FaultStack(
        "cut-off", fault_db, services.broker.url, services.root / "runs" / "cut-off",
        MCP_TASKS_DATABASE_URL=through_proxy,
    )  # fmt: skip
    try:
        with running(stack):
            stack.start_api()  # no worker: the rows are what is checked
            client = FaultClient(stack.url, "alice")
            stack.closing(client)
            created = client.create(0)
            before = created.task_id
            assert before, created.describe()
            known = {before}
            proxy.cut()
            calls = []
            for _ in range(3):
                calls.append(client.get(before))
                calls.append(client.create(0))
            ms = [c.seconds * 1000 for c in calls]
            print(
                f"\ncut off: answers in p50 {percentile(ms, 50):.0f} ms, max {max(ms):.0f} ms: "
                + ", ".join(
                    f"{c.kind} {c.status} {c.seconds * 1000:.0f} ms {c.headers.get('retry-after')}"
                    for c in calls
                )
            )
            for call in calls:
                # A create may also read the principal's quota overrides first: two waits.
                _assert_unavailable(call, (2 if call.kind == "create" else 1) * BOUND_S + SLACK_S)
                data = (call.body or {})["error"]["data"]
                if data.get("maybeCreated"):
                    assert call.kind == "create" and data["taskId"], data
                    known.add(data["taskId"])
            proxy.heal()
            healed_at = time.monotonic()
            support.wait_until(lambda: client.get(before).ok, 15, 0.05, what="answers again")
            recovered_s = time.monotonic() - healed_at
            # Nothing was created behind the client's back: every row is one it was told of.
            rows = set(stack.rows())
            assert rows <= known, f"rows nobody was told of: {rows - known}"
            for task_id in known - {before}:
                seen = client.get(task_id)
                assert seen.ok or seen.error_code == codes.INVALID_PARAMS, seen.describe()
            print(f"cut off: answers again {recovered_s:.2f} s after the cut healed")
    finally:
        proxy.close()


@pytest.mark.timeout(120)
def test_a_create_whose_answer_was_lost_tells_the_client_which_task_to_look_up(
    services: FaultServices, fault_db: str
) -> None:
    proxy, through_proxy = _proxied(fault_db)
    stack = FaultStack(
        "lost-answer", fault_db, services.broker.url, services.root / "runs" / "lost-answer",
        MCP_TASKS_DATABASE_URL=through_proxy,
    )  # fmt: skip
    try:
        with running(stack):
            stack.start_api()
            client = FaultClient(stack.url, "alice")
            stack.closing(client)
            assert client.create(0).ok  # the pool is open and warm
            proxy.swallow_replies()  # the INSERT reaches Postgres and commits; its answer is lost
            got: list[Call] = []
            creating = threading.Thread(target=lambda: got.append(client.create(0)))
            creating.start()
            support.wait_until(lambda: len(stack.rows()) == 2, 10, 0.02, what="the row to be written")
            proxy.cut()  # ... and then the connection breaks
            creating.join(30)
            (call,) = got
            _assert_unavailable(call, 30)  # how long the answer took is the first test's concern
            data = (call.body or {})["error"]["data"]
            assert data.get("maybeCreated") is True and data.get("taskId"), call.describe()
            proxy.heal()
            support.wait_until(lambda: client.get(data["taskId"]).ok, 15, 0.05, what="answers again")
            seen = client.get(data["taskId"])
            assert seen.result["status"] == "working", seen.result  # there: not lost, not to redo
            assert data["taskId"] in stack.rows() and len(stack.rows()) == 2
            print(
                f"\nlost answer: 503 after {call.seconds:.2f} s with taskId {data['taskId'][:8]}…; it exists"
            )
    finally:
        proxy.close()
