"""A tool's output that holds NUL characters (Postgres can store none, in ``jsonb`` or
``text``): each becomes U+FFFD and the task ends once, instead of every outcome write failing
until the job has used up its attempts ("started 3 times without finishing")."""

from __future__ import annotations

import pytest

from tests.support import Client, Stack

R = "\ufffd"


@pytest.mark.timeout(60)
def test_a_result_and_a_status_message_with_nul_characters_are_stored_with_replacements(
    client: Client, stack: Stack
) -> None:
    task_id = client.start("t_nul_output", {})
    done = client.wait_status(task_id, timeout=30)
    assert done["status"] == "completed", done
    assert done["result"]["isError"] is False
    assert done["result"]["structuredContent"] == {
        "text": f"a{R}b",
        "escaped": "\\u0000",  # a backslash then "u0000": left as it is
        "nested": [R, {R: 1}],
    }
    with stack.db() as conn:
        row = conn.execute(
            "SELECT attempts, status_message FROM mcp_tasks WHERE task_id = %s", (task_id,)
        ).fetchone()
    assert row is not None and row[0] == 1, row  # one run: the first outcome write held
    assert row[1] is None or "\x00" not in row[1]


@pytest.mark.timeout(60)
def test_an_error_message_with_a_nul_character_ends_the_task_as_a_tool_error(
    client: Client, stack: Stack
) -> None:
    task_id = client.start("t_nul_output", {"fail": True})
    done = client.wait_status(task_id, timeout=30)
    assert done["status"] == "completed" and done["result"]["isError"] is True, done
    assert done["result"]["content"][0]["text"] == f"bad{R}input"
    with stack.db() as conn:
        row = conn.execute("SELECT attempts FROM mcp_tasks WHERE task_id = %s", (task_id,)).fetchone()
    assert row is not None and row[0] == 1, row
