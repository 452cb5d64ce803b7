"""``call``'s ``--arg KEY=VALUE`` pairs, read and checked against the tool's ``inputSchema`` before
anything is sent: an unknown tool or argument, a missing one, or a value of the wrong JSON type is
refused here (exit 2) rather than coming back as a tool error.
"""

from __future__ import annotations

import difflib
import json

from mcp_celery_tasks.client.view import arguments_text
from mcp_celery_tasks.json_types import JSONObject, JSONValue, as_array, as_object

__all__ = ["UsageError", "check_call", "parse_args"]

TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a JSON list",
    "object": "a JSON object",
    "null": "null",
}


class UsageError(Exception):
    """The command line asks for something that cannot work; said before any task starts."""


def parse_args(pairs: list[str]) -> dict[str, str]:
    """``k=v`` pairs as typed (``check_call`` reads each value against the tool's schema)."""
    texts: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--arg expects key=value, got {pair!r}")
        texts[key] = value
    return texts


def check_call(tools: list[JSONObject], name: str, texts: dict[str, str]) -> JSONObject:
    """The arguments to send: each value is JSON when it parses as JSON, else text (always the
    text as typed for a parameter that takes only strings, so ``label=123`` stays ``"123"``).

    Raises:
        UsageError: an unknown tool, an argument its inputSchema does not have, a missing
            required one, or a value whose JSON type the schema does not allow.
    """
    by_name = {str(t["name"]): t for t in tools}
    if name not in by_name:
        close = difflib.get_close_matches(name, list(by_name), n=3)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        listed = ", ".join(sorted(by_name)) or "none"
        raise UsageError(f"unknown tool {name!r}: {hint}Tools on this server: {listed}")
    schema = as_object(by_name[name].get("inputSchema"))
    properties = as_object(schema.get("properties"))
    extra = schema.get("additionalProperties")
    unknown = [key for key in texts if key not in properties]
    if unknown and extra is not True and not isinstance(extra, dict):
        if not properties:
            raise UsageError(f"{name} takes no arguments, got {', '.join(unknown)}")
        close = [m for key in unknown for m in difflib.get_close_matches(key, list(properties), n=1)]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UsageError(
            f"{name} has no argument {', '.join(unknown)}{hint}; its arguments: {arguments_text(schema)}"
        )
    missing = [key for key in as_array(schema.get("required")) if key not in texts]
    if missing:
        needed = " ".join(f"--arg {key}=…" for key in missing)
        raise UsageError(f"{name} needs {needed}; its arguments: {arguments_text(schema)}")
    arguments: JSONObject = {}
    for key, text in texts.items():
        prop = properties.get(key)
        allowed = _types(prop if isinstance(prop, dict) else {})
        value = _read(text, only_text=allowed == {"string"})
        if allowed is not None and not _fits(value, allowed):
            expected = " or ".join(TYPE_NAMES.get(t, t) for t in sorted(allowed))
            raise UsageError(f"--arg {key}={text}: {name} takes {expected} for {key}")
        arguments[key] = value
    return arguments


def _read(text: str, *, only_text: bool) -> JSONValue:
    try:
        value: JSONValue = json.loads(text)
    except ValueError:
        return text
    if only_text and not isinstance(value, str):
        return text
    return value


def _types(prop: JSONObject) -> set[str] | None:
    """The JSON types a parameter's schema allows (``type``, or its ``anyOf``/``oneOf`` branches),
    or None when the schema does not say (a ``$ref``, an untyped branch): then anything goes."""
    declared = prop.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {str(t) for t in declared}
    branches = prop.get("anyOf") or prop.get("oneOf")
    if not isinstance(branches, list) or not branches:
        return None
    allowed: set[str] = set()
    for branch in branches:
        found = _types(branch) if isinstance(branch, dict) else None
        if found is None:
            return None
        allowed |= found
    return allowed


def _fits(value: JSONValue, allowed: set[str]) -> bool:
    kind = _type_of(value)
    return kind in allowed or (kind == "integer" and "number" in allowed)


def _type_of(value: JSONValue) -> str:
    """The JSON Schema type of a parsed value (a whole float such as ``2.0`` is an integer too)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"
