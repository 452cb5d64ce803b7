"""``@tool``: input schemas from type hints, the context parameter, argument validation, modes.

The registry is process-global: every tool here is named after its test.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Annotated, Any, get_args

import pytest
from mcp_types import jsonrpc as codes
from pydantic import Field

from mcp_celery_tasks import Mode, TaskContext, tool
from mcp_celery_tasks.errors import InvalidParams
from mcp_celery_tasks.json_types import as_object
from mcp_celery_tasks.tools.registry import InvalidArguments, ToolSpec, all_tools, get_tool


def spec(name: str) -> ToolSpec:
    found = get_tool(name)
    assert found is not None, f"{name} is not registered"
    return found


def test_input_schema_comes_from_type_hints_with_defaults_and_required() -> None:
    @tool(name="test_input_schema__train")
    def train(dataset: str, epochs: int = 3, rate: float = 0.1, tags: list[str] | None = None) -> str:
        return dataset

    schema: Any = spec("test_input_schema__train").input_schema
    assert schema["type"] == "object"
    assert schema["required"] == ["dataset"]
    assert schema["properties"]["dataset"] == {"type": "string"}
    assert schema["properties"]["epochs"] == {"type": "integer", "default": 3}
    assert schema["properties"]["rate"] == {"type": "number", "default": 0.1}
    assert schema["properties"]["tags"]["default"] is None
    assert "title" not in schema
    assert all("title" not in prop for prop in schema["properties"].values())


def test_tool_without_parameters_has_an_empty_object_schema() -> None:
    @tool(name="test_no_parameters__ping")
    def ping() -> str:
        return "pong"

    schema = spec("test_no_parameters__ping").input_schema
    assert schema["type"] == "object"
    assert schema.get("properties", {}) == {}
    assert "required" not in schema


def test_task_context_parameter_is_detected_and_left_out_of_the_schema() -> None:
    @tool(name="test_task_context__search")
    def search(query: str, context: TaskContext, limit: int = 10) -> str:
        return query

    found = spec("test_task_context__search")
    assert found.context_param == "context"
    assert set(as_object(found.input_schema["properties"])) == {"query", "limit"}
    assert found.input_schema["required"] == ["query"]
    assert found.call_kwargs({"query": "q"}) == {"query": "q", "limit": 10}


def test_tool_without_a_context_parameter_has_none() -> None:
    @tool(name="test_without_context__add")
    def add(a: int, b: int) -> int:
        return a + b

    assert spec("test_without_context__add").context_param is None


def test_valid_arguments_come_back_json_ready_with_defaults() -> None:
    @tool(name="test_valid_arguments__resize")
    def resize(width: int, height: int = 100, label: str = "img") -> str:
        return label

    stored = spec("test_valid_arguments__resize").validate_arguments({"width": 640})
    assert stored == {"width": 640, "height": 100, "label": "img"}


def test_wrongly_typed_argument_is_invalid_params_naming_the_field() -> None:
    @tool(name="test_wrong_type__count")
    def count(items: int) -> int:
        return items

    with pytest.raises(InvalidParams) as raised:
        spec("test_wrong_type__count").validate_arguments({"items": "many"})
    assert raised.value.code == codes.INVALID_PARAMS
    assert "items" in raised.value.message
    assert raised.value.to_error()["code"] == codes.INVALID_PARAMS


def test_declared_bounds_on_run_time_arguments_are_in_the_schema_and_refuse_huge_values() -> None:
    # Issue 15: spin(seconds=1e308) was accepted. A tool bounds what sets its run time with
    # Annotated[..., Field(le=...)]; a value outside is an argument error (a tool error result,
    # SPEC-CHECKLIST Q-23), never a queued job.
    @tool(name="test_bounds__spin")
    def spin(ctx: TaskContext, seconds: Annotated[float, Field(ge=0, le=3600)] = 1.0) -> str:
        return "spun"

    bounded = spec("test_bounds__spin")
    assert as_object(bounded.input_schema["properties"])["seconds"] == {
        "type": "number", "default": 1.0, "minimum": 0, "maximum": 3600
    }  # fmt: skip
    assert bounded.validate_arguments({"seconds": 3600}) == {"seconds": 3600}
    for bad in (1e308, -1, 3600.5):
        with pytest.raises(InvalidArguments, match="seconds"):
            bounded.validate_arguments({"seconds": bad})


def test_the_bench_fixtures_and_examples_bound_their_run_time_arguments() -> None:
    import tests.fixtures.bench
    import workers.train_model  # noqa: F401

    del tests.fixtures.bench
    cases = [("spin", "seconds", 1e308), ("sleep_ms", "ms", 10**12), ("train_model", "epochs", 10**12)]
    for name, argument, huge in cases:
        with pytest.raises(InvalidArguments, match=argument):
            spec(name).validate_arguments({"model": "m", argument: huge})


def test_missing_required_argument_is_invalid_params_naming_the_field() -> None:
    @tool(name="test_missing_argument__greet")
    def greet(name: str, greeting: str = "Hello") -> str:
        return f"{greeting}, {name}!"

    with pytest.raises(InvalidParams) as raised:
        spec("test_missing_argument__greet").validate_arguments({"greeting": "Hi"})
    assert raised.value.code == codes.INVALID_PARAMS
    assert "name" in raised.value.message
    assert "greeting" not in raised.value.message


def test_a_second_function_under_a_taken_name_is_refused() -> None:
    @tool(name="test_duplicate__job")
    def first() -> str:
        return "first"

    def second() -> str:
        return "second"

    with pytest.raises(ValueError, match="test_duplicate__job"):
        tool(name="test_duplicate__job")(second)
    assert spec("test_duplicate__job").fn is first


def test_registering_the_same_function_again_is_harmless() -> None:
    def job() -> str:
        return "ok"

    tool(name="test_same_function__job")(job)
    tool(name="test_same_function__job")(job)
    assert [t.name for t in all_tools()].count("test_same_function__job") == 1


def test_var_args_are_refused() -> None:
    def splat(*items: int) -> int:
        return len(items)

    with pytest.raises(TypeError, match="args"):
        tool(name="test_var_args__splat")(splat)
    assert get_tool("test_var_args__splat") is None


def _underscore_parameter(_token: str) -> str:
    return _token


def _reserved_parameter(model_config: str) -> str:
    return model_config


@pytest.mark.parametrize(
    ("fn", "param"), [(_underscore_parameter, "_token"), (_reserved_parameter, "model_config")]
)
def test_a_parameter_is_never_silently_dropped_from_the_schema(fn: Callable[..., Any], param: str) -> None:
    # Product bug: pydantic treats these names as private/config, so the schema and the stored
    # arguments lose them and the worker later calls the tool without a required argument.
    name = f"test_never_dropped__{param}"
    try:
        tool(name=name)(fn)
    except (TypeError, ValueError):
        return  # refusing such a name at registration is an acceptable answer too
    found = spec(name)
    assert param in as_object(found.input_schema.get("properties"))
    assert found.validate_arguments({param: "t"}) == {param: "t"}
    assert found.call_kwargs({param: "t"}) == {param: "t"}


def test_parameter_named_like_a_base_model_attribute_registers_without_a_warning() -> None:
    # Product bug: ``schema`` / ``json`` / ``copy`` make pydantic warn that the field shadows
    # a BaseModel attribute; a tool author should not see pydantic's internals.
    def describe(schema: str, json: bool = False) -> str:
        return schema

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tool(name="test_shadowing_parameter__describe")(describe)
    found = spec("test_shadowing_parameter__describe")
    assert found.call_kwargs({"schema": "public"}) == {"schema": "public", "json": False}


def test_mode_defaults_to_optional() -> None:
    @tool(name="test_mode_default__job")
    def job() -> None:
        return None

    assert spec("test_mode_default__job").mode == "optional"


@pytest.mark.parametrize("mode", get_args(Mode))
def test_declared_mode_and_routing_are_recorded(mode: Mode) -> None:
    name = f"test_declared_mode__{mode}"

    def job() -> None:
        return None

    tool(name=name, mode=mode, queue="gpu", retention_seconds=5.0, poll_interval_ms=200, max_attempts=2)(job)
    found = spec(name)
    assert found.mode == mode
    assert found.queue == "gpu"
    assert found.retention_seconds == 5.0
    assert found.poll_interval_ms == 200
    assert found.max_attempts == 2


def test_bare_decorator_uses_the_function_name_and_first_docstring_paragraph() -> None:
    def test_bare_decorator__summarize(text: str) -> str:
        """Summarize a text.

        Longer explanation that is not part of the description.
        """
        return text

    tool(test_bare_decorator__summarize)
    found = spec("test_bare_decorator__summarize")
    assert found.description == "Summarize a text."
    assert found.fn is test_bare_decorator__summarize


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"needs_inputs": ["telepathy"]}, "not an input kind"),
        ({"needs_inputs": "elicitation"}, "not one string"),
        ({"scopes": ["has space"]}, "not an OAuth scope token"),
        ({"scopes": ['quote"']}, "not an OAuth scope token"),
        ({"scopes": "models:train"}, "not one string"),
    ],
)
def test_bad_needs_inputs_and_scopes_are_refused_at_registration(
    options: dict[str, Any], problem: str
) -> None:
    with pytest.raises((ValueError, TypeError), match=problem):
        tool(name="r_bad_options", **options)(lambda: None)


def test_needs_inputs_and_scopes_are_kept_once_each_in_order() -> None:
    tool(name="r_declared", needs_inputs=["sampling", "elicitation", "sampling"], scopes=["a", "b", "a"])(
        lambda: None
    )
    spec = get_tool("r_declared")
    assert spec is not None and spec.needs_inputs == ("sampling", "elicitation") and spec.scopes == ("a", "b")
