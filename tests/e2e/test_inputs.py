"""Tools asking the client for input mid-job, over real HTTP, Redis, Postgres and a prefork worker.

Tasked calls: the task goes ``input_required`` with ``inputRequests`` on tasks/get and the
client answers with tasks/update. Synchronous calls (no tasks extension) use MRTR: tools/call
answers ``resultType: "input_required"`` with a sealed ``requestState`` and the client retries.
Every test leaves no job blocked on input (the shared worker has two processes).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from mcp_types import jsonrpc as codes

from tests.support import TERMINAL, Client, Reply, Stack, meta, wait_until

ELICIT = "elicitation/create"
CONFIRM_SCHEMA = {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]}
YES = {"action": "accept", "content": {"confirm": True}}
LLM_ANSWER = {
    "role": "assistant",
    "content": {"type": "text", "text": "hello"},
    "model": "test-model",
    "stopReason": "endTurn",
}
ROOTS_ANSWER = {"roots": [{"uri": "file:///tmp/project", "name": "project"}]}


# ---- helpers ---------------------------------------------------------------------------------


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}.txt"


def call(
    client: Client, name: str, arguments: dict[str, Any], *, extension: bool = True, **extra: Any
) -> Reply:
    """tools/call declaring the tasks extension (or not) plus the capabilities in ``extra``'s ``caps``."""
    caps: dict[str, Any] = extra.pop("caps", {})
    params: dict[str, Any] = {"name": name, "arguments": arguments, "_meta": meta(extension, **caps)}
    params.update(extra)
    return client.request("tools/call", params)


def input_rows(stack: Stack, task_id: str) -> list[dict[str, Any]]:
    with stack.db() as conn:
        rows = conn.execute(
            "SELECT key, method, params, response, superseded, answered_at "
            "FROM mcp_task_inputs WHERE task_id = %s ORDER BY requested_at, key",
            (task_id,),
        ).fetchall()
    names = ("key", "method", "params", "response", "superseded", "answered_at")
    return [dict(zip(names, row, strict=True)) for row in rows]


def task_count(stack: Stack, tool_name: str) -> int:
    with stack.db() as conn:
        found = conn.execute("SELECT count(*) FROM mcp_tasks WHERE tool_name = %s", (tool_name,)).fetchone()
    assert found is not None
    return int(found[0])


def sync_task_id(stack: Stack, tool_name: str, filename: str) -> str:
    """The task behind a synchronous call (MRTR answers never name it)."""
    with stack.db() as conn:
        found = conn.execute(
            "SELECT task_id FROM mcp_tasks WHERE tool_name = %s AND arguments ->> 'filename' = %s",
            (tool_name, filename),
        ).fetchone()
    assert found is not None, f"no {tool_name} task for {filename}"
    return str(found[0])


class Tasks:
    """Starts tasks and cancels whatever is still running at teardown, so no job stays blocked."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.started: list[str] = []

    def start(self, name: str, arguments: dict[str, Any] | None = None, **caps: Any) -> str:
        reply = call(self.client, name, arguments or {}, caps=caps)
        created = reply.result
        assert created["resultType"] == "task", created
        self.track(created["taskId"])
        return str(created["taskId"])

    def track(self, task_id: str) -> str:
        self.started.append(task_id)
        return task_id

    def wait_inputs(self, task_id: str, count: int = 1, timeout: float = 20) -> dict[str, Any]:
        """Wait until the task is input_required with ``count`` outstanding requests."""

        def asking() -> dict[str, Any] | None:
            task = self.client.get(task_id).result
            assert task["status"] not in TERMINAL, f"the task ended while waiting for input: {task}"
            requests = task.get("inputRequests") or {}
            return task if task["status"] == "input_required" and len(requests) == count else None

        return wait_until(asking, timeout, what=f"{count} outstanding input request(s)")

    def only_key(self, task_id: str) -> str:
        requests = self.wait_inputs(task_id)["inputRequests"]
        (key,) = requests
        return str(key)

    def cleanup(self) -> None:
        for task_id in self.started:
            self.client.cancel(task_id)


@pytest.fixture
def tasks(client: Client) -> Iterator[Tasks]:
    tracker = Tasks(client)
    yield tracker
    tracker.cleanup()


def assert_ack(reply: Reply) -> None:
    assert reply.status == 200, reply.body
    ack = reply.result
    assert ack["resultType"] == "complete"
    assert {"taskId", "status", "result", "error", "inputRequests"}.isdisjoint(ack)


def assert_invalid_params(reply: Reply) -> None:
    assert reply.error["code"] == codes.INVALID_PARAMS, reply.body


# ---- tasks/update -------------------------------------------------------------------------------


def test_elicitation_makes_the_task_input_required_and_an_accepted_answer_completes_it(
    tasks: Tasks, client: Client, stack: Stack
) -> None:
    filename = unique("report")
    task_id = tasks.start("confirm_delete", {"filename": filename}, elicitation={})
    task = tasks.wait_inputs(task_id)
    assert task["resultType"] == "complete"
    assert "result" not in task and "error" not in task
    ((key, request),) = task["inputRequests"].items()
    assert request == {
        "method": ELICIT,
        "params": {"mode": "form", "message": f"Delete {filename}?", "requestedSchema": CONFIRM_SCHEMA},
    }

    assert_ack(client.update(task_id, {key: YES}))

    done = client.wait_status(task_id)
    assert done["status"] == "completed"
    assert done["result"]["isError"] is False
    assert done["result"]["content"] == [{"type": "text", "text": f"Deleted {filename}"}]
    assert "inputRequests" not in done
    (row,) = input_rows(stack, task_id)
    assert row["key"] == key and row["response"] == YES and not row["superseded"]


def test_a_declined_elicitation_reaches_the_tool_as_declined(tasks: Tasks, client: Client) -> None:
    filename = unique("keep")
    task_id = tasks.start("confirm_delete", {"filename": filename}, elicitation={})
    key = tasks.only_key(task_id)
    assert_ack(client.update(task_id, {key: {"action": "decline"}}))
    done = client.wait_status(task_id)
    assert done["result"]["content"][0]["text"] == f"Kept {filename} (decline)"


def test_a_partial_answer_leaves_only_the_other_key_outstanding_until_it_is_answered(
    tasks: Tasks, client: Client
) -> None:
    task_id = tasks.start("multi_input", elicitation={})
    task = tasks.wait_inputs(task_id, count=2)
    assert set(task["inputRequests"]) == {"first", "second"}
    assert all(entry["method"] == ELICIT for entry in task["inputRequests"].values())

    assert_ack(client.update(task_id, {"first": {"action": "accept", "content": {"name": "A"}}}))
    # The very next tasks/get: the answered key is gone, the other is still asked (S-27, S-29).
    after = client.get(task_id).result
    assert after["status"] == "input_required"
    assert set(after["inputRequests"]) == {"second"}

    assert_ack(client.update(task_id, {"second": {"action": "decline"}}))
    done = client.wait_status(task_id)
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "got first=accept, second=decline"


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param({"action": "accept", "content": {"confirm": "yes"}}, id="wrong-type"),
        pytest.param({"action": "accept", "content": {}}, id="missing-required-field"),
        pytest.param({"action": "accept"}, id="accept-without-content"),
        pytest.param({"action": "decline", "content": {"confirm": True}}, id="content-with-decline"),
        pytest.param({"action": "maybe"}, id="unknown-action"),
        pytest.param("yes", id="not-an-object"),
    ],
)
def test_an_invalid_elicitation_answer_is_minus_32602_and_records_nothing(
    answer: Any, tasks: Tasks, client: Client, stack: Stack
) -> None:
    task_id = tasks.start("confirm_delete", {"filename": unique("invalid")}, elicitation={})
    key = tasks.only_key(task_id)

    reply = client.update(task_id, {key: answer})

    assert_invalid_params(reply)
    task = client.get(task_id).result
    assert task["status"] == "input_required"
    assert set(task["inputRequests"]) == {key}
    (row,) = input_rows(stack, task_id)
    assert row["response"] is None and row["answered_at"] is None
    # The question is still answerable.
    assert_ack(client.update(task_id, {key: YES}))
    assert client.wait_status(task_id)["result"]["content"][0]["text"].startswith("Deleted ")


def answer_concurrently(stack: Stack, task_id: str, answers: dict[str, Any]) -> list[Reply]:
    """One tasks/update per key, each on its own connection, released together."""
    clients = [stack.client() for _ in answers]
    barrier = threading.Barrier(len(clients))

    def send(each: Client, key: str) -> Reply:
        barrier.wait()
        return each.update(task_id, {key: answers[key]})

    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            return list(pool.map(send, clients, answers))
    finally:
        for each in clients:
            each.close()


CONCURRENT_ROUNDS = 10


def test_concurrent_updates_answering_different_keys_resume_the_task(
    tasks: Tasks, client: Client, stack: Stack
) -> None:
    for _ in range(CONCURRENT_ROUNDS):
        # The tool keeps working for a while after both answers, so its status is observable.
        task_id = tasks.start("t_two_at_once_then_work", {"seconds": 5}, elicitation={})
        tasks.wait_inputs(task_id, count=2)
        replies = answer_concurrently(
            stack, task_id, {"a": {"action": "decline"}, "b": {"action": "decline"}}
        )
        for reply in replies:
            assert_ack(reply)

        task = client.get(task_id).result
        # Both keys are answered: the task must not claim to need input it does not ask for.
        assert task["status"] in ("working", "completed"), task
        assert not task.get("inputRequests"), task

        assert_ack(client.cancel(task_id))

        def stopped(t: str = task_id) -> bool:
            return stack.row(t)["finished_at"] is not None

        wait_until(stopped, 10, what="the worker to stop")


def test_one_invalid_answer_rejects_the_whole_update_including_the_valid_one(
    tasks: Tasks, client: Client, stack: Stack
) -> None:
    task_id = tasks.start("multi_input", elicitation={})
    tasks.wait_inputs(task_id, count=2)

    reply = client.update(
        task_id,
        {
            "first": {"action": "accept", "content": {"name": "valid"}},
            "second": {"action": "accept", "content": {"name": 42}},
        },
    )

    assert_invalid_params(reply)
    task = client.get(task_id).result
    assert task["status"] == "input_required"
    assert set(task["inputRequests"]) == {"first", "second"}
    assert [row["response"] for row in input_rows(stack, task_id)] == [None, None]
    assert_ack(client.update(task_id, {"first": {"action": "cancel"}, "second": {"action": "cancel"}}))
    assert client.wait_status(task_id)["result"]["content"][0]["text"] == "got first=cancel, second=cancel"


def test_unknown_keys_are_ignored_and_acknowledged(tasks: Tasks, client: Client, stack: Stack) -> None:
    task_id = tasks.start("confirm_delete", {"filename": unique("unknown")}, elicitation={})
    key = tasks.only_key(task_id)

    # Values under keys that are not outstanding are not even validated (S-31).
    assert_ack(client.update(task_id, {"unknown-key": {"ignored": True}}))
    task = client.get(task_id).result
    assert task["status"] == "input_required"
    assert set(task["inputRequests"]) == {key}
    assert [row["key"] for row in input_rows(stack, task_id)] == [key]

    # Mixed with a real answer: the real one is recorded, the unknown one ignored.
    assert_ack(client.update(task_id, {"never-issued": {"action": "accept"}, key: YES}))
    assert client.wait_status(task_id)["status"] == "completed"
    assert [row["key"] for row in input_rows(stack, task_id)] == [key]


def test_an_update_to_a_terminal_task_is_acknowledged_and_changes_nothing(
    tasks: Tasks, client: Client, stack: Stack
) -> None:
    filename = unique("terminal")
    task_id = tasks.start("confirm_delete", {"filename": filename}, elicitation={})
    key = tasks.only_key(task_id)
    assert_ack(client.update(task_id, {key: YES}))
    done = client.wait_status(task_id)

    assert_ack(client.update(task_id, {key: {"action": "decline"}}))
    assert_ack(client.update(task_id, {key: "not even an answer", "other": {}}))

    again = client.get(task_id).result
    assert again["status"] == "completed"
    assert again["result"] == done["result"]
    (row,) = input_rows(stack, task_id)
    assert row["response"] == YES


def test_an_update_to_a_cancelled_task_is_acknowledged(tasks: Tasks, client: Client) -> None:
    task_id = tasks.start("confirm_delete", {"filename": unique("cancelled")}, elicitation={})
    key = tasks.only_key(task_id)
    assert_ack(client.cancel(task_id))
    assert_ack(client.update(task_id, {key: YES}))
    assert client.get(task_id).result["status"] == "cancelled"


def test_answering_an_already_answered_key_is_ignored(tasks: Tasks, client: Client, stack: Stack) -> None:
    task_id = tasks.start("multi_input", elicitation={})
    tasks.wait_inputs(task_id, count=2)
    accepted = {"action": "accept", "content": {"name": "first answer"}}
    assert_ack(client.update(task_id, {"first": accepted}))

    assert_ack(client.update(task_id, {"first": {"action": "decline"}}))
    # Not outstanding any more, so not validated either.
    assert_ack(client.update(task_id, {"first": {"action": "nonsense"}}))

    task = client.get(task_id).result
    assert task["status"] == "input_required"
    assert set(task["inputRequests"]) == {"second"}
    responses = {row["key"]: row["response"] for row in input_rows(stack, task_id)}
    assert responses == {"first": accepted, "second": None}
    assert_ack(client.update(task_id, {"second": {"action": "decline"}}))
    assert client.wait_status(task_id)["result"]["content"][0]["text"] == "got first=accept, second=decline"


def test_keys_are_never_reused_and_the_second_question_appears_only_after_the_first_is_answered(
    tasks: Tasks, client: Client, stack: Stack
) -> None:
    task_id = tasks.start("t_two_questions", {"marker": "keys"}, elicitation={})
    first = tasks.wait_inputs(task_id)["inputRequests"]
    ((first_key, first_request),) = first.items()
    assert first_request["params"]["message"] == "First?"
    # While the first is outstanding, the second was never asked.
    assert client.get(task_id).result["inputRequests"] == first
    assert [row["key"] for row in input_rows(stack, task_id)] == [first_key]

    first_answer = {"action": "accept", "content": {"value": "one"}}
    assert_ack(client.update(task_id, {first_key: first_answer}))

    def second_asked() -> dict[str, Any] | None:
        task = client.get(task_id).result
        requests = task.get("inputRequests") or {}
        return requests if task["status"] == "input_required" and first_key not in requests else None

    second = wait_until(second_asked, 20, what="the second question")
    ((second_key, second_request),) = second.items()
    assert second_key != first_key
    assert second_request["params"]["message"] == "Second?"
    assert second_request["params"]["requestedSchema"] == CONFIRM_SCHEMA

    # The first key is answered: answering it again is ignored and does not satisfy the second.
    assert_ack(client.update(task_id, {first_key: YES}))
    assert set(client.get(task_id).result["inputRequests"]) == {second_key}

    assert_ack(client.update(task_id, {second_key: YES}))
    done = client.wait_status(task_id)
    assert done["status"] == "completed"
    assert done["result"]["structuredContent"] == {"first": first_answer, "second": YES, "attempt": 1}
    rows = input_rows(stack, task_id)
    assert [row["key"] for row in rows] == [first_key, second_key]
    assert [row["response"] for row in rows] == [first_answer, YES]
    assert not any(row["superseded"] for row in rows)


# ---- cancel, timeout, capabilities ------------------------------------------------------------


def test_cancel_while_input_required_is_immediate_and_wakes_the_blocked_worker(
    tasks: Tasks, client: Client, stack: Stack
) -> None:
    task_id = tasks.start("confirm_delete", {"filename": unique("cancel")}, elicitation={})
    tasks.wait_inputs(task_id)
    assert stack.row(task_id)["finished_at"] is None

    assert_ack(client.cancel(task_id))
    cancelled = client.get(task_id).result
    assert cancelled["status"] == "cancelled"
    assert "inputRequests" not in cancelled

    row = wait_until(
        lambda: (r := stack.row(task_id))["finished_at"] is not None and r, 10, what="the worker to stop"
    )
    # The wake-up reached the worker blocked on its inbox (typically ~10 ms): without it the worker
    # would only notice at its periodic re-read, up to 3 s later.
    assert row["finished_at"] - row["cancel_requested_at"] < timedelta(seconds=1)
    assert row["status"] == "cancelled"
    assert row["result"] is None and row["lease_until"] is None


def test_an_unanswered_question_times_out_into_an_error_result_and_is_superseded(
    tasks: Tasks, client: Client, stack: Stack
) -> None:
    task_id = tasks.start("t_short_wait", elicitation={})
    key = tasks.only_key(task_id)

    done = client.wait_status(task_id, timeout=20)

    assert done["status"] == "completed"
    assert done["result"]["isError"] is True
    assert "Nobody answered the input request within" in done["result"]["content"][0]["text"]
    (row,) = input_rows(stack, task_id)
    assert row["key"] == key
    assert row["superseded"] is True and row["response"] is None
    # A late answer is acknowledged and ignored.
    assert_ack(client.update(task_id, {key: YES}))
    (row,) = input_rows(stack, task_id)
    assert row["response"] is None


def test_a_tool_cannot_elicit_from_a_call_that_did_not_declare_elicitation(
    tasks: Tasks, client: Client, stack: Stack
) -> None:
    # client.start declares the tasks extension only.
    task_id = tasks.track(client.start("confirm_delete", {"filename": unique("nocap")}))

    done = client.wait_status(task_id)

    assert done["status"] == "completed"
    assert done["result"]["isError"] is True
    assert "'elicitation' capability" in done["result"]["content"][0]["text"]
    assert input_rows(stack, task_id) == []


def test_sampling_and_roots_are_asked_at_once_and_their_answers_validated(
    tasks: Tasks, client: Client, stack: Stack
) -> None:
    task_id = tasks.start("t_sample_and_roots", sampling={}, roots={})
    task = tasks.wait_inputs(task_id, count=2)
    requests = task["inputRequests"]
    assert requests["llm"]["method"] == "sampling/createMessage"
    assert requests["llm"]["params"]["maxTokens"] == 10
    assert requests["roots"] == {"method": "roots/list"}

    no_model = {"role": "assistant", "content": {"type": "text", "text": "hi"}}
    assert_invalid_params(client.update(task_id, {"llm": no_model}))
    assert_invalid_params(client.update(task_id, {"roots": {"roots": [{"name": "no uri"}]}}))
    assert_invalid_params(client.update(task_id, {"llm": LLM_ANSWER, "roots": {"roots": "none"}}))
    assert set(client.get(task_id).result["inputRequests"]) == {"llm", "roots"}
    assert [row["response"] for row in input_rows(stack, task_id)] == [None, None]

    assert_ack(client.update(task_id, {"llm": LLM_ANSWER, "roots": ROOTS_ANSWER}))

    done = client.wait_status(task_id)
    assert done["status"] == "completed"
    assert done["result"]["isError"] is False
    assert done["result"]["structuredContent"] == {"llm": LLM_ANSWER, "roots": ROOTS_ANSWER}


def test_sampling_without_the_roots_capability_is_refused_before_anything_is_asked(
    tasks: Tasks, client: Client, stack: Stack
) -> None:
    task_id = tasks.start("t_sample_and_roots", sampling={})
    done = client.wait_status(task_id)
    assert done["result"]["isError"] is True
    assert "'roots' capability" in done["result"]["content"][0]["text"]
    assert input_rows(stack, task_id) == []


def test_reusing_an_explicit_key_for_a_different_question_ends_the_task_with_an_error(
    tasks: Tasks, client: Client, stack: Stack
) -> None:
    task_id = tasks.start("t_key_reuse", elicitation={})
    assert tasks.only_key(task_id) == "same"
    assert_ack(client.update(task_id, {"same": YES}))

    done = client.wait_status(task_id)

    assert done["status"] == "completed"
    assert done["result"]["isError"] is True
    # The second question was never asked under the used key (nor any other).
    (row,) = input_rows(stack, task_id)
    assert row["key"] == "same" and row["response"] == YES
    assert row["params"]["message"] == "A?"


# ---- synchronous calls: MRTR --------------------------------------------------------------------


@pytest.fixture
def sync_cleanup(stack: Stack, client: Client) -> Iterator[list[str]]:
    """Filenames of synchronous confirm_delete calls; their tasks are cancelled at teardown."""
    filenames: list[str] = []
    yield filenames
    for filename in filenames:
        client.cancel(sync_task_id(stack, "confirm_delete", filename))


def mrtr_round_one(client: Client, filename: str) -> dict[str, Any]:
    reply = call(client, "confirm_delete", {"filename": filename}, extension=False, caps={"elicitation": {}})
    assert reply.status == 200, reply.body
    return reply.result


def test_a_synchronous_call_that_elicits_answers_input_required_then_the_retry_gets_the_result(
    client: Client, stack: Stack, sync_cleanup: list[str]
) -> None:
    filename = unique("sync")
    sync_cleanup.append(filename)

    first = mrtr_round_one(client, filename)

    assert first["resultType"] == "input_required"
    assert "taskId" not in first
    assert isinstance(first["requestState"], str) and first["requestState"]
    ((key, request),) = first["inputRequests"].items()
    assert request["method"] == ELICIT
    assert request["params"]["message"] == f"Delete {filename}?"
    assert request["params"]["requestedSchema"] == CONFIRM_SCHEMA

    retry = call(
        client,
        "confirm_delete",
        {"filename": filename},
        extension=False,
        caps={"elicitation": {}},
        inputResponses={key: YES},
        requestState=first["requestState"],
    )

    assert retry.status == 200, retry.body
    assert retry.result["resultType"] == "complete"
    assert retry.result["content"] == [{"type": "text", "text": f"Deleted {filename}"}]
    assert retry.result["isError"] is False
    assert "taskId" not in retry.result


def test_a_synchronous_call_asking_twice_takes_two_mrtr_rounds_with_fresh_keys(
    client: Client, stack: Stack
) -> None:
    marker = unique("rounds")
    caps: dict[str, Any] = {"elicitation": {}}
    arguments = {"marker": marker}
    try:
        first = call(client, "t_two_questions", arguments, extension=False, caps=caps).result
        assert first["resultType"] == "input_required" and "taskId" not in first
        ((first_key, first_request),) = first["inputRequests"].items()
        assert first_request["params"]["message"] == "First?"
        first_answer = {"action": "accept", "content": {"value": "one"}}

        second = call(
            client,
            "t_two_questions",
            arguments,
            extension=False,
            caps=caps,
            inputResponses={first_key: first_answer},
            requestState=first["requestState"],
        ).result

        assert second["resultType"] == "input_required" and "taskId" not in second
        ((second_key, second_request),) = second["inputRequests"].items()
        assert second_key != first_key
        assert second_request["params"]["message"] == "Second?"
        assert second["requestState"] != first["requestState"]

        final = call(
            client,
            "t_two_questions",
            arguments,
            extension=False,
            caps=caps,
            inputResponses={second_key: YES},
            requestState=second["requestState"],
        ).result

        assert final["resultType"] == "complete"
        assert final["structuredContent"] == {"first": first_answer, "second": YES, "attempt": 1}
    finally:
        with stack.db() as conn:
            found = conn.execute(
                "SELECT task_id FROM mcp_tasks WHERE arguments ->> 'marker' = %s", (marker,)
            ).fetchall()
        for (task_id,) in found:
            client.cancel(task_id)


def test_a_synchronous_retry_with_an_invalid_answer_is_minus_32602_and_the_question_stays(
    client: Client, stack: Stack, sync_cleanup: list[str]
) -> None:
    filename = unique("sync-invalid")
    sync_cleanup.append(filename)
    first = mrtr_round_one(client, filename)
    (key,) = first["inputRequests"]

    def retry(answer: Any) -> Reply:
        return call(
            client,
            "confirm_delete",
            {"filename": filename},
            extension=False,
            caps={"elicitation": {}},
            inputResponses={key: answer},
            requestState=first["requestState"],
        )

    assert_invalid_params(retry({"action": "accept", "content": {"confirm": "sure"}}))
    task_id = sync_task_id(stack, "confirm_delete", filename)
    assert [row["response"] for row in input_rows(stack, task_id)] == [None]
    assert stack.row(task_id)["status"] == "input_required"
    done = retry({"action": "decline"})
    assert done.result["content"] == [{"type": "text", "text": f"Kept {filename} (decline)"}]


def test_an_update_for_an_unknown_task_is_minus_32602(client: Client) -> None:
    assert_invalid_params(client.update("no-such-task", {"k": YES}))


def test_a_synchronous_call_without_elicitation_gets_32021_not_a_question(client: Client) -> None:
    # As before a task exists (MRTR): the request must declare what the job asks for (issue 16).
    reply = client.call_tool("confirm_delete", {"filename": unique("sync-nocap")}, extension=False)
    assert reply.status == 400 and reply.error["code"] == codes.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert reply.error["data"]["requiredCapabilities"] == {"elicitation": {}}
    assert "'elicitation' capability" in reply.error["message"]


def test_a_task_without_elicitation_ends_with_an_error_result(client: Client) -> None:
    task = client.wait_status(client.start("confirm_delete", {"filename": unique("task-nocap")}))
    assert task["status"] == "completed" and task["result"]["isError"] is True
    assert "'elicitation' capability" in task["result"]["content"][0]["text"]


def tamper(state: str) -> str:
    key_id, _, blob = state.partition(".")
    middle = len(blob) // 2
    flipped = "A" if blob[middle] != "A" else "B"
    return f"{key_id}.{blob[:middle]}{flipped}{blob[middle + 1 :]}"


def test_a_tampered_or_replayed_request_state_is_minus_32602(
    client: Client, stack: Stack, sync_cleanup: list[str]
) -> None:
    filename = unique("sealed")
    sync_cleanup.append(filename)
    first = mrtr_round_one(client, filename)
    (key,) = first["inputRequests"]
    state = first["requestState"]
    caps: dict[str, Any] = {"elicitation": {}}

    def retry(name: str, arguments: dict[str, Any], request_state: str) -> Reply:
        return call(
            client,
            name,
            arguments,
            extension=False,
            caps=caps,
            inputResponses={key: YES},
            requestState=request_state,
        )

    assert_invalid_params(retry("confirm_delete", {"filename": filename}, tamper(state)))
    assert_invalid_params(retry("confirm_delete", {"filename": filename}, "garbage"))
    # Replayed with other arguments, or by another tool.
    assert_invalid_params(retry("confirm_delete", {"filename": unique("other")}, state))
    assert_invalid_params(retry("t_two_questions", {"marker": filename}, state))

    # None of that reached the task: it still waits for its answer, and the genuine retry works.
    task_id = sync_task_id(stack, "confirm_delete", filename)
    assert [row["response"] for row in input_rows(stack, task_id)] == [None]
    done = retry("confirm_delete", {"filename": filename}, state)
    assert done.result["content"] == [{"type": "text", "text": f"Deleted {filename}"}]


def test_a_pre_task_request_state_cannot_be_replayed_by_another_tool(client: Client, stack: Stack) -> None:
    caps: dict[str, Any] = {"elicitation": {}}
    first = call(client, "test_tool_with_task", {}, caps=caps).result
    assert first["resultType"] == "input_required"
    before = task_count(stack, "multi_input")

    # Same (empty) arguments, another tool: the state is bound to the tool.
    reply = call(
        client,
        "multi_input",
        {},
        caps=caps,
        inputResponses={"user_name": {"action": "accept", "content": {"name": "Mallory"}}},
        requestState=first["requestState"],
    )

    assert_invalid_params(reply)
    assert task_count(stack, "multi_input") == before


# ---- ask_first: questions before the task exists ------------------------------------------------


def test_ask_first_asks_without_a_task_then_creates_the_task_with_the_answer(
    tasks: Tasks, client: Client, stack: Stack
) -> None:
    caps: dict[str, Any] = {"elicitation": {}}
    before = task_count(stack, "test_tool_with_task")

    first = call(client, "test_tool_with_task", {}, caps=caps)

    assert first.status == 200
    round_one = first.result
    assert round_one["resultType"] == "input_required"
    assert "taskId" not in round_one
    assert set(round_one["inputRequests"]) == {"user_name"}
    question = round_one["inputRequests"]["user_name"]
    assert question["method"] == ELICIT
    assert question["params"]["mode"] == "form"
    assert question["params"]["message"] == "What is your name?"
    assert question["params"]["requestedSchema"]["required"] == ["name"]
    assert round_one["requestState"]
    assert task_count(stack, "test_tool_with_task") == before

    second = call(
        client,
        "test_tool_with_task",
        {},
        caps=caps,
        inputResponses={"user_name": {"action": "accept", "content": {"name": "Alice"}}},
        requestState=round_one["requestState"],
    ).result

    assert second["resultType"] == "task"
    task_id = tasks.track(second["taskId"])
    done = client.wait_status(task_id)
    assert done["status"] == "completed"
    assert done["result"]["content"] == [{"type": "text", "text": "Hello, Alice!"}]
    assert input_rows(stack, task_id) == []


def test_a_pre_task_request_state_is_usable_once(tasks: Tasks, client: Client, stack: Stack) -> None:
    # Red team: a captured state could start the same round's task again within its lifetime.
    caps: dict[str, Any] = {"elicitation": {}}
    round_one = call(client, "test_tool_with_task", {}, caps=caps).result
    answers = {"user_name": {"action": "accept", "content": {"name": "Alice"}}}

    def retry() -> Reply:
        return call(
            client, "test_tool_with_task", {}, caps=caps, inputResponses=answers,
            requestState=round_one["requestState"],
        )  # fmt: skip

    created = retry().result
    assert created["resultType"] == "task"
    tasks.track(created["taskId"])
    before = task_count(stack, "test_tool_with_task")
    replayed = retry()
    assert_invalid_params(replayed)
    assert "already used" in replayed.error["message"]
    assert task_count(stack, "test_tool_with_task") == before


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param({"action": "accept", "content": {}}, id="missing-name"),
        pytest.param({"action": "accept", "content": {"name": 7}}, id="wrong-type"),
        pytest.param({"action": "decline", "content": {"name": "Alice"}}, id="content-with-decline"),
    ],
)
def test_ask_first_with_an_invalid_answer_is_minus_32602_and_creates_no_task(
    answer: dict[str, Any], client: Client, stack: Stack
) -> None:
    caps: dict[str, Any] = {"elicitation": {}}
    round_one = call(client, "test_tool_with_task", {}, caps=caps).result
    before = task_count(stack, "test_tool_with_task")

    reply = call(
        client,
        "test_tool_with_task",
        {},
        caps=caps,
        inputResponses={"user_name": answer},
        requestState=round_one["requestState"],
    )

    assert_invalid_params(reply)
    assert task_count(stack, "test_tool_with_task") == before


def test_ask_first_without_the_elicitation_capability_is_minus_32021(client: Client, stack: Stack) -> None:
    before = task_count(stack, "test_tool_with_task")
    reply = client.call_tool("test_tool_with_task")
    assert reply.status == 400
    assert reply.error["code"] == codes.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert reply.error["data"] == {"requiredCapabilities": {"elicitation": {}}}
    assert task_count(stack, "test_tool_with_task") == before
