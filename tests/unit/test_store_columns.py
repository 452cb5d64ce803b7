"""The store's column lists are the records' field names, and every one is a column of the schema:
rows map onto records by name (psycopg ``class_row``) or, on the API's hot reads, by position
(``args_row``), so a rename or a reorder on either side fails here."""

from __future__ import annotations

from dataclasses import fields

from mcp_celery_tasks.store import queries
from mcp_celery_tasks.store.records import ClaimedTask, InputRecord, TaskRecord
from mcp_celery_tasks.store.schema import task_inputs, tasks


def _listed(columns: str) -> list[str]:
    return [name.strip() for name in columns.split(",")]


def test_task_columns_are_task_record_fields_and_schema_columns() -> None:
    listed = _listed(queries.TASK_COLUMNS)
    assert listed == [f.name for f in fields(TaskRecord) if f.name != "db_now"]  # db_now is computed
    assert set(listed) <= set(tasks.c.keys())


def test_claimed_columns_are_claimed_task_fields_and_schema_columns() -> None:
    listed = _listed(queries.CLAIMED_COLUMNS)
    computed = {"age_s", "resumed_for_s"}
    assert listed == [f.name for f in fields(ClaimedTask) if f.name not in computed]
    assert set(listed) <= set(tasks.c.keys())


def test_input_columns_are_input_record_fields_and_schema_columns() -> None:
    listed = _listed(queries.INPUT_COLUMNS)
    assert listed == [f.name for f in fields(InputRecord)]
    assert set(listed) <= set(task_inputs.c.keys())


def test_positional_reads_select_the_record_fields_in_order() -> None:
    """``ApiStore`` builds TaskRecord and InputRecord rows by position: every query it reads them
    with selects the listed columns and then ``db_now`` (the record's last field), nothing else."""
    from mcp_celery_tasks.store import session_queries

    assert [f.name for f in fields(TaskRecord)][-1] == "db_now"
    for name, sql in [
        ("CREATE_TASK", queries.CREATE_TASK),
        ("GET_TASK", queries.GET_TASK),
        ("GET_TASKS", queries.GET_TASKS),
        ("LIST_TASKS", session_queries.LIST_TASKS),
    ]:
        listed = sql.split(queries.TASK_COLUMNS + ", ", 1)
        assert len(listed) == 2, name
        computed, _, rest = listed[1].partition(" AS db_now")
        assert rest and "," not in computed and not rest.lstrip().startswith(","), name
    selected = queries.OUTSTANDING_INPUTS.split(f"SELECT {queries.INPUT_COLUMNS}\n", 1)
    assert len(selected) == 2 and selected[1].lstrip().startswith("FROM "), "OUTSTANDING_INPUTS"


def test_queries_select_the_listed_columns() -> None:
    assert f"SELECT {queries.TASK_COLUMNS}, statement_timestamp() AS db_now" in queries.GET_TASK
    assert f"RETURNING {queries.CLAIMED_COLUMNS}," in queries.CLAIM
    assert f"SELECT {queries.INPUT_COLUMNS}" in queries.OUTSTANDING_INPUTS
