"""JSON as a type: what a parsed body, a tool's arguments or a ``_meta`` object may hold.

Open JSON (values passed through, or not validated yet) is a ``JSONValue`` or ``JSONObject``;
code that reads one narrows it with ``isinstance``. A read-only input that may also be one of
our TypedDicts is a ``Mapping[str, object]``. Shapes we build and send are TypedDicts
(``protocol.shapes``).
"""

from __future__ import annotations

from typing_extensions import TypeAliasType

__all__ = ["JSONArray", "JSONObject", "JSONValue", "as_array", "as_object"]

JSONValue = TypeAliasType(
    "JSONValue", "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"
)
JSONObject = TypeAliasType("JSONObject", "dict[str, JSONValue]")
JSONArray = TypeAliasType("JSONArray", "list[JSONValue]")


def as_object(value: JSONValue) -> JSONObject:
    """``value`` if it is a JSON object, else an empty one: an optional object field, read."""
    return value if isinstance(value, dict) else {}


def as_array(value: JSONValue) -> JSONArray:
    """``value`` if it is a JSON array, else an empty one: an optional array field, read."""
    return value if isinstance(value, list) else []
