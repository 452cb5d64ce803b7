"""A small SEP-2663 client for any tasks server: call a tool, follow its task, answer input.

Plain HTTP (stateless 2026-07-28 envelope on every request), no server internals: the same
code drives our server and any other implementation of the extension.

Errors, all ``ClientError``::

    ClientError
    ├── InvalidUrl         the URL is not an http(s) URL
    ├── Unauthorized       HTTP 401: a token is missing or wrong
    ├── ServerUnavailable  no MCP answer: refused, timed out, or not an MCP endpoint
    └── RpcError           the server answered with a JSON-RPC error (code, message, data)
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import httpx

from mcp_celery_tasks.json_types import JSONObject, JSONValue, as_array, as_object

__all__ = [
    "IDEMPOTENCY_KEY",
    "ClientError",
    "InvalidUrl",
    "RpcError",
    "ServerUnavailable",
    "TaskStore",
    "TasksClient",
    "Unauthorized",
    "parse_reply",
]

VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")
MAX_TOOL_PAGES = 100
IDEMPOTENCY_KEY = "io.github.mcp-celery-tasks/idempotencyKey"
"""Our server's idempotency key in ``params._meta`` (a server without it ignores the entry)."""
CREATE_RETRY_DELAYS_S = (0.5, 2.0)
"""The pauses before each retry of a create: two retries, then the error is the caller's."""


class ClientError(Exception):
    """Anything that keeps the client from getting an answer to a request."""


class InvalidUrl(ClientError):
    """The endpoint URL cannot be used (no http:// or https://, malformed)."""


class Unauthorized(ClientError):
    """The server wants a (different) bearer token."""


class ServerUnavailable(ClientError):
    """No MCP answer: the connection failed or timed out, or the URL is not an MCP endpoint."""


class RpcError(ClientError):
    """A JSON-RPC error answered by the server."""

    def __init__(self, code: int, message: str, data: JSONValue = None) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message
        self.data = data


def parse_reply(response: httpx.Response) -> JSONObject:
    """The JSON-RPC message of a JSON or SSE response (``{}`` when there is none)."""
    message: JSONValue
    try:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            message = {}
            for line in response.text.splitlines():
                if line.startswith("data:"):
                    message = json.loads(line[5:])
        else:
            message = response.json() if response.content else {}
    except ValueError:
        return {}
    return as_object(message)


def _header_value(value: str) -> str:
    if value.isascii() and value.isprintable():
        return value
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


@dataclass
class TasksClient:
    url: str
    token: str | None = None
    capabilities: JSONObject | None = None
    timeout_s: float = 60.0
    """Longest wait for any one answer (an SSE keep-alive counts as part of an answer)."""

    def __post_init__(self) -> None:
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)))
        self._ids = 0
        caps: JSONObject = dict(self.capabilities or {})
        extensions = caps.setdefault("extensions", {})
        if not isinstance(extensions, dict):
            raise TypeError(f"capabilities.extensions must be an object, not {type(extensions).__name__}")
        extensions[TASKS] = {}
        self._caps = caps

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        params: Mapping[str, object],
        *,
        name: str | None = None,
        meta: Mapping[str, object] | None = None,
    ) -> JSONObject:
        """The result of one request (``RpcError`` for a JSON-RPC error, ``ServerUnavailable``
        when the answer is no JSON-RPC result); ``meta``: extra ``_meta`` entries."""
        self._ids += 1
        params = {
            **params,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientCapabilities": self._caps,
                "io.modelcontextprotocol/clientInfo": {"name": "mcp-celery-tasks-call", "version": "1"},
                **(meta or {}),
            },
        }
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": VERSION,
            "Mcp-Method": method,
        }
        if name is not None:
            headers["Mcp-Name"] = _header_value(name)
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        body = {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params}
        response = self._post(body, headers)
        if response.status_code == 401:
            raise Unauthorized(f"{self.url} refused the request: unauthorized (pass --token)")
        message = parse_reply(response)
        error = message.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            raise RpcError(
                code if isinstance(code, int) else 0, str(error.get("message", "")), error.get("data")
            )
        result = message.get("result")
        if not isinstance(result, dict):
            raise ServerUnavailable(
                f"{self.url} did not answer as an MCP server (HTTP {response.status_code}); is the URL right?"
            )
        return result

    def _post(self, body: Mapping[str, object], headers: dict[str, str]) -> httpx.Response:
        try:
            return self._http.post(self.url, json=body, headers=headers)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise InvalidUrl(f"--url {self.url!r}: {exc}") from exc
        except httpx.ConnectError as exc:
            raise ServerUnavailable(f"cannot reach {self.url}: {_reason(exc)}") from exc
        except httpx.TimeoutException as exc:
            raise ServerUnavailable(
                f"no answer from {self.url} within {self.timeout_s:g} s (--timeout)"
            ) from exc
        except httpx.HTTPError as exc:
            raise ServerUnavailable(f"lost the connection to {self.url}: {_reason(exc)}") from exc

    def list_tools(self) -> list[JSONObject]:
        """Every tool the server lists (``tools/list``, all pages)."""
        tools: list[JSONObject] = []
        cursor: JSONValue = None  # sent back as the server gave it
        for _ in range(MAX_TOOL_PAGES):
            page = self.request("tools/list", {"cursor": cursor} if cursor else {})
            tools += [t for t in as_array(page.get("tools")) if isinstance(t, dict) and "name" in t]
            cursor = page.get("nextCursor")
            if not cursor:
                break
        return tools

    def call_tool(
        self,
        name: str,
        arguments: JSONObject,
        *,
        input_responses: JSONObject | None = None,
        request_state: JSONValue = None,
        idempotency_key: str | None = None,
    ) -> JSONObject:
        """``tools/call``; ``request_state`` is an MRTR round's, sent back as the server gave it.

        With an ``idempotency_key`` (one is made when it is ``""``), a call whose answer was
        lost (the connection failed or broke, or the server said it is temporarily unavailable)
        is sent again with the same key, twice at most: the server answers the task the first
        one made, so the tool never runs twice for one ``call``. A ``--timeout`` is the
        caller's own limit and is not retried."""
        params: JSONObject = {"name": name, "arguments": arguments}
        if input_responses is not None:
            params["inputResponses"] = input_responses
        if request_state is not None:
            params["requestState"] = request_state
        if idempotency_key is None:
            return self.request("tools/call", params, name=name)
        meta = {IDEMPOTENCY_KEY: idempotency_key or f"cli-{uuid.uuid4()}"}
        for delay_s in CREATE_RETRY_DELAYS_S:
            try:
                return self.request("tools/call", params, name=name, meta=meta)
            except (ServerUnavailable, RpcError) as exc:
                if not _retryable(exc):
                    raise
            time.sleep(delay_s)
        return self.request("tools/call", params, name=name, meta=meta)

    def get(self, task_id: str) -> JSONObject:
        return self.request("tasks/get", {"taskId": task_id}, name=task_id)

    def update(self, task_id: str, responses: JSONObject) -> JSONObject:
        return self.request("tasks/update", {"taskId": task_id, "inputResponses": responses}, name=task_id)

    def cancel(self, task_id: str) -> JSONObject:
        return self.request("tasks/cancel", {"taskId": task_id}, name=task_id)

    def follow(
        self,
        task: JSONObject,
        *,
        on_update: Callable[[JSONObject], None],
        answer: Callable[[str, JSONValue], JSONObject | None],
    ) -> JSONObject:
        """Poll a task to its end, honouring ``pollIntervalMs``; answer each input key once."""
        answered: set[str] = set()
        task_id = str(task["taskId"])
        while True:
            on_update(task)
            if task["status"] in TERMINAL:
                return task
            if task["status"] == "input_required":
                responses: JSONObject = {}
                for key, request in as_object(task.get("inputRequests")).items():
                    if key in answered:
                        continue  # the spec asks clients to answer each key once
                    response = answer(key, request)
                    answered.add(key)
                    if response is not None:
                        responses[key] = response
                if responses:
                    self.update(task_id, responses)
                    task = self.get(task_id)
                    continue
            interval = task.get("pollIntervalMs")
            interval_ms = interval if isinstance(interval, int | float) and interval else 1000
            time.sleep(max(0.05, interval_ms / 1000))
            task = self.get(task_id)


def _retryable(exc: ServerUnavailable | RpcError) -> bool:
    """A connection that failed or broke (not our own timeout), or our server's "database
    away, call again" error (HTTP 503, ``data.unavailable``)."""
    if isinstance(exc, RpcError):
        return isinstance(exc.data, dict) and "unavailable" in exc.data
    return isinstance(exc.__cause__, httpx.HTTPError) and not isinstance(
        exc.__cause__, httpx.TimeoutException
    )


def _reason(exc: httpx.HTTPError) -> str:
    return str(exc) or type(exc).__name__


class StoredTask(TypedDict):
    """What ``TaskStore`` keeps of a task: where it runs, its tool, when it was started (epoch s)."""

    url: str
    tool: str
    created: float


class TaskStore:
    """Task ids this client started, kept on disk so ``call --resume`` works after a restart."""

    def __init__(self, path: Path | None = None) -> None:
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        self.path = path or Path(base) / "mcp-celery-tasks" / "tasks.json"

    def load(self) -> dict[str, StoredTask]:
        try:
            data: dict[str, StoredTask] = json.loads(self.path.read_text())  # our own file
            return data
        except (FileNotFoundError, ValueError):
            return {}

    def _save(self, data: dict[str, StoredTask]) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, indent=2))
            tmp.chmod(0o600)  # task ids are bearer-like handles
            tmp.replace(self.path)
        except OSError:
            pass  # a read-only home only costs the --url shortcut of --resume

    def add(self, task_id: str, url: str, tool: str) -> None:
        data = self.load()
        data[task_id] = {"url": url, "tool": tool, "created": time.time()}
        self._save(data)

    def remove(self, task_id: str) -> None:
        data = self.load()
        if data.pop(task_id, None) is not None:
            self._save(data)

    def get(self, task_id: str) -> StoredTask | None:
        return self.load().get(task_id)
