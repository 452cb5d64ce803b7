"""Answers to a task's input requests for ``mcp-celery-tasks call``: a form in the terminal, or
an ``--answers`` file checked before the call starts.

A form never picks the consequential choice for the user: accept/decline/cancel has no
default, a yes/no field without a schema default needs y or n, and Enter keeps only defaults
the schema itself gives. Without a terminal to ask in, a request the answers file does not
answer is declined at once, never left outstanding (a task waiting on it holds a worker).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.prompt import InvalidResponse, PromptBase

from mcp_celery_tasks.client.terminal import plain
from mcp_celery_tasks.json_types import JSONObject, JSONValue, as_array, as_object

__all__ = ["Answerer", "AnswersError", "load_answers"]

ELICIT = "elicitation/create"
SAMPLE = "sampling/createMessage"
ROOTS = "roots/list"
KIND = {ELICIT: "form", SAMPLE: "sampling request"}
ACTIONS = ("accept", "decline", "cancel")
ANSWER_SHAPE = '{"action": "accept", "content": {...}}'
SAMPLING_DECLINED: JSONObject = {
    "role": "assistant",
    "content": {"type": "text", "text": ""},
    "model": "none",
    "stopReason": "declined",
}
"""What a sampling request we do not answer gets: an empty message from no model.

A form has ``{"action": "decline"}``; sampling has no refusal in ``inputResponses``, whose
values can only be an ElicitResult, a CreateMessageResult or a ListRootsResult (SEP-2663
``tasks/update``, SPEC-CHECKLIST §1.6; the server checks them in
``tools.inputs.validate_response``). Outside a task a client refuses sampling with a JSON-RPC
error (MCP 2025-11-25, Client Features / Sampling / Error Handling: ``-1``, "User rejected
sampling request"), which that map cannot carry. So the refusal is the CreateMessageResult the
server accepts that a tool can tell apart: no text, ``model`` "none", and ``stopReason``
"declined" (the schema leaves ``stopReason`` open to any string). Leaving the request
outstanding instead would keep the task, and a worker, waiting for an answer that never comes.
"""


class AnswersError(ValueError):
    """An ``--answers`` file that cannot be used, with the reason."""


def load_answers(path: Path) -> dict[str, JSONObject]:
    """The answers in ``path`` by input key (``"*"``: any form), checked for shape."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AnswersError(f"cannot read --answers {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        data: JSONValue = json.loads(text)
    except ValueError as exc:
        raise AnswersError(f"--answers {path} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise AnswersError(
            f"--answers {path}: expected an object of input key → answer, e.g. "
            f'{{"*": {ANSWER_SHAPE}}}, got {_kind(data)}'
        )
    answers: dict[str, JSONObject] = {}
    for key, answer in data.items():
        problem = _answer_problem(answer, elicitation_only=key == "*")
        if problem or not isinstance(answer, dict):  # an answer that is no object has a problem
            raise AnswersError(f"--answers {path}: {json.dumps(key)}: {problem}")
        answers[key] = answer
    return answers


def _kind(value: JSONValue) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _answer_problem(answer: JSONValue, *, elicitation_only: bool) -> str | None:
    """Why ``answer`` is not an ElicitResult (or a sampling or roots result), or None."""
    if not isinstance(answer, dict):
        return f"expected an answer object such as {ANSWER_SHAPE}, got {_kind(answer)}"
    if "action" in answer:
        if answer["action"] not in ACTIONS:
            return f'"action" must be "accept", "decline" or "cancel", got {json.dumps(answer["action"])}'
        content = answer.get("content")
        if content is None:
            return None
        if answer["action"] != "accept":
            return '"content" goes only with "action": "accept"'
        if not isinstance(content, dict):
            return f'"content" must be an object of field → value, got {_kind(content)}'
        for field, value in content.items():
            if not _primitive(value):
                return f'"content.{field}" must be a string, number, boolean or list of strings'
        return None
    if not elicitation_only and {"role", "content", "model"} <= answer.keys():
        return None  # a sampling result
    if not elicitation_only and isinstance(answer.get("roots"), list):
        return None  # a roots result
    fields = ", ".join(json.dumps(k) for k in answer) or "no fields"
    return f"not an answer (it has {fields}): a form answer looks like {ANSWER_SHAPE}"


def _primitive(value: JSONValue) -> bool:
    if isinstance(value, list):
        return all(isinstance(item, str) for item in value)
    return isinstance(value, str | int | float | bool)


class Answerer:
    """Answers input requests: from the answers file, in a form, or by declining (and saying so)."""

    def __init__(
        self,
        console: Console,
        *,
        interactive: bool,
        answers: dict[str, JSONObject],
        pause: Callable[[], AbstractContextManager[None]] = nullcontext,
    ) -> None:
        self.console = console
        self.interactive = interactive
        self.answers = answers
        self.pause = pause
        self.declined: list[str] = []

    def __call__(self, key: str, request: JSONValue) -> JSONObject | None:
        """The answer to the input request ``key`` (an ``inputRequests`` entry), or None."""
        asked = as_object(request)
        method = asked.get("method")
        params = as_object(asked.get("params"))
        if key in self.answers:
            return self.answers[key]
        if method == ELICIT and "*" in self.answers:
            return self.answers["*"]  # one answer for any form (keys are the server's)
        if method == ROOTS:
            return {"roots": [{"uri": Path.cwd().as_uri(), "name": Path.cwd().name}]}
        if not self.interactive:
            return self._declined(key, method, params)
        with self.pause():
            try:
                if method == ELICIT:
                    return self._form(params)
                if method == SAMPLE:
                    return self._sample(params)
            except EOFError:  # Ctrl-D: the question is dismissed, the task goes on
                self.console.print()
                return {"action": "cancel"} if method == ELICIT else SAMPLING_DECLINED
        return None

    def _declined(self, key: str, method: JSONValue, params: JSONObject) -> JSONObject | None:
        """No terminal to ask in: decline at once and say so, so the task never waits for us."""
        if self.answers:
            alternative = f" or {json.dumps('*')}" if method == ELICIT else ""
            listed = ", ".join(json.dumps(k) for k in self.answers)
            why = f"--answers has no {json.dumps(key)}{alternative} (it has {listed})"
        else:
            why = "no terminal to answer it (use --answers FILE)"
        question = f" ({params['message']})" if params.get("message") else ""
        if method == ELICIT:
            answer: JSONObject = {"action": "decline"}
        elif method == SAMPLE:
            answer = SAMPLING_DECLINED
        else:
            return None  # not an input kind of the spec: nothing to decline it with
        self.declined.append(key)
        self.console.print(
            plain(f"declined {KIND[str(method)]} {json.dumps(key)}{question}: {why}"), markup=False
        )
        return answer

    def _form(self, params: JSONObject) -> JSONObject:
        message = plain(params.get("message") or "The tool asks:", newlines=True)
        self.console.print(f"\n[bold]{escape(message)}[/bold]")
        choice = _Choice(self.console)()
        if choice != "accept":
            return {"action": choice}
        schema = as_object(params.get("requestedSchema"))
        required = {name for name in as_array(schema.get("required")) if isinstance(name, str)}
        content: JSONObject = {}
        for name, prop in as_object(schema.get("properties")).items():
            field = _Field(self.console, name, prop if isinstance(prop, dict) else {}, name in required)
            value = field()
            if value is not None:
                content[name] = value
        return {"action": "accept", "content": content}

    def _sample(self, params: JSONObject) -> JSONObject:
        self.console.print("\n[bold]The tool asks a language model:[/bold]")
        for message in as_array(params.get("messages", [])):
            if not isinstance(message, dict):
                continue
            content = as_object(message.get("content"))
            said = plain(f"  {message.get('role')}: {content.get('text', content)}", newlines=True)
            self.console.print(said, markup=False)
        text = _Field(self.console, "answer", {"title": "Your answer (you are the model)"}, True)()
        return {"role": "assistant", "content": {"type": "text", "text": text}, "model": "human"}


class _Choice(PromptBase[str]):
    """accept, decline or cancel: no default, so Enter alone decides nothing."""

    def __init__(self, console: Console) -> None:
        super().__init__("accept, decline or cancel (a/d/c)", console=console)

    def process_response(self, value: str) -> str:
        typed = value.strip().lower()
        for action in ACTIONS:
            if typed and action.startswith(typed):
                return action
        raise InvalidResponse("[prompt.invalid]Type a (accept), d (decline) or c (cancel)")


class _Field(PromptBase[JSONValue]):
    """One form field of an elicitation schema (string, number, integer, boolean, enum, list).

    Enter takes the schema's default; with none, it leaves an optional field out and asks a
    required one again. A boolean without a default always needs y or n.
    """

    def __init__(self, console: Console, name: str, prop: JSONObject, required: bool) -> None:
        self.prop = prop
        self.kind = prop.get("type")
        self.options = _options(prop)
        self.required = required or self.kind == "boolean"
        self.fallback = prop.get("default")
        label = str(prop.get("title") or prop.get("description") or name)
        super().__init__(escape(plain(label)) + self._hint(), console=console)

    def _hint(self) -> str:
        if self.kind == "boolean":
            if "default" in self.prop:
                return " \\[Y/n]" if self.fallback else " \\[y/N]"
            return " \\[y/n]"
        hint = ""
        if self.options:
            many = " (comma-separated)" if self.kind == "array" else ""
            hint += f" [{'/'.join(self.options)}]{many}"
        if "default" in self.prop:
            hint += f" ({self.fallback if isinstance(self.fallback, str) else json.dumps(self.fallback)})"
        elif not self.required:
            hint += " (optional)"
        return escape(plain(hint))

    def process_response(self, value: str) -> JSONValue:
        typed = value.strip()
        if not typed:
            if "default" in self.prop:
                return self.fallback
            if not self.required:
                return None
            raise InvalidResponse(
                "[prompt.invalid]Type y or n"
                if self.kind == "boolean"
                else "[prompt.invalid]An answer is needed"
            )
        try:
            return self._parse(typed)
        except ValueError as exc:
            raise InvalidResponse(f"[prompt.invalid]{escape(plain(exc))}") from None

    def _parse(self, typed: str) -> JSONValue:
        if self.kind == "boolean":
            if typed.lower() in ("y", "yes", "true"):
                return True
            if typed.lower() in ("n", "no", "false"):
                return False
            raise ValueError("Type y or n")
        if self.kind == "array":
            items: list[JSONValue] = [
                self._check_option(item.strip()) for item in typed.split(",") if item.strip()
            ]
            self._check_range(len(items), "minItems", "maxItems", "items")
            return items
        if self.options:
            return self._check_option(typed)
        if self.kind in ("integer", "number"):
            number: int | float
            try:
                number = int(typed) if self.kind == "integer" else float(typed)
            except ValueError:
                raise ValueError(
                    "Type a whole number" if self.kind == "integer" else "Type a number"
                ) from None
            self._check_range(number, "minimum", "maximum", "")
            return number
        self._check_range(len(typed), "minLength", "maxLength", "characters")
        return typed

    def _check_option(self, typed: str) -> JSONValue:
        """The allowed value ``typed`` names (an integer enum's value stays an integer)."""
        if not self.options:
            return typed
        if typed not in self.options:
            raise ValueError(f"Choose from {', '.join(self.options)}")
        return self.options[typed]

    def _check_range(self, value: float, low: str, high: str, unit: str) -> None:
        suffix = f" {unit}" if unit else ""
        least, most = self.prop.get(low), self.prop.get(high)
        if isinstance(least, int | float) and value < least:
            raise ValueError(f"At least {least}{suffix}")
        if isinstance(most, int | float) and value > most:
            raise ValueError(f"At most {most}{suffix}")


def _options(prop: JSONObject) -> dict[str, JSONValue]:
    """Allowed values of an enum field, or of each item of a multi-select field, by their text."""
    source = prop.get("items") if prop.get("type") == "array" else prop
    if not isinstance(source, dict):
        return {}
    choices = source.get("oneOf") or source.get("anyOf")
    values = as_array(source.get("enum")) or [
        o.get("const") for o in as_array(choices) if isinstance(o, dict)
    ]
    return {str(v): v for v in values if v is not None}
