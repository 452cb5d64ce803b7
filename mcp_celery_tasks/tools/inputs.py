"""Input requests (``inputRequests``) and their answers: building, keying, validating.

Shared by the worker (which asks) and the API (which checks what ``tasks/update`` or an MRTR
retry sends before recording anything).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from mcp_types import CreateMessageResult, CreateMessageResultWithTools, ListRootsResult
from pydantic import BaseModel, ValidationError

from mcp_celery_tasks.errors import InvalidParams
from mcp_celery_tasks.json_types import JSONObject, JSONValue

__all__ = [
    "CAPABILITY_FOR",
    "ELICIT",
    "ROOTS",
    "SAMPLE",
    "Elicit",
    "elicit_params",
    "params_hash",
    "validate_response",
]

ELICIT: Final = "elicitation/create"
SAMPLE: Final = "sampling/createMessage"
ROOTS: Final = "roots/list"

CAPABILITY_FOR: Final[dict[str, str]] = {ELICIT: "elicitation", SAMPLE: "sampling", ROOTS: "roots"}
"""The client capability a request kind needs (MRTR: never ask for an undeclared kind)."""


def elicit_params(message: str, schema: Mapping[str, object]) -> JSONObject:
    """An ``elicitation/create`` request's params. ``schema`` is the form's JSON Schema as the
    tool author wrote it (a plain dict literal types as ``dict[str, object]``): JSON, sent as is."""
    return {"mode": "form", "message": message, "requestedSchema": cast("JSONObject", schema)}


@dataclass(frozen=True)
class Elicit:
    """A form question for ``@tool(ask_first=...)``: asked before the task exists (MRTR)."""

    message: str
    schema: Mapping[str, object]
    """The form's JSON Schema (``requestedSchema``)."""

    @property
    def method(self) -> str:
        return ELICIT

    @property
    def params(self) -> JSONObject:
        return elicit_params(self.message, self.schema)


def params_hash(method: str, params: Mapping[str, object] | None) -> str:
    """A stable fingerprint of one request: same method and params, same hash."""
    canonical = json.dumps({"method": method, "params": params}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


GIVEN_KEY: Final = "io.github.mcp-celery-tasks/inputResponses"
"""Where a task's ``preflight`` carries answers its first request offered before any question
was asked (SEP-2322: ``inputResponses`` without ``requestState``); the context takes them out."""
MAX_GIVEN: Final = 16


def validate_response(
    key: str, method: str, params: Mapping[str, object] | None, response: object
) -> JSONObject:
    """Check an answer against the request it answers; raise ``InvalidParams`` if it does not fit.

    ``response`` is parsed JSON (a request's ``inputResponses`` entry, or a test's answer)."""
    if not isinstance(response, dict):
        raise InvalidParams(f"inputResponses[{key!r}] must be an object")
    if method == ELICIT:
        _check_elicit(key, (params or {}).get("requestedSchema") or {}, response)
    elif method == SAMPLE:
        _check_model(key, response, CreateMessageResult, CreateMessageResultWithTools)
    elif method == ROOTS:
        _check_model(key, response, ListRootsResult)
    return response


def _check_model(key: str, response: JSONObject, *models: type[BaseModel]) -> None:
    errors: list[str] = []
    for model in models:
        try:
            model.model_validate(response)
            return
        except ValidationError as exc:
            errors.append(str(exc.errors(include_url=False)[0]["msg"]))
    raise InvalidParams(f"inputResponses[{key!r}] is not a valid response: {errors[0]}")


_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list,),
}


def _check_elicit(key: str, schema: Any, response: JSONObject) -> None:
    """``schema``: the request's ``requestedSchema``, the tool author's JSON Schema."""
    action = response.get("action")
    if action not in ("accept", "decline", "cancel"):
        raise InvalidParams(f"inputResponses[{key!r}].action must be accept, decline or cancel")
    content = response.get("content")
    if action != "accept":
        if content not in (None, {}):
            raise InvalidParams(f"inputResponses[{key!r}].content is only allowed with action accept")
        return
    if content is None:
        content = {}
    if not isinstance(content, dict):
        raise InvalidParams(f"inputResponses[{key!r}].content must be an object")
    # Read as JSON Schema says (``properties`` an object, ``required`` an array of names): a
    # schema that is not fails here as it always did.
    properties = schema.get("properties") or {}
    for name in schema.get("required") or []:
        if content.get(name) is None:
            raise InvalidParams(f"inputResponses[{key!r}].content is missing the required field {name!r}")
    for name, value in content.items():
        prop = properties.get(name)
        if prop is None:
            # Extra fields are tolerated (clients and the conformance suite send them) unless
            # the schema forbids them.
            if schema.get("additionalProperties") is False:
                raise InvalidParams(f"inputResponses[{key!r}].content has an unexpected field {name!r}")
            continue
        _check_value(key, name, prop, value)


def _check_value(key: str, name: str, prop: Any, value: JSONValue) -> None:
    """``prop``: the property's JSON Schema, read as ``_check_elicit`` reads the schema."""
    where = f"inputResponses[{key!r}].content.{name}"
    declared = prop.get("type")
    if value is None:
        return
    if isinstance(declared, str) and declared in _TYPES:
        ok = isinstance(value, _TYPES[declared]) and not (isinstance(value, bool) and declared != "boolean")
        if not ok:
            raise InvalidParams(f"{where} must be of type {declared}")
    allowed = prop.get("enum")
    if allowed is None and isinstance(prop.get("oneOf"), list):
        allowed = [option.get("const") for option in prop["oneOf"] if isinstance(option, dict)]
    if allowed is not None:
        values = value if isinstance(value, list) else [value]
        if any(v not in allowed for v in values):
            raise InvalidParams(f"{where} must be one of {allowed}")
    items = prop.get("items")
    if isinstance(value, list) and isinstance(items, dict):
        item_allowed = items.get("enum") or [
            o.get("const") for o in items.get("anyOf", []) if isinstance(o, dict)
        ]
        if item_allowed and any(v not in item_allowed for v in value):
            raise InvalidParams(f"{where} items must be among {item_allowed}")
