"""Concurrency limits as ``@tool`` declares them: the checks run at import, the group a call's
arguments fall in (labels stay short and printable), and the waiting message. The release side
is tests/integration/test_concurrency_limits.py, a real stack tests/e2e/test_concurrency.py."""

from __future__ import annotations

import uuid

import pytest

from mcp_celery_tasks import tool
from mcp_celery_tasks.tools.concurrency import MAX_LABEL_CHARS, waiting_message
from mcp_celery_tasks.tools.registry import InvalidArguments, get_tool


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def test_a_per_key_limit_groups_calls_by_the_argument_value() -> None:
    name = unique("train")

    @tool(name=name, concurrency_key="model", concurrency=1)
    def train(model: str, epochs: int = 1) -> None: ...

    spec = get_tool(name)
    assert spec is not None
    assert spec.concurrency_group(spec.validate_arguments({"model": "moons"})) == ("model=moons", 1)
    assert spec.concurrency_group(spec.validate_arguments({"model": "moons", "epochs": 5})) == (
        "model=moons",
        1,
    )
    assert spec.concurrency_group(spec.validate_arguments({"model": "circles"})) == ("model=circles", 1)


def test_a_tool_wide_limit_has_one_group_and_a_tool_without_one_has_none() -> None:
    limited, free = unique("render"), unique("free")

    @tool(name=limited, concurrency=8)
    def render(scene: str) -> None: ...

    @tool(name=free)
    def plain(scene: str) -> None: ...

    assert get_tool(limited).concurrency_group({"scene": "x"}) == ("", 8)  # type: ignore[union-attr]
    assert get_tool(free).concurrency_group({"scene": "x"}) == (None, None)  # type: ignore[union-attr]


def test_a_key_function_groups_by_its_value_and_its_failure_is_invalid_arguments() -> None:
    name = unique("node")

    @tool(name=name, concurrency_key=lambda args: str(args["host"]).split(".")[0], concurrency=2)
    def on_node(host: str) -> None: ...

    spec = get_tool(name)
    assert spec is not None
    assert spec.concurrency_group({"host": "gpu1.example.org"}) == ("gpu1", 2)

    other = unique("broken")

    @tool(name=other, concurrency_key=lambda args: args["missing"], concurrency=1)
    def broken(host: str) -> None: ...

    with pytest.raises(InvalidArguments, match=r"concurrency key cannot be computed.*KeyError"):
        get_tool(other).validate_arguments({"host": "a"})  # type: ignore[union-attr]


def test_hostile_values_get_a_short_printable_label_that_still_tells_them_apart() -> None:
    name = unique("hostile")

    @tool(name=name, concurrency_key="model", concurrency=1)
    def hostile(model: object) -> None: ...

    spec = get_tool(name)
    assert spec is not None
    escape, _ = spec.concurrency_group({"model": "\x1b]0;pwned\x07moons"})
    assert escape is not None and "\x1b" not in escape and "\x07" not in escape
    long_a, _ = spec.concurrency_group({"model": "a" * 100_000})
    long_b, _ = spec.concurrency_group({"model": "a" * 99_999 + "b"})
    assert long_a is not None and long_b is not None
    assert len(long_a) < MAX_LABEL_CHARS and long_a != long_b
    assert spec.concurrency_group({"model": {"b": 1, "a": [2]}})[0] == 'model={"a":[2],"b":1}'


def test_a_key_function_returning_the_all_groups_marker_gets_another_label() -> None:
    name = unique("star")

    @tool(name=name, concurrency_key=lambda args: args["pattern"], concurrency=1)
    def star(pattern: str) -> None: ...

    label, _ = get_tool(name).concurrency_group({"pattern": "*"})  # type: ignore[union-attr]
    assert label is not None and label != "*" and label.startswith("*…#")


def test_bad_declarations_fail_at_import() -> None:
    with pytest.raises(ValueError, match="not one of its arguments"):

        @tool(name=unique("typo"), concurrency_key="modle", concurrency=1)
        def typo(model: str) -> None: ...

    with pytest.raises(TypeError, match="needs concurrency=N"):

        @tool(name=unique("nolimit"), concurrency_key="model")
        def no_limit(model: str) -> None: ...

    for bad in (0, -1, 10**9):
        with pytest.raises(ValueError, match="between 1 and"):

            @tool(name=unique("bad"), concurrency=bad)
            def zero() -> None: ...

    with pytest.raises(TypeError, match="whole number"):

        @tool(name=unique("bad"), concurrency=True)
        def flag() -> None: ...


def test_the_waiting_message() -> None:
    assert (
        waiting_message("train_model", "model=moons", 1, 1)
        == "waiting: 1 other run of train_model for model=moons"
    )
    assert waiting_message("render", "", 8, 8) == "waiting: 8 other runs of render"
    assert waiting_message("render", "", 0, 0) == "waiting: runs of render are paused by an admin"


def test_a_key_function_may_take_the_principal_too() -> None:
    name = unique("per_user")

    @tool(name=name, concurrency_key=lambda args, principal: f"{args['path']} of {principal}", concurrency=1)
    def per_user(path: str) -> None: ...

    spec = get_tool(name)
    assert spec is not None
    spec.validate_arguments({"path": "a"})  # not computed without the principal
    assert spec.concurrency_group({"path": "a"}, "token:alice") == ("a of token:alice", 1)
    assert spec.concurrency_group({"path": "a"}, "token:bob") == ("a of token:bob", 1)


def test_the_training_example_runs_one_job_per_model_file_of_each_caller() -> None:
    import workers.train_model

    spec = get_tool("train_model")
    assert spec is not None and spec.concurrency is not None
    assert spec.concurrency_group({"model": "moons"}, "token:alice") == ("moons.npz of token:alice", 1)
    assert spec.concurrency_group({"model": "moons.npz"}, "token:alice") == ("moons.npz of token:alice", 1)
    assert spec.concurrency_group({"model": "moons"}, "token:bob") == ("moons.npz of token:bob", 1)
    with pytest.raises(InvalidArguments, match="concurrency key"):
        spec.concurrency_group({"model": "  "}, "token:alice")
    del workers.train_model
