"""Suspend (issue 27): a job waiting for a human gives its worker slot back, and the answer
puts it back in the fair backlog; the tool runs again from the top and its question returns the
recorded answer at once.

Each test starts its own stack with one worker slot, two principals and a short
``suspend_after``, on Redis and on RabbitMQ.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from mcp_celery_tasks.broker.celery_app import create_app
from mcp_celery_tasks.broker.profiles import profile_for
from mcp_celery_tasks.settings import Settings
from tests.e2e.test_legacy import mcp1_python  # noqa: F401 - the 2025-11-25 client's venv
from tests.support import (
    AMQP_URL,
    REDIS_URL,
    ROOT,
    TEST_TOOL_MODULES,
    Client,
    Proc,
    meta,
    rabbitmq_reachable,
    stack_env,
    start_api,
    start_worker,
    wait_until,
)

TOKENS = {"alice": "alice-secret", "bob": "bob-secret"}
ELICITING = meta(True, elicitation={})
TOOLS = json.dumps([*json.loads(TEST_TOOL_MODULES), "tests.fixtures.suspend"])


@dataclass
class SuspendStack:
    url: str
    database_url: str
    env: dict[str, str]
    marks: Path
    api: Proc
    worker: Proc

    def client(self, who: str) -> Client:
        return Client(self.url, token=TOKENS[who])

    def row(self, task_id: str) -> dict[str, Any]:
        with psycopg.connect(self.database_url, autocommit=True, row_factory=dict_row) as conn:
            found = conn.execute("SELECT * FROM mcp_tasks WHERE task_id = %s", (task_id,)).fetchone()
        assert found is not None
        return found

    def count(self, tag: str, event: str) -> int:
        path = self.marks / f"{tag}.{event}"
        return len(path.read_text().splitlines()) if path.exists() else 0


def ask(client: Client, tool: str, tag: str) -> str:
    reply = client.request("tools/call", {"name": tool, "arguments": {"tag": tag}, "_meta": ELICITING})
    assert reply.result["resultType"] == "task", reply.body
    return str(reply.result["taskId"])


def accept(answer: str) -> dict[str, Any]:
    return {"action": "accept", "content": {"answer": answer}}


@contextlib.contextmanager
def suspend_stack(broker: str, database_url: str, tmp_path: Path, **extra: str) -> Iterator[SuspendStack]:
    if broker == "rabbitmq" and not rabbitmq_reachable():
        pytest.skip("no RabbitMQ on this machine")
    marks = tmp_path / "marks"
    marks.mkdir()
    env = stack_env(
        database_url,
        REDIS_URL if broker == "redis" else AMQP_URL,
        "sp" + database_url.rsplit("_", 1)[-1],
        **{
            "MCP_TASKS_AUTH_TOKENS": json.dumps(TOKENS),
            "MCP_TASKS_TOOL_MODULES": TOOLS,
            "MCP_TASKS_SUSPEND_AFTER_SECONDS": "0.5",
            "MCP_TASKS_MAX_WAITING_INPUTS_PER_PRINCIPAL": "1",
            "MCP_TEST_SUSPEND_MARKS": str(marks),
            **extra,
        },
    )
    worker = start_worker("suspend-worker", env, concurrency=1)
    api: Proc | None = None
    try:
        api, url = start_api("suspend-api", env)
        stack = SuspendStack(url, database_url, env, marks, api, worker)
        bob = stack.client("bob")
        bob.wait_status(bob.start("noop"), timeout=60)  # the worker is up
        bob.close()
        yield stack
    finally:
        if api is not None:
            api.stop()
        worker.stop(timeout=20)


def suspended(stack: SuspendStack, task_id: str) -> dict[str, Any] | None:
    row = stack.row(task_id)
    return row if row["suspended_at"] is not None else None


def wait_suspended(stack: SuspendStack, task_id: str, timeout: float = 30) -> dict[str, Any]:
    return wait_until(lambda: suspended(stack, task_id), timeout, 0.05, what="the job to suspend")


def queue_depth(stack: SuspendStack) -> int | None:
    settings = Settings(broker_url=stack.env["MCP_TASKS_BROKER_URL"])
    app = create_app(settings)
    try:
        return profile_for(settings.broker_url).queue_depth(app, stack.env["MCP_TASKS_DEFAULT_QUEUE"])
    finally:
        app.close()


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_suspended_jobs_free_the_only_slot_and_resume_with_their_answers(
    broker: str, db_url: str, tmp_path: Path
) -> None:
    with suspend_stack(broker, db_url, tmp_path) as stack:
        alice, bob = stack.client("alice"), stack.client("bob")
        tags = [f"a{n}" for n in range(3)]
        tasks = {tag: ask(alice, "sp_prework_ask", tag) for tag in tags}
        for task_id in tasks.values():
            row = wait_suspended(stack, task_id)
            assert row["status"] == "input_required" and row["worker"] is None and row["lease_until"] is None
            assert row["inbox"] is None and row["suspensions"] == 1
            # Neither an attempt nor a redelivery: the claim's attempt was given back.
            assert (row["attempts"], row["redeliveries"]) == (0, 0), row
            task = alice.get(task_id).result
            assert task["status"] == "input_required", task
            assert list(task["inputRequests"]) == ["go"], task
        # No message is held for a suspended job, and the one slot serves bob meanwhile.
        assert queue_depth(stack) == 0
        started = time.monotonic()
        noops = [bob.start("noop") for _ in range(20)]
        for task_id in noops:
            assert bob.wait_status(task_id, timeout=60)["status"] == "completed"
        bob_s = time.monotonic() - started
        assert all(suspended(stack, task_id) for task_id in tasks.values())

        for tag, task_id in tasks.items():
            assert alice.update(task_id, {"go": accept(f"yes {tag}")}).status == 200
        for tag, task_id in tasks.items():
            done = alice.wait_status(task_id, timeout=60)
            assert done["status"] == "completed", done
            assert done["result"]["content"][0]["text"] == f"{tag}: yes {tag}", done
            row = stack.row(task_id)
            assert row["suspended_at"] is None and row["resumed_at"] is not None
            assert (row["attempts"], row["redeliveries"], row["suspensions"]) == (1, 0, 1), row
            # Ran twice from the top (before the suspend, after the answer); its pre-work (a durable
            # step) ran once, and the code past the question once.
            assert (
                stack.count(tag, "run"),
                stack.count(tag, "prework"),
                stack.count(tag, "past-question"),
            ) == (2, 1, 1)
        print(f"\n{broker}: bob's 20 noops took {bob_s:.2f} s while alice's 3 tasks were suspended")


def test_a_job_suspends_at_once_when_its_queue_has_work_waiting(db_url: str, tmp_path: Path) -> None:
    # A long suspend_after: only the waiting work makes the job give its slot back.
    with suspend_stack("redis", db_url, tmp_path, MCP_TASKS_SUSPEND_AFTER_SECONDS="600") as stack:
        alice, bob = stack.client("alice"), stack.client("bob")
        task_id = ask(alice, "sp_prework_ask", "busy")
        wait_until(lambda: stack.row(task_id)["status"] == "input_required", 30, 0.05, what="the question")
        time.sleep(1.5)
        assert suspended(stack, task_id) is None  # nobody needs the slot: it stays resident
        noop = bob.start("noop")
        assert bob.wait_status(noop, timeout=30)["status"] == "completed"
        assert wait_suspended(stack, task_id, timeout=10)["suspensions"] == 1
        assert alice.update(task_id, {"go": accept("later")}).status == 200
        assert alice.wait_status(task_id, timeout=30)["result"]["content"][0]["text"] == "busy: later"


def test_a_tool_that_stays_resident_holds_its_slot(db_url: str, tmp_path: Path) -> None:
    with suspend_stack("redis", db_url, tmp_path) as stack:
        alice = stack.client("alice")
        task_id = ask(alice, "sp_resident_ask", "resident")
        wait_until(lambda: stack.row(task_id)["status"] == "input_required", 30, 0.05, what="the question")
        time.sleep(1.5)  # three times suspend_after
        row = stack.row(task_id)
        assert row["suspended_at"] is None and row["worker"] is not None
        assert alice.update(task_id, {"go": accept("here")}).status == 200
        assert alice.wait_status(task_id, timeout=30)["result"]["content"][0]["text"] == "resident: here"
        assert stack.count("resident", "run") == 1


def test_cancel_answers_and_a_second_question_of_suspended_tasks(db_url: str, tmp_path: Path) -> None:
    with suspend_stack("redis", db_url, tmp_path) as stack:
        alice, bob = stack.client("alice"), stack.client("bob")
        # Cancel while suspended: immediate (no process to stop); a late answer changes nothing.
        gone = ask(alice, "sp_prework_ask", "gone")
        wait_suspended(stack, gone)
        assert alice.cancel(gone).status == 200
        row = stack.row(gone)
        assert row["status"] == "cancelled" and row["finished_at"] is not None, row
        with psycopg.connect(stack.database_url, autocommit=True) as conn:
            shown = conn.execute(
                "SELECT status FROM mcp_tasks_overview WHERE task_id = %s", (gone,)
            ).fetchone()
        assert shown == ("cancelled",)  # not "stopping"
        assert alice.update(gone, {"go": accept("too late")}).status == 200
        time.sleep(1.0)
        assert stack.row(gone)["status"] == "cancelled" and stack.count("gone", "run") == 1

        # Another principal's answer, a key nobody asked, a malformed answer: nothing resumes.
        task_id = ask(alice, "sp_two_questions", "two")
        wait_suspended(stack, task_id)
        foreign = bob.update(task_id, {"first": accept("bob")})
        assert foreign.body["error"]["message"] == "Failed to retrieve task: Task not found", foreign.body
        assert alice.update(task_id, {"nope": accept("x")}).status == 200
        bad = alice.update(task_id, {"first": {"action": "accept", "content": {"answer": 5}}})
        assert bad.body["error"]["code"] == -32602, bad.body
        time.sleep(0.5)
        row = stack.row(task_id)
        assert row["suspended_at"] is not None and row["status"] == "input_required", row

        # Two questions: the job suspends at each, and resumes past each with its answer.
        assert alice.update(task_id, {"first": accept("x")}).status == 200
        assert alice.update(task_id, {"first": accept("again")}).status == 200  # answered twice: ignored
        second = wait_until(
            lambda: (r := stack.row(task_id))["suspensions"] == 2 and r["suspended_at"] is not None,
            30,
            0.05,
            what="the second suspend",
        )
        assert second
        task = alice.get(task_id).result
        assert list(task["inputRequests"]) == ["second"], task
        assert alice.update(task_id, {"second": accept("y")}).status == 200
        done = alice.wait_status(task_id, timeout=30)
        assert done["result"]["content"][0]["text"] == "x+y", done
        assert (stack.count("two", "run"), stack.count("two", "between")) == (3, 2)
        assert stack.row(task_id)["attempts"] == 1


def _rabbit_consumer_timeout(ms: int | None = None) -> int | None:
    """RabbitMQ's ``consumer_timeout`` (ms), set first when ``ms`` is given (new channels get it)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        return None
    if ms is not None:
        subprocess.run([ctl, "eval", f"application:set_env(rabbit, consumer_timeout, {ms})."], check=True,
                       capture_output=True, timeout=30)  # fmt: skip
    shown = subprocess.run(
        [ctl, "eval", "application:get_env(rabbit, consumer_timeout)."],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    found = re.search(r"\{ok,(\d+)\}", shown)
    return int(found.group(1)) if found else None


@pytest.mark.serial  # it lowers the broker's consumer timeout for every channel opened meanwhile
def test_a_suspended_wait_outlives_the_brokers_consumer_timeout(db_url: str, tmp_path: Path) -> None:
    """RabbitMQ closes the channel of a consumer that holds a message past ``consumer_timeout``
    (30 min by default); a suspended job holds none, so its human may answer after lunch."""
    if not rabbitmq_reachable():
        pytest.skip("no RabbitMQ on this machine")
    before = _rabbit_consumer_timeout()
    if before is None:
        pytest.skip("rabbitmqctl cannot reach the local RabbitMQ")
    try:
        assert _rabbit_consumer_timeout(3000) == 3000
        limits = {"MCP_TASKS_RABBITMQ_CONSUMER_TIMEOUT_SECONDS": "3", "MCP_TASKS_INPUT_TIMEOUT_SECONDS": "2"}
        with suspend_stack("rabbitmq", db_url, tmp_path, **limits) as stack:
            alice, bob = stack.client("alice"), stack.client("bob")
            task_id = ask(alice, "sp_prework_ask", "lunch")
            wait_suspended(stack, task_id)
            time.sleep(8.0)  # well past the broker's limit
            assert bob.wait_status(bob.start("noop"), timeout=30)["status"] == "completed"
            assert alice.update(task_id, {"go": accept("after lunch")}).status == 200
            done = alice.wait_status(task_id, timeout=30)
            assert done["result"]["content"][0]["text"] == "lunch: after lunch", done
            row = stack.row(task_id)
            assert (row["attempts"], row["redeliveries"]) == (1, 0), row
            assert stack.count("lunch", "run") == 2
    finally:
        _rabbit_consumer_timeout(before)


def test_a_synchronous_call_suspends_between_its_mrtr_rounds(db_url: str, tmp_path: Path) -> None:
    """2026-07-28 without the tasks extension: the first round answers input_required; the job
    suspends while the client is away; the retry's answer resumes it and gets the result."""
    with suspend_stack("redis", db_url, tmp_path) as stack:
        alice = stack.client("alice")
        params = {
            "name": "sp_prework_ask",
            "arguments": {"tag": "mrtr"},
            "_meta": meta(False, elicitation={}),
        }
        first = alice.request("tools/call", params).result
        assert first["resultType"] == "input_required", first
        with psycopg.connect(stack.database_url, autocommit=True) as conn:
            found = conn.execute(
                "SELECT task_id FROM mcp_tasks WHERE tool_name = 'sp_prework_ask'"
            ).fetchone()
        assert found is not None
        (task_id,) = found
        wait_suspended(stack, task_id)
        retry = alice.request(
            "tools/call",
            {**params, "inputResponses": {"go": accept("sync")}, "requestState": first["requestState"]},
        )
        assert retry.result["resultType"] == "complete", retry.body
        assert retry.result["content"][0]["text"] == "mrtr: sync"
        assert (stack.count("mrtr", "run"), stack.row(task_id)["suspensions"]) == (2, 1)


def test_a_2025_11_25_client_answers_after_the_job_suspended(
    db_url: str,
    tmp_path: Path,
    mcp1_python: str,  # noqa: F811
) -> None:
    with suspend_stack("redis", db_url, tmp_path) as stack:
        run = subprocess.run(
            [mcp1_python, str(ROOT / "tests" / "e2e" / "legacy" / "mcp1_suspend_client.py"),
             stack.url, TOKENS["alice"], "2.0"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        assert json.loads(run.stdout.splitlines()[-1]) == {"text": "legacy: legacy", "isError": False}
        with psycopg.connect(stack.database_url, autocommit=True) as conn:
            found = conn.execute(
                "SELECT suspensions FROM mcp_tasks WHERE tool_name = 'sp_prework_ask'"
            ).fetchone()
        assert found is not None
        (suspensions,) = found
        assert suspensions == 1 and stack.count("legacy", "run") == 2
