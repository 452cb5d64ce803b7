"""Property-based fuzzing of ``POST /mcp`` over real HTTP against the live ``stack``.

Every strategy throws hostile input at the endpoint and checks one transport contract:

* a notification gets HTTP 202 with an empty body; anything else gets a strict-JSON (no NaN,
  no duplicate keys, UTF-8) JSON-RPC 2.0 response with exactly one of ``result``/``error``,
  ``error.code`` an int and ``error.message`` a str (over SSE: notifications, then that response);
* the HTTP status is one of 200, 202, 400, 401, 403, 404, 405, 413, 503 -- never 500;
* a request with a valid id (a string or an integer) gets that id back, unless it was turned
  away before its body was read (401, 403, 413: id null); a result only ever answers a request
  with a valid id; -32603 (how an unexpected exception surfaces) only comes with HTTP 503;
* no task changes through a rejected request: canary tasks (one completed, one
  ``input_required``) are read from Postgres before the run and compared after every strategy,
  and the strategies never create a task (the row count is checked too).

Each strategy also checks the exact error its input must get where the rule is simple (envelope
checks, routing headers, ``_meta``, unknown methods, forged task ids, invalid answers).

The product bugs the fuzzing found are fixed and kept as regression tests at the end of the file.
The strategies leave their triggers out (NUL characters and lone surrogates in strings, NaN and
Infinity, JSON nested deeper than 800 levels, boolean ids) so the properties above stay sharp.
They also stay on the 2026-07-28 path: ``initialize`` and ``Mcp-Session-Id`` (the 2025-11-25
layer in legacy.py) only appear in the regression tests.

The number of cases per strategy is printed (run with ``-s``), with a total at the end.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import string
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from mcp_types import jsonrpc as codes

from tests.support import TASKS_EXT, VERSION, Stack, meta, wait_until

# ---- the contract --------------------------------------------------------------------------------

ALLOWED_STATUS = frozenset({200, 202, 400, 401, 403, 404, 405, 406, 413, 503})
PRE_PARSE_STATUS = frozenset({401, 403, 406, 413})  # answered before the body is read: id null
KNOWN_METHODS = (
    "server/discover",
    "tools/list",
    "tools/call",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "subscriptions/listen",
)
REMOVED_METHODS = ("tasks/result", "tasks/list", "ping", "notifications/initialized")
# ``initialize`` (or an Mcp-Session-Id header) routes to the 2025-11-25 layer (legacy.py): out of
# this file's scope except for the regression tests at the end.
LEGACY_METHOD = "initialize"
TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
UNKNOWN_TASK = "Failed to retrieve task: Task not found"
PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
MAX_BODY_BYTES = 1_048_576  # Settings.max_body_bytes (the stack runs with the default)
MAX_HEADER_BYTES = 65_536  # Settings.max_header_bytes (likewise)
YES = {"action": "accept", "content": {"confirm": True}}
ELICITING: dict[str, Any] = {"elicitation": {}}

CASES: Counter[str] = Counter()
SECONDS: dict[str, float] = {}
SKIPPED_EQUIVALENT_STATES: Counter[str] = Counter()


def fuzz(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,  # no example database: every run starts afresh
        print_blob=True,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
    )


def valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _no_constants(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name} in the response")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    assert len(found) == len(pairs), f"duplicate keys in a response object: {pairs}"
    return found


def strict_json(raw: bytes) -> Any:
    """RFC 8259 JSON only: UTF-8, no NaN/Infinity, no duplicate keys."""
    return json.loads(raw.decode("utf-8"), parse_constant=_no_constants, object_pairs_hook=_unique_keys)


def sse_messages(raw: bytes) -> list[Any]:
    messages = []
    for event in raw.decode("utf-8").replace("\r\n", "\n").split("\n\n"):
        data = [line[5:].strip() for line in event.split("\n") if line.startswith("data:")]
        if data:
            messages.append(strict_json("\n".join(data).encode()))
    return messages


def assert_jsonrpc_response(reply: Any) -> None:
    assert isinstance(reply, dict), f"the response is not a JSON object: {reply!r}"
    assert reply.get("jsonrpc") == "2.0", reply
    assert "id" in reply, reply
    assert ("result" in reply) != ("error" in reply), f"need exactly one of result/error: {reply}"
    assert set(reply) <= {"jsonrpc", "id", "result", "error"}, reply
    if "result" in reply:
        assert isinstance(reply["result"], dict), reply
        return
    error = reply["error"]
    assert isinstance(error, dict), reply
    assert type(error.get("code")) is int, reply
    assert isinstance(error.get("message"), str), reply
    assert set(error) <= {"code", "message", "data"}, reply


def check(response: httpx.Response, sent: Any) -> dict[str, Any] | None:
    """Assert the transport contract; the JSON-RPC response (None for a 202)."""
    status = response.status_code
    assert status in ALLOWED_STATUS, f"HTTP {status}: {response.content[:300]!r}"
    is_notification = isinstance(sent, dict) and "id" not in sent
    if status == 202:
        assert response.content == b"", response.content[:300]
        assert is_notification, f"HTTP 202 for a request with an id: {sent!r:.300}"
        return None
    content_type = response.headers.get("content-type", "")
    if content_type.startswith("text/event-stream"):
        messages = sse_messages(response.content)
        assert messages, "an SSE response without messages"
        for message in messages[:-1]:
            assert isinstance(message, dict) and message.get("jsonrpc") == "2.0", message
            assert isinstance(message.get("method"), str) and "id" not in message, message
        reply = messages[-1]
    else:
        assert content_type.startswith("application/json"), (status, content_type, response.content[:300])
        reply = strict_json(response.content)
    assert_jsonrpc_response(reply)
    if "result" in reply:
        assert status == 200, (status, reply)
        # A result answers a request, never a notification or an invalid id.
        assert isinstance(sent, dict) and "id" in sent and valid_id(sent["id"]), (sent, reply)
    elif reply["error"]["code"] == codes.INTERNAL_ERROR:
        # -32603 is how an unexpected exception surfaces; only "temporarily unavailable" (503) is fine.
        assert status == 503, f"internal error for {sent!r:.300}: HTTP {status} {reply}"
    sent_id = sent.get("id") if isinstance(sent, dict) else None
    if status in PRE_PARSE_STATUS:
        assert reply["id"] is None, reply
    elif valid_id(sent_id):
        assert reply["id"] == sent_id and type(reply["id"]) is type(sent_id), (sent_id, reply["id"])
    else:
        assert reply["id"] is None or reply["id"] == sent_id, (sent_id, reply["id"])
    parsed: dict[str, Any] = reply
    return parsed


def assert_error(reply: dict[str, Any] | None, response: httpx.Response, code: int, status: int) -> None:
    assert reply is not None and "error" in reply, (response.status_code, reply)
    assert (response.status_code, reply["error"]["code"]) == (status, code), (response.status_code, reply)


# ---- sending -------------------------------------------------------------------------------------

HEADER_VALUE = re.compile(rb"(?:[\x21-\x7e\x80-\xff](?:[ \t\x21-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?")


def header_bytes(text: str) -> bytes | None:
    """``text`` as a raw header value the server reads back unchanged (it decodes latin-1 and
    strips), or None when no header can carry it."""
    try:
        raw = text.encode("latin-1")
    except UnicodeEncodeError:
        return None
    if not HEADER_VALUE.fullmatch(raw) or text.strip() != text:
        return None
    return raw


def looks_encoded(value: str) -> bool:
    return value.startswith("=?base64?") and value.endswith("?=") and len(value) >= 11


def name_header(name: str) -> bytes:
    """Mcp-Name as a client sends it: raw when plain ASCII, else ``=?base64?...?=`` (SEP-2243)."""
    raw = header_bytes(name)
    if raw is not None and name.isascii() and not looks_encoded(name):
        return raw
    return b"=?base64?" + base64.b64encode(name.encode()) + b"?="


def decoded_name(value: bytes) -> str | None:
    """What the server makes of an Mcp-Name header; None when it must refuse it."""
    text = value.decode("latin-1").strip()
    if not looks_encoded(text):
        return text
    try:
        return base64.b64decode(text[9:-2], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


Headers = dict[str, str | bytes]


def headers_for(method: Any, params: Any = None, *, version: str | None = VERSION) -> Headers:
    """The headers a well-behaved client sends for this body (where headers can carry it)."""
    headers: Headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if version is not None:
        headers["MCP-Protocol-Version"] = version
    if isinstance(method, str) and (raw := header_bytes(method)) is not None:
        headers["Mcp-Method"] = raw
    field_name = "name" if method == "tools/call" else "taskId" if method in TASK_METHODS else None
    if field_name and isinstance(params, dict) and isinstance(params.get(field_name), str):
        headers["Mcp-Name"] = name_header(params[field_name])
    return headers


def encode(body: Any) -> bytes:
    # ensure_ascii: lone surrogates would not survive UTF-8; allow_nan=False: no NaN by accident.
    return json.dumps(body, allow_nan=False).encode()


@dataclass
class Endpoint:
    url: str
    http: httpx.Client
    tools: frozenset[str]

    def post(
        self, body: Any, headers: Headers, *, raw: bytes | None = None, chunked: bool = False
    ) -> httpx.Response:
        content = raw if raw is not None else encode(body)
        # Header values go out byte for byte (the server decodes them as latin-1).
        # (names as ASCII, which is what httpx does with a str name).
        sent = {
            k.encode("ascii"): v.encode("latin-1") if isinstance(v, str) else v for k, v in headers.items()
        }
        if chunked:  # no Content-Length
            pieces = iter([content[i : i + 65_536] for i in range(0, len(content), 65_536)])
            return self.http.post(self.url, content=pieces, headers=sent, timeout=30)
        return self.http.post(self.url, content=content, headers=sent, timeout=30)

    def send(self, body: Any, headers: Headers | None = None) -> tuple[httpx.Response, dict[str, Any] | None]:
        """POST ``body`` (headers derived from it unless given) and check the contract."""
        if headers is None:
            headers = headers_for(body.get("method"), body.get("params")) if isinstance(body, dict) else {}
        response = self.post(body, headers)
        return response, check(response, body)


def request(method: str, params: dict[str, Any], request_id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


# ---- strategies ----------------------------------------------------------------------------------

# Strings without the known 500 triggers (NUL, lone surrogates): see the regression tests.
SAFE_CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
SAFE_TEXT = st.text(SAFE_CHARS, max_size=24)
PRINTABLE = string.ascii_letters + string.digits + string.punctuation
HEADER_TEXT = st.text(st.sampled_from(PRINTABLE + " "), min_size=1, max_size=40).map(str.strip).filter(bool)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
SCALARS = st.none() | st.booleans() | st.integers() | FINITE | SAFE_TEXT
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(SAFE_TEXT, inner, max_size=4),
    max_leaves=12,
)
NON_OBJECTS = st.none() | st.booleans() | st.integers() | FINITE | SAFE_TEXT | st.lists(SCALARS, max_size=3)
URLSAFE = string.ascii_letters + string.digits + "-_"
VERSION_STRINGS = st.one_of(
    st.sampled_from(
        ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05", "2026-07-29", "2026-7-28", "2026/07/28", ""]
    ),
    st.dates().map(str),
    HEADER_TEXT,
    SAFE_TEXT,
)
# Ids the server never issued (filtered against the canaries where they matter).
FORGED_IDS = st.one_of(
    st.text(st.sampled_from(URLSAFE), min_size=32, max_size=32),
    st.text(SAFE_CHARS, min_size=1, max_size=64),
    st.sampled_from(["' OR '1'='1", "%", "_", "*", "../../etc/passwd", "null", "0", "=?base64?", "\\"]),
    st.integers(1, 10**30).map(str),
)
ABSENT = object()


def maybe(key: str, strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A one-key dict, or an empty one (the key absent)."""
    return st.one_of(st.just({}), strategy.map(lambda value: {key: value}))


def long_text(alphabet: str | None = None) -> st.SearchStrategy[str]:
    """Strings of about 100 KB (a short random unit repeated)."""
    unit = st.text(st.sampled_from(alphabet), min_size=1, max_size=8) if alphabet else SAFE_TEXT.filter(bool)
    return st.builds(lambda u, n: (u * (n // len(u) + 1))[:n], unit, st.integers(90_000, 110_000))


def invalid_answers() -> st.SearchStrategy[Any]:
    """Answers that no confirm_delete question ({confirm: boolean}, required) may accept."""
    extra = st.dictionaries(
        SAFE_TEXT.filter(lambda k: k not in ("action", "content")), JSON_VALUES, max_size=3
    )
    content_extra = st.dictionaries(SAFE_TEXT.filter(lambda k: k != "confirm"), JSON_VALUES, max_size=3)
    bad_action = st.one_of(
        st.sampled_from(["Accept", "ACCEPT", "accept ", "declined", "ok", "yes", ""]),
        SAFE_TEXT.filter(lambda a: a not in ("accept", "decline", "cancel")),
        st.integers(),
        st.none(),
        st.booleans(),
        st.lists(SCALARS, max_size=2),
    )
    not_allowed_content = JSON_VALUES.filter(lambda c: c is not None and c != {})
    wrong_confirm = JSON_VALUES.filter(lambda v: v is not None and not isinstance(v, bool))
    return st.one_of(
        NON_OBJECTS,
        st.builds(lambda e, a: {**e, "action": a}, extra, bad_action),
        st.builds(lambda e, c: {**e, **c}, extra, maybe("content", JSON_VALUES)),  # no action
        st.builds(
            lambda a, c: {"action": a, "content": c},
            st.sampled_from(["decline", "cancel"]),
            not_allowed_content,
        ),
        st.just({"action": "accept"}),
        st.builds(lambda c: {"action": "accept", "content": c}, NON_OBJECTS.filter(lambda c: c is not None)),
        st.builds(lambda c: {"action": "accept", "content": c}, content_extra),  # confirm missing
        st.builds(
            lambda c, v: {"action": "accept", "content": {**c, "confirm": v}}, content_extra, wrong_confirm
        ),
    )


# ---- the database side ---------------------------------------------------------------------------


def task_count(stack: Stack) -> int:
    with stack.db() as conn:
        found = conn.execute("SELECT count(*) FROM mcp_tasks").fetchone()
    assert found is not None
    return int(found[0])


def snapshot(stack: Stack, task_id: str) -> dict[str, Any]:
    """The parts of a task a request could change: its row's state and its input rows."""
    row = stack.row(task_id)
    with stack.db() as conn:
        inputs = conn.execute(
            "SELECT key, method, params, response, superseded, answered_at "
            "FROM mcp_task_inputs WHERE task_id = %s ORDER BY key",
            (task_id,),
        ).fetchall()
    state = ("status", "status_message", "result", "error", "last_updated_at", "cancel_requested_at")
    return {**{name: row[name] for name in state}, "inputs": [tuple(item) for item in inputs]}


@dataclass
class Canaries:
    stack: Stack
    completed: str
    asking: str
    key: str
    before: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def ids(self) -> tuple[str, str]:
        return (self.completed, self.asking)

    def assert_unchanged(self) -> None:
        for task_id, before in self.before.items():
            assert snapshot(self.stack, task_id) == before, f"canary {task_id} changed"


def mcp_call(endpoint: Endpoint, method: str, params: dict[str, Any]) -> dict[str, Any]:
    response, reply = endpoint.send(request(method, params, request_id=uuid.uuid4().hex))
    assert reply is not None and "result" in reply, (response.status_code, reply)
    result: dict[str, Any] = reply["result"]
    return result


def wait_for_question(endpoint: Endpoint, task_id: str) -> str:
    """Wait until the task is input_required with one question; its key."""

    def asking() -> str | None:
        task = mcp_call(endpoint, "tasks/get", {"taskId": task_id, "_meta": meta()})
        assert task["status"] not in ("completed", "failed", "cancelled"), task
        requests = task.get("inputRequests") or {}
        return next(iter(requests)) if task["status"] == "input_required" and len(requests) == 1 else None

    return wait_until(asking, 30, what="the task to ask its question")


def start_confirm_delete(endpoint: Endpoint, filename: str) -> tuple[str, str]:
    params = {"name": "confirm_delete", "arguments": {"filename": filename}, "_meta": meta(**ELICITING)}
    created = mcp_call(endpoint, "tools/call", params)
    assert created["resultType"] == "task", created
    return created["taskId"], wait_for_question(endpoint, created["taskId"])


def cancel(endpoint: Endpoint, task_id: str) -> None:
    mcp_call(endpoint, "tasks/cancel", {"taskId": task_id, "_meta": meta()})


# ---- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def endpoint(stack: Stack) -> Iterator[Endpoint]:
    started = time.monotonic()
    with httpx.Client(timeout=30) as http:
        probe = Endpoint(stack.url, http, frozenset())
        tools = mcp_call(probe, "tools/list", {"_meta": meta()})["tools"]
        yield Endpoint(stack.url, http, frozenset(t["name"] for t in tools))
    total = sum(CASES.values())
    print("\n[fuzz] cases per strategy:")
    for name, count in CASES.items():
        print(f"[fuzz]   {name:<32} {count:>6}  ({SECONDS.get(name, 0):.1f} s)")
    print(f"[fuzz]   {'total':<32} {total:>6}  (module {time.monotonic() - started:.1f} s)")
    if SKIPPED_EQUIVALENT_STATES:
        print(
            "[fuzz] tampered requestStates that decoded to the original bytes (skipped):",
            dict(SKIPPED_EQUIVALENT_STATES),
        )


@pytest.fixture(scope="module")
def canaries(stack: Stack, endpoint: Endpoint) -> Iterator[Canaries]:
    """A completed task and an input_required one (it holds one worker process until teardown)."""
    done = mcp_call(endpoint, "tools/call", {"name": "noop", "arguments": {}, "_meta": meta()})
    assert done["resultType"] == "task", done
    wait_until(
        lambda: (
            mcp_call(endpoint, "tasks/get", {"taskId": done["taskId"], "_meta": meta()})["status"]
            == "completed"
        ),
        30,
        what="the noop canary to complete",
    )
    asking, key = start_confirm_delete(endpoint, f"canary-{uuid.uuid4().hex[:8]}.txt")
    birds = Canaries(stack, done["taskId"], asking, key)
    birds.before = {task_id: snapshot(stack, task_id) for task_id in birds.ids}
    assert birds.before[asking]["status"] == "input_required"
    try:
        yield birds
    finally:
        cancel(endpoint, asking)


@dataclass
class Run:
    """Counts one strategy's cases and checks, at the end, that no task appeared or changed."""

    name: str
    stack: Stack
    canaries: Canaries | None
    rows_before: int = 0
    started: float = 0.0

    def __enter__(self) -> Run:
        self.rows_before = task_count(self.stack)
        self.started = time.monotonic()
        return self

    def case(self) -> None:
        CASES[self.name] += 1

    def __exit__(self, *exc: object) -> None:
        SECONDS[self.name] = SECONDS.get(self.name, 0.0) + time.monotonic() - self.started
        print(f"\n[fuzz] {self.name}: {CASES[self.name]} cases in {SECONDS[self.name]:.1f} s")
        if exc[0] is None:
            assert task_count(self.stack) == self.rows_before, "a fuzz case created a task"
            if self.canaries is not None:
                self.canaries.assert_unchanged()


# ---- 1. malformed bodies -------------------------------------------------------------------------


@st.composite
def truncated_json(draw: st.DrawFn) -> bytes:
    params = draw(st.dictionaries(SAFE_TEXT, JSON_VALUES, max_size=4))
    body = encode(request(draw(st.sampled_from(KNOWN_METHODS)), {**params, "_meta": meta()}))
    return body[: draw(st.integers(0, len(body) - 1))]


@st.composite
def deeply_nested(draw: st.DrawFn) -> bytes:
    # Up to 800 levels here: deeper bodies are refused before dispatch (regression tests below).
    depth = draw(st.integers(1, 800))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ('{"params":', "}")]))
    inner = draw(st.sampled_from(["1", "null", '"x"', "[]", "{}", ""]))
    closing = depth if draw(st.booleans()) else draw(st.integers(0, depth))
    return (opener * depth + inner + closer * closing).encode()


WRONG_TOP_LEVEL = st.one_of(
    SCALARS,
    st.lists(JSON_VALUES, max_size=4),
    st.lists(st.just(request("tools/list", {"_meta": meta()})), max_size=3),
).map(encode)
MALFORMED = st.one_of(
    st.binary(max_size=300),
    truncated_json(),
    deeply_nested(),
    WRONG_TOP_LEVEL,
    st.text(SAFE_CHARS, max_size=60).map(str.encode),
    st.sampled_from(
        [b"", b" ", b"{", b"}", b"[", b'{"jsonrpc": "2.0"', b"\xef\xbb\xbf{}", b"\xff\xfe{}", b"{}{}"]
    ),
)


def test_malformed_bodies_are_parse_errors_or_invalid_requests(
    endpoint: Endpoint, stack: Stack, canaries: Canaries
) -> None:
    with Run("malformed bodies", stack, canaries) as run:

        @fuzz(1000)
        @given(raw=MALFORMED, with_headers=st.booleans())
        def case(raw: bytes, with_headers: bool) -> None:
            run.case()
            headers = headers_for("tools/list") if with_headers else {}
            response = endpoint.post(None, headers, raw=raw)
            reply = check(response, None)
            assert reply is not None and "error" in reply, reply
            assert response.status_code == 400 and reply["id"] is None, (response.status_code, reply)
            assert reply["error"]["code"] in (codes.PARSE_ERROR, codes.INVALID_REQUEST), reply

        case()


# ---- 2. JSON-RPC envelopes with wrong types --------------------------------------------------------


def envelope_verdict(body: Any) -> tuple[int, int | None] | None:
    """(HTTP status, error code) the envelope rules alone decide; None when the body passes them."""
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str):
        return 400, codes.INVALID_REQUEST
    if "id" in body and not valid_id(body["id"]):
        return 400, codes.INVALID_REQUEST
    params = body.get("params", {})
    if params is not None and not isinstance(params, dict):
        return 400, codes.INVALID_PARAMS
    if "id" not in body:
        return 202, None
    return None


@st.composite
def envelopes(draw: st.DrawFn, tools: frozenset[str]) -> dict[str, Any]:
    method = draw(
        st.one_of(
            st.sampled_from(KNOWN_METHODS + REMOVED_METHODS),
            SAFE_TEXT,
            st.integers(),
            FINITE,
            st.none(),
            st.booleans(),
            st.lists(SCALARS, max_size=2),
            st.dictionaries(SAFE_TEXT, SCALARS, max_size=2),
        )
    )
    random_params = st.dictionaries(SAFE_TEXT, JSON_VALUES, max_size=5)
    params = draw(
        st.one_of(
            st.just(ABSENT),
            st.none(),
            random_params,
            random_params.map(lambda p: {**p, "_meta": meta()}),
            st.builds(lambda p, t: {**p, "taskId": t, "_meta": meta()}, random_params, FORGED_IDS),
            st.builds(lambda p, n: {**p, "name": n, "_meta": meta()}, random_params, JSON_VALUES),
            st.lists(JSON_VALUES, max_size=3),
            SAFE_TEXT,
            st.integers(),
            FINITE,
            st.booleans(),
        )
    )
    # Never a valid tools/call: that would create a task.
    if isinstance(params, dict) and isinstance(params.get("name"), str) and params["name"] in tools:
        params["name"] = f"not-a-tool-{params['name']}"
    body: dict[str, Any] = {}
    body.update(draw(maybe("jsonrpc", st.sampled_from(["2.0", "2.0", "2.0", "1.0", "2", 2.0, 2, None, ""]))))
    body.update(
        draw(
            maybe(
                "id",
                st.one_of(
                    st.integers(),
                    SAFE_TEXT,
                    FINITE,
                    st.none(),
                    st.lists(SCALARS, max_size=3),
                    st.dictionaries(SAFE_TEXT, SCALARS, max_size=3),
                ),
            )
        )
    )
    body["method"] = method
    if params is not ABSENT:
        body["params"] = params
    extra = draw(st.dictionaries(SAFE_TEXT.filter(lambda k: k not in body), JSON_VALUES, max_size=2))
    keys = draw(st.permutations([*body, *extra]))
    merged = {**body, **extra}
    return {key: merged[key] for key in keys}


def test_envelopes_with_wrong_types_get_the_envelope_error_and_echo_valid_ids(
    endpoint: Endpoint, stack: Stack, canaries: Canaries
) -> None:
    with Run("wrong-typed envelopes", stack, canaries) as run:

        @fuzz(1000)
        @given(body=envelopes(endpoint.tools), matching_headers=st.booleans())
        def case(body: dict[str, Any], matching_headers: bool) -> None:
            method = body.get("method")
            assume(method != LEGACY_METHOD)
            run.case()
            headers = headers_for(method, body.get("params")) if matching_headers else headers_for(None)
            response, reply = endpoint.send(body, headers)
            verdict = envelope_verdict(body)
            if verdict == (202, None):
                assert response.status_code == 202
            elif verdict is not None:
                assert_error(reply, response, verdict[1] or 0, verdict[0])
            elif not matching_headers or "Mcp-Method" not in headers:
                assert_error(reply, response, codes.HEADER_MISMATCH, 400)

        case()


# ---- 3. _meta of wrong types, protocol versions ------------------------------------------------------


@st.composite
def metas(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(NON_OBJECTS)
    valid = meta(extension=draw(st.booleans()))
    result: dict[str, Any] = {}
    for key, good in valid.items():
        choice = draw(st.sampled_from(["good", "good", "absent", "wrong"]))
        if choice == "good":
            result[key] = good
        elif choice == "wrong":
            if key == PROTOCOL_VERSION_KEY:
                result[key] = draw(
                    st.one_of(VERSION_STRINGS, NON_OBJECTS, st.dictionaries(SAFE_TEXT, SCALARS))
                )
            elif key == CAPABILITIES_KEY:
                result[key] = draw(
                    st.one_of(
                        NON_OBJECTS,
                        st.dictionaries(SAFE_TEXT, JSON_VALUES, max_size=3),
                        st.builds(lambda e: {"extensions": e}, JSON_VALUES),
                        st.builds(lambda e: {"extensions": {TASKS_EXT: e}}, JSON_VALUES),
                        st.just({"tasks": {"requests": {}}}),
                    )
                )
            else:
                result[key] = draw(
                    st.one_of(NON_OBJECTS, st.dictionaries(SAFE_TEXT, JSON_VALUES, max_size=3))
                )
    result.update(draw(st.dictionaries(SAFE_TEXT.filter(lambda k: k not in valid), JSON_VALUES, max_size=3)))
    return result


def meta_verdict(method: str, raw: Any, header: str | None) -> tuple[int, int]:
    """(HTTP status, code) for a request to ``method`` whose only unusual part is its _meta."""
    if not isinstance(raw, dict):
        return 400, codes.INVALID_PARAMS
    version = raw.get(PROTOCOL_VERSION_KEY, ABSENT)
    capabilities = raw.get(CAPABILITIES_KEY, ABSENT)
    info = raw.get(CLIENT_INFO_KEY)
    if not isinstance(version, str) or not isinstance(capabilities, dict):
        return 400, codes.INVALID_PARAMS
    if info is not None and not isinstance(info, dict):
        return 400, codes.INVALID_PARAMS
    if header is None or header != version:
        return 400, codes.HEADER_MISMATCH
    if version != VERSION:
        return 400, codes.UNSUPPORTED_PROTOCOL_VERSION
    if method in ("server/discover", "tools/list"):
        return 200, 0
    extensions = capabilities.get("extensions")
    if method in TASK_METHODS and not (isinstance(extensions, dict) and TASKS_EXT in extensions):
        return 400, codes.MISSING_REQUIRED_CLIENT_CAPABILITY
    return 400, codes.INVALID_PARAMS  # unknown task / unknown tool


def test_meta_fields_of_wrong_types_and_protocol_versions(
    endpoint: Endpoint, stack: Stack, canaries: Canaries
) -> None:
    with Run("_meta and protocol versions", stack, canaries) as run:

        @fuzz(700)
        @given(
            method=st.sampled_from(["server/discover", "tools/list", "tools/call", *TASK_METHODS]),
            raw_meta=metas(),
            header=st.one_of(st.just("same"), st.just(VERSION), st.none(), VERSION_STRINGS),
            task_id=FORGED_IDS,
            request_id=st.one_of(st.integers(), SAFE_TEXT),
        )
        def case(method: str, raw_meta: Any, header: str | None, task_id: str, request_id: Any) -> None:
            assume(task_id not in canaries.ids)
            run.case()
            params: dict[str, Any] = {"_meta": raw_meta}
            if method == "tools/call":
                params.update(name="no_such_tool", arguments={})
            elif method in TASK_METHODS:
                params["taskId"] = task_id
                if method == "tasks/update":
                    params["inputResponses"] = {}
            if header == "same":
                version = raw_meta.get(PROTOCOL_VERSION_KEY) if isinstance(raw_meta, dict) else None
                header = version if isinstance(version, str) else VERSION
            sendable = header if header is not None and header_bytes(header) is not None else None
            headers = headers_for(method, params, version=sendable)
            response, reply = endpoint.send(request(method, params, request_id), headers)
            status, code = meta_verdict(method, raw_meta, sendable)
            if status == 200:
                assert reply is not None and "result" in reply, (response.status_code, reply)
            else:
                assert_error(reply, response, code, status)

        case()


# ---- 4. huge values ------------------------------------------------------------------------------


@st.composite
def huge_requests(draw: st.DrawFn, tools: frozenset[str]) -> tuple[Any, Headers, bytes | None]:
    """(body, headers, raw bytes to send instead of the body or None)."""
    kind = draw(st.sampled_from(["long string", "big integer", "many keys", "too large"]))
    params: dict[str, Any] = {"_meta": meta()}
    method = draw(st.sampled_from(["tools/list", "tasks/get", "tools/call"]))
    if method == "tasks/get":
        params["taskId"] = draw(FORGED_IDS)
    elif method == "tools/call":
        params.update(name="no_such_tool", arguments={})
    body = request(method, params, draw(st.integers(-(2**63), 2**63)))
    headers = headers_for(method, params)
    if kind == "long string":
        text = draw(long_text())
        where = draw(
            st.sampled_from(
                [
                    "id",
                    "method",
                    "taskId",
                    "name",
                    "protocolVersion",
                    "clientInfo",
                    "extra",
                    "argument",
                    "headers",
                ]
            )
        )
        if where == "id":
            body["id"] = text
        elif where == "method":
            body["method"] = text = draw(long_text(PRINTABLE))
            headers["Mcp-Method"] = text
        elif where == "taskId":
            body.update(method="tasks/get", params={"taskId": text, "_meta": meta()})
            headers = headers_for("tasks/get", body["params"])
        elif where == "name":
            body.update(method="tools/call", params={"name": text, "arguments": {}, "_meta": meta()})
            headers = headers_for("tools/call", body["params"])
        elif where == "protocolVersion":
            params["_meta"][PROTOCOL_VERSION_KEY] = text = draw(long_text(PRINTABLE))
            headers["MCP-Protocol-Version"] = text
        elif where == "clientInfo":
            params["_meta"][CLIENT_INFO_KEY] = {"name": text, "version": text}
        elif where == "extra":
            params[draw(SAFE_TEXT)] = text
        elif where == "argument":
            body.update(
                method="tools/call",
                params={"name": "no_such_tool", "arguments": {"x": text}, "_meta": meta()},
            )
            headers = headers_for("tools/call", body["params"])
        else:
            name = draw(
                st.sampled_from(["Mcp-Name", "Mcp-Method", "MCP-Protocol-Version", "X-Filler", "Accept"])
            )
            headers[name] = draw(long_text(PRINTABLE))
        return body, headers, None
    if kind == "big integer":
        digits = draw(st.integers(19, 5000))
        number = draw(st.sampled_from(["", "-"])) + "9" * digits
        where = draw(st.sampled_from(["id", "taskId", "protocolVersion", "extra", "float"]))
        placeholder = '"__NUMBER__"'
        if where == "float":
            # Not 1e999: it overflows to inf, echoed as Infinity (regression test below).
            number, where = (
                draw(st.sampled_from(["1e308", "-1e308", "5e-324", "-0.0", "1E+300", "0.1"])),
                "id",
            )
        if where == "id":
            body["id"] = "__NUMBER__"
        elif where == "taskId":
            body.update(method="tasks/get", params={"taskId": "__NUMBER__", "_meta": meta()})
        elif where == "protocolVersion":
            params["_meta"][PROTOCOL_VERSION_KEY] = "__NUMBER__"
        else:
            params["big"] = "__NUMBER__"
        headers = headers_for(body["method"], body["params"])
        if where == "taskId":
            headers.pop("Mcp-Name", None)  # tolerated on tasks/*: let the number reach validation
        return body, headers, encode(body).replace(placeholder.encode(), number.encode())
    if kind == "many keys":
        count = draw(st.integers(1_000, 25_000))
        many = {f"k{i}": i for i in range(count)}
        where = draw(st.sampled_from(["params", "_meta", "capabilities", "arguments", "inputResponses"]))
        if where == "params":
            params.update(many)
        elif where == "_meta":
            params["_meta"].update(many)
        elif where == "capabilities":
            params["_meta"][CAPABILITIES_KEY].update(many)
        elif where == "arguments":
            body.update(
                method="tools/call", params={"name": "no_such_tool", "arguments": many, "_meta": meta()}
            )
        else:
            params = {"taskId": draw(FORGED_IDS), "inputResponses": many, "_meta": meta()}
            body.update(method="tasks/update", params=params)
        headers = headers_for(body["method"], body["params"])
        return body, headers, None
    size = draw(st.integers(MAX_BODY_BYTES + 1, MAX_BODY_BYTES + 200_000))
    params["filler"] = ""
    filler = "x" * (size - len(encode(body)))
    params["filler"] = filler
    return body, headers, None


def test_huge_values_are_answered_without_server_errors(
    endpoint: Endpoint, stack: Stack, canaries: Canaries
) -> None:
    with Run("huge values", stack, canaries) as run:

        @fuzz(120)
        @given(generated=huge_requests(endpoint.tools), chunked=st.booleans())
        def case(generated: tuple[Any, Headers, bytes | None], chunked: bool) -> None:
            run.case()
            body, headers, raw = generated
            content = raw if raw is not None else encode(body)
            # A ~100 KB header value makes the head too large: refused 431 before anything runs,
            # and the connection closed (a client still sending may see the close instead).
            huge_head = sum(len(k) + len(v) + 4 for k, v in headers.items()) > MAX_HEADER_BYTES
            try:
                response = endpoint.post(None, headers, raw=content, chunked=chunked)
            except httpx.TransportError:
                assert huge_head, "the connection was cut under a request head of normal size"
                return
            if huge_head:
                assert response.status_code == 431, response
                return
            try:
                sent = json.loads(content) if len(content) <= MAX_BODY_BYTES else body
            except ValueError:  # more than 4300 digits: Python's int limit makes it a parse error
                sent = None
            reply = check(response, sent)
            if len(content) > MAX_BODY_BYTES:
                assert_error(reply, response, codes.INVALID_REQUEST, 413)
            elif body["method"] == "tools/call":
                assert reply is not None and "error" in reply, reply

        case()


# ---- 5. unknown methods --------------------------------------------------------------------------


def test_unknown_methods_are_method_not_found_with_http_404(
    endpoint: Endpoint, stack: Stack, canaries: Canaries
) -> None:
    known = set(KNOWN_METHODS)
    variants = st.sampled_from(KNOWN_METHODS).flatmap(
        lambda m: st.sampled_from(
            [m.upper(), m.title(), m + "/", "/" + m, m.replace("/", "."), m + "s", m[:-1]]
        )
    )
    with Run("unknown methods", stack, canaries) as run:

        @fuzz(500)
        @given(
            method=st.one_of(st.sampled_from(REMOVED_METHODS), variants, SAFE_TEXT, HEADER_TEXT),
            params=st.one_of(
                st.just({}), st.just({"_meta": meta()}), st.dictionaries(SAFE_TEXT, JSON_VALUES)
            ),
            header=st.one_of(st.just("same"), st.none(), HEADER_TEXT),
            request_id=st.one_of(st.just(ABSENT), st.integers(), SAFE_TEXT),
        )
        def case(method: str, params: dict[str, Any], header: str | None, request_id: Any) -> None:
            assume(method not in known and method != LEGACY_METHOD)
            run.case()
            body = request(method, params, request_id)
            if request_id is ABSENT:
                del body["id"]
            headers = headers_for(method if header == "same" else None)
            if header not in (None, "same"):
                headers["Mcp-Method"] = header
            response, reply = endpoint.send(body, headers)
            sent_method = headers.get("Mcp-Method")
            if isinstance(sent_method, str):
                sent_method = sent_method.encode("latin-1")
            if request_id is ABSENT:
                assert response.status_code == 202
            elif sent_method is not None and sent_method.decode("latin-1").strip() == method:
                assert_error(reply, response, codes.METHOD_NOT_FOUND, 404)
            else:
                assert_error(reply, response, codes.HEADER_MISMATCH, 400)

        case()


# ---- 6. routing headers --------------------------------------------------------------------------

# (Origin, allowed?)
ORIGINS = [
    ("http://localhost:1234", True),
    ("http://127.0.0.1", True),
    ("http://127.0.0.2:8080", True),
    ("http://[::1]:80", True),
    ("https://localhost", True),
    ("http://evil.example", False),
    ("null", False),
    ("", False),
    ("https://example.com:443", False),
    ("http://127.0.0.1.evil.example", False),
    ("http://localhost.evil.example", False),
]


@st.composite
def routed_requests(draw: st.DrawFn) -> tuple[dict[str, Any], Headers, tuple[int, int]]:
    """A request, fuzzed routing headers, and what the body alone would get with correct headers."""
    kind = draw(st.sampled_from(["tasks/get", "tasks/cancel", "tools/call", "tools/list"]))
    params: dict[str, Any] = {"_meta": meta()}
    if kind == "tools/call":
        name = draw(
            st.sampled_from(
                ["greet", "no_such_tool", "grüße-tool", "tool with spaces", "=?base64?Zm9v?=", "ツール"]
            )
        )
        params.update(name=name, arguments={})
        # greet without its argument: a tool execution error the model can correct (a result
        # with isError, no task); an unknown tool: -32602.
        expected = (200, 0) if name == "greet" else (400, codes.INVALID_PARAMS)
    elif kind == "tools/list":
        expected = (200, 0)
    else:
        params["taskId"] = draw(FORGED_IDS)
        expected = (400, codes.INVALID_PARAMS)
    headers = headers_for(kind, params)
    method_header = draw(st.sampled_from(["same", "absent", "other", "upper", "random"]))
    if method_header == "absent":
        del headers["Mcp-Method"]
    elif method_header == "other":
        headers["Mcp-Method"] = draw(st.sampled_from([m for m in KNOWN_METHODS if m != kind]))
    elif method_header == "upper":
        headers["Mcp-Method"] = kind.upper()
    elif method_header == "random":
        headers["Mcp-Method"] = draw(HEADER_TEXT)
    value = params.get("name", params.get("taskId", "x"))
    name_choice = draw(
        st.sampled_from(
            [
                "same",
                "absent",
                "raw",
                "base64",
                "base64 of another",
                "malformed",
                "bad utf-8",
                "random",
                "BASE64",
            ]
        )
    )
    if name_choice == "absent":
        headers.pop("Mcp-Name", None)
    elif name_choice == "raw" and (raw := header_bytes(value)) is not None:
        headers["Mcp-Name"] = raw
    elif name_choice == "base64":
        headers["Mcp-Name"] = b"=?base64?" + base64.b64encode(value.encode()) + b"?="
    elif name_choice == "base64 of another":
        other = draw(SAFE_TEXT)
        headers["Mcp-Name"] = b"=?base64?" + base64.b64encode(other.encode()) + b"?="
    elif name_choice == "malformed":
        headers["Mcp-Name"] = "=?base64?" + draw(st.text(st.sampled_from(PRINTABLE), max_size=16)) + "?="
    elif name_choice == "bad utf-8":
        junk = draw(st.binary(min_size=1, max_size=12).filter(lambda b: not _utf8(b)))
        headers["Mcp-Name"] = b"=?base64?" + base64.b64encode(junk) + b"?="
    elif name_choice == "random":
        headers["Mcp-Name"] = draw(HEADER_TEXT)
    elif name_choice == "BASE64":
        headers["Mcp-Name"] = b"=?BASE64?" + base64.b64encode(value.encode()) + b"?="
    version_choice = draw(st.sampled_from(["same", "same", "absent", "other"]))
    if version_choice == "absent":
        del headers["MCP-Protocol-Version"]
    elif version_choice == "other":
        headers["MCP-Protocol-Version"] = draw(
            VERSION_STRINGS.filter(lambda v: v != VERSION and header_bytes(v) is not None)
        )
    origin, allowed = draw(st.sampled_from([(None, True), (None, True), *ORIGINS]))
    if origin is not None:
        headers["Origin"] = origin
    for header, choices in (
        ("Authorization", st.one_of(HEADER_TEXT, HEADER_TEXT.map(lambda t: "Bearer " + t))),
        ("Accept", st.sampled_from(["text/event-stream", "*/*", "application/json", "text/html", "garbage"])),
        ("Content-Type", st.sampled_from(["text/plain", "application/x-www-form-urlencoded", "garbage", ""])),
    ):
        if draw(st.integers(0, 3)) == 0:
            headers[header] = draw(choices)
    if draw(st.integers(0, 5)) == 0:
        headers.pop("Accept", None)
        headers.pop("Content-Type", None)
    return request(kind, params, draw(st.integers())), headers, (expected if allowed else (403, 0))


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode("latin-1") if isinstance(value, str) else value


def routing_verdict(body: dict[str, Any], headers: Headers, expected: tuple[int, int]) -> tuple[int, int]:
    """Origin, Accept, then Mcp-Method, Mcp-Name and MCP-Protocol-Version, as Streamable HTTP
    2026-07-28 orders the headers."""
    if expected[0] == 403:
        return 403, codes.INVALID_REQUEST
    if headers.get("Accept") in ("text/html", "garbage"):  # names neither JSON nor SSE
        return 406, codes.INVALID_REQUEST
    method, params = body["method"], body["params"]
    sent_method = headers.get("Mcp-Method")
    if sent_method is None or _as_bytes(sent_method).decode("latin-1").strip() != method:
        return 400, codes.HEADER_MISMATCH
    field_name = {"tools/call": "name", "tasks/get": "taskId", "tasks/cancel": "taskId"}.get(method)
    sent_name = headers.get("Mcp-Name")
    if field_name is not None:
        if sent_name is None:
            if method == "tools/call":
                return 400, codes.HEADER_MISMATCH
        elif decoded_name(_as_bytes(sent_name)) != params[field_name]:
            return 400, codes.HEADER_MISMATCH
    if headers.get("MCP-Protocol-Version") != VERSION:
        return 400, codes.HEADER_MISMATCH
    return expected


def test_routing_headers_missing_mismatched_or_malformed(
    endpoint: Endpoint, stack: Stack, canaries: Canaries
) -> None:
    with Run("routing headers", stack, canaries) as run:

        @fuzz(1000)
        @given(generated=routed_requests())
        def case(generated: tuple[dict[str, Any], Headers, tuple[int, int]]) -> None:
            run.case()
            body, headers, expected = generated
            response, reply = endpoint.send(body, headers)
            status, code = routing_verdict(body, headers, expected)
            if status == 200:
                assert reply is not None and "result" in reply, (response.status_code, reply)
            else:
                assert_error(reply, response, code, status)

        case()


# ---- 7. forged task ids --------------------------------------------------------------------------


def mutated_ids(ids: tuple[str, ...]) -> st.SearchStrategy[str]:
    """Near misses of real task ids: one character changed, case, prefixes, padding."""

    def near(task_id: str) -> st.SearchStrategy[str]:
        one_char = st.integers(0, len(task_id) - 1).flatmap(
            lambda i: (
                st.sampled_from(URLSAFE)
                .filter(lambda c: c != task_id[i])
                .map(lambda c: task_id[:i] + c + task_id[i + 1 :])
            )
        )
        fixed = [
            task_id.upper(),
            task_id.lower(),
            task_id[:-1],
            task_id[1:],
            task_id + "x",
            " " + task_id,
            task_id + " ",
            task_id + "\n",
            task_id * 2,
            task_id + "%",
            task_id[:8],
            f"{task_id}' OR '1'='1",
        ]
        return st.one_of(one_char, st.sampled_from(fixed))

    return st.sampled_from(ids).flatmap(near).filter(lambda forged: forged not in ids)


def test_forged_task_ids_are_unknown_tasks(endpoint: Endpoint, stack: Stack, canaries: Canaries) -> None:
    with Run("forged task ids", stack, canaries) as run:

        @fuzz(600)
        @given(
            method=st.sampled_from([*TASK_METHODS, "subscriptions/listen"]),
            forged=st.lists(st.one_of(FORGED_IDS, mutated_ids(canaries.ids)), min_size=1, max_size=3),
            responses=st.dictionaries(SAFE_TEXT, JSON_VALUES, max_size=3),
            request_id=st.one_of(st.integers(), SAFE_TEXT),
        )
        def case(method: str, forged: list[str], responses: dict[str, Any], request_id: Any) -> None:
            assume(not set(forged) & set(canaries.ids))
            run.case()
            params: dict[str, Any] = {"_meta": meta()}
            if method == "subscriptions/listen":
                params["notifications"] = {"taskIds": forged}
            else:
                params["taskId"] = forged[0]
                if method == "tasks/update":
                    params["inputResponses"] = responses
            response, reply = endpoint.send(request(method, params, request_id))
            if method == "subscriptions/listen":
                assert reply is not None and reply.get("result", {}).get("resultType") == "complete", reply
                ack = sse_messages(response.content)[0]
                assert ack["method"] == "notifications/subscriptions/acknowledged", ack
                assert ack["params"]["notifications"]["taskIds"] == [], ack
            else:
                assert_error(reply, response, codes.INVALID_PARAMS, 400)
                assert reply is not None and reply["error"]["message"] == UNKNOWN_TASK, reply

        case()


# ---- 8. rejected requests aimed at real tasks ------------------------------------------------------

# defect -> (HTTP status, JSON-RPC code) when it is the only one
DEFECTS: dict[str, tuple[int, int | None]] = {
    "no tasks extension": (400, codes.MISSING_REQUIRED_CLIENT_CAPABILITY),
    "legacy tasks capability only": (400, codes.MISSING_REQUIRED_CLIENT_CAPABILITY),
    "extensions not an object": (400, codes.MISSING_REQUIRED_CLIENT_CAPABILITY),
    "no Mcp-Method": (400, codes.HEADER_MISMATCH),
    "other Mcp-Method": (400, codes.HEADER_MISMATCH),
    "other Mcp-Name": (400, codes.HEADER_MISMATCH),
    "malformed base64 Mcp-Name": (400, codes.HEADER_MISMATCH),
    "base64 Mcp-Name of another id": (400, codes.HEADER_MISMATCH),
    "no MCP-Protocol-Version": (400, codes.HEADER_MISMATCH),
    "other MCP-Protocol-Version": (400, codes.HEADER_MISMATCH),
    "unsupported protocol version": (400, codes.UNSUPPORTED_PROTOCOL_VERSION),
    "no _meta": (400, codes.INVALID_PARAMS),
    "_meta not an object": (400, codes.INVALID_PARAMS),
    "protocolVersion not a string": (400, codes.INVALID_PARAMS),
    "id of a wrong type": (400, codes.INVALID_REQUEST),
    "jsonrpc 1.0": (400, codes.INVALID_REQUEST),
    "no jsonrpc": (400, codes.INVALID_REQUEST),
    "params a list": (400, codes.INVALID_PARAMS),
    "batch": (400, codes.INVALID_REQUEST),
    "foreign Origin": (403, codes.INVALID_REQUEST),
    "notification": (202, None),
    "truncated": (400, codes.PARSE_ERROR),
    "too large": (413, codes.INVALID_REQUEST),
    "method in another case": (404, codes.METHOD_NOT_FOUND),
    "taskId of a wrong type": (400, codes.HEADER_MISMATCH),
}


@st.composite
def defective(draw: st.DrawFn, canaries: Canaries) -> tuple[list[str], Any, Headers, bytes | None]:
    method = draw(st.sampled_from(["tasks/cancel", "tasks/update"]))
    task_id = draw(st.sampled_from(canaries.ids))
    params: dict[str, Any] | list[Any]  # a list once the "params a list" defect wrapped it
    params = {"taskId": task_id, "_meta": meta()}
    if method == "tasks/update":
        params["inputResponses"] = {canaries.key: draw(st.sampled_from([YES, {"action": "decline"}]))}
    body: Any = request(method, params, draw(st.one_of(st.integers(), SAFE_TEXT)))
    headers = headers_for(method, params)
    names = draw(st.lists(st.sampled_from(sorted(DEFECTS)), min_size=1, max_size=2, unique=True))
    raw: bytes | None = None
    for name in sorted(names, key=lambda n: n in ("batch", "truncated", "too large")):  # body-level last
        meta_ = params.get("_meta") if isinstance(params, dict) else None
        if name == "no tasks extension" and isinstance(meta_, dict):
            meta_[CAPABILITIES_KEY] = {}
        elif name == "legacy tasks capability only" and isinstance(meta_, dict):
            meta_[CAPABILITIES_KEY] = {"tasks": {"requests": {"tools": {"call": {}}}}}
        elif name == "extensions not an object" and isinstance(meta_, dict):
            meta_[CAPABILITIES_KEY] = {"extensions": draw(st.sampled_from([[TASKS_EXT], TASKS_EXT, 1, None]))}
        elif name == "no Mcp-Method":
            headers.pop("Mcp-Method", None)
        elif name == "other Mcp-Method":
            headers["Mcp-Method"] = draw(st.sampled_from([m for m in KNOWN_METHODS if m != method]))
        elif name == "other Mcp-Name":
            headers["Mcp-Name"] = draw(st.sampled_from([i for i in canaries.ids if i != task_id]))
        elif name == "malformed base64 Mcp-Name":
            headers["Mcp-Name"] = "=?base64?" + task_id + "*?="
        elif name == "base64 Mcp-Name of another id":
            other = draw(st.sampled_from([i for i in canaries.ids if i != task_id]))
            headers["Mcp-Name"] = b"=?base64?" + base64.b64encode(other.encode()) + b"?="
        elif name == "no MCP-Protocol-Version":
            headers.pop("MCP-Protocol-Version", None)
        elif name == "other MCP-Protocol-Version":
            headers["MCP-Protocol-Version"] = "2025-11-25"
        elif name == "unsupported protocol version" and isinstance(meta_, dict):
            meta_[PROTOCOL_VERSION_KEY] = headers["MCP-Protocol-Version"] = "2025-06-18"
        elif name == "no _meta" and isinstance(params, dict):
            params.pop("_meta", None)
        elif name == "_meta not an object" and isinstance(params, dict):
            params["_meta"] = draw(NON_OBJECTS)
        elif name == "protocolVersion not a string" and isinstance(meta_, dict):
            meta_[PROTOCOL_VERSION_KEY] = draw(st.one_of(st.integers(), st.none(), st.just(["2026-07-28"])))
        elif name == "id of a wrong type" and "id" in body:
            body["id"] = draw(st.one_of(FINITE, st.none(), st.lists(SCALARS, max_size=2), st.just({"id": 1})))
        elif name == "jsonrpc 1.0":
            body["jsonrpc"] = "1.0"
        elif name == "no jsonrpc":
            body.pop("jsonrpc", None)
        elif name == "params a list":
            body["params"] = params = [params]
        elif name == "foreign Origin":
            headers["Origin"] = "http://evil.example"
        elif name == "notification":
            body.pop("id", None)
        elif name == "method in another case":
            body["method"] = headers["Mcp-Method"] = method.title()
        elif name == "taskId of a wrong type" and isinstance(params, dict):
            params["taskId"] = draw(st.sampled_from([[task_id], {"id": task_id}, 1]))
        elif name == "batch":
            body = [body]
        elif name == "truncated":
            text = encode(body)
            raw = text[: draw(st.integers(0, len(text) - 1))]
        elif name == "too large":
            text = encode(body)
            raw = text[:-1] + b', "filler": "' + b"x" * MAX_BODY_BYTES + b'"}'
    return names, body, headers, raw


def test_rejected_requests_aimed_at_real_tasks_change_nothing(
    endpoint: Endpoint, stack: Stack, canaries: Canaries
) -> None:
    with Run("defective requests on real tasks", stack, canaries) as run:

        @fuzz(400)
        @given(generated=defective(canaries))
        def case(generated: tuple[list[str], Any, Headers, bytes | None]) -> None:
            run.case()
            names, body, headers, raw = generated
            response = endpoint.post(body, headers, raw=raw)
            reply = check(response, body if raw is None else None)
            if names == ["notification"]:
                assert response.status_code == 202
            else:
                assert response.status_code != 200, (names, reply)
                assert response.status_code == 202 or (reply is not None and "error" in reply), (names, reply)
            if len(names) == 1 and names != ["notification"]:
                status, code = DEFECTS[names[0]]
                assert_error(reply, response, code or 0, status)
            canaries.assert_unchanged()

        case()


# ---- 9. wrong-shaped inputResponses on a real input_required task ---------------------------------------


def test_wrong_shaped_input_responses_are_refused_and_record_nothing(
    endpoint: Endpoint, stack: Stack, canaries: Canaries
) -> None:
    key = canaries.key
    unknown_keys = st.one_of(
        SAFE_TEXT, st.sampled_from([key.upper(), key + " ", " " + key, key[:-1], key + "~2", ""])
    ).filter(lambda k: k != key)
    others = st.dictionaries(unknown_keys, JSON_VALUES, max_size=3)
    responses = st.one_of(
        st.just(ABSENT),
        NON_OBJECTS,
        st.builds(lambda o, a: {**o, key: a}, others, invalid_answers()),
        others,  # nothing outstanding among them: acknowledged, nothing recorded
    )
    with Run("wrong-shaped inputResponses", stack, canaries) as run:

        @fuzz(450)
        @given(target=st.sampled_from(["asking", "asking", "completed"]), answers=responses)
        def case(target: str, answers: Any) -> None:
            run.case()
            task_id = canaries.asking if target == "asking" else canaries.completed
            params: dict[str, Any] = {"taskId": task_id, "_meta": meta()}
            if answers is not ABSENT:
                params["inputResponses"] = answers
            response, reply = endpoint.send(request("tasks/update", params, uuid.uuid4().hex))
            if not isinstance(answers, dict) or (target == "asking" and key in answers):
                assert_error(reply, response, codes.INVALID_PARAMS, 400)
            else:
                assert reply is not None and "result" in reply, (response.status_code, reply)
                assert {k: v for k, v in reply["result"].items() if k != "_meta"} == {
                    "resultType": "complete"
                }
            canaries.assert_unchanged()

        case()


# ---- 10. tampered requestState (MRTR) ----------------------------------------------------------------


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def opened_bytes(state: str) -> tuple[str, bytes] | None:
    """(key id, bytes) as the server decodes a state (leniently), or None if it cannot."""
    key_id, _, blob = state.partition(".")
    try:
        return key_id, base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4))
    except (binascii.Error, ValueError):
        return None


@st.composite
def tampered_states(draw: st.DrawFn, state: str) -> tuple[str, Any]:
    key_id, _, blob = state.partition(".")
    decoded = opened_bytes(state)
    assert decoded is not None
    raw = decoded[1]
    kind = draw(
        st.sampled_from(
            [
                "flip a bit",
                "change a character",
                "truncate",
                "truncate the bytes",
                "swap the key id",
                "drop the key id",
                "append",
                "insert",
                "random blob",
                "reorder",
                "garbage",
                "not a string",
                "genuine",
            ]
        )
    )
    if kind == "flip a bit":
        i = draw(st.integers(0, len(raw) - 1))
        out: Any = f"{key_id}.{b64(raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1 :])}"
    elif kind == "change a character":
        i = draw(st.integers(0, len(blob) - 1))
        c = draw(st.sampled_from(URLSAFE + "+/=.!*").filter(lambda c: c != blob[i]))
        out = f"{key_id}.{blob[:i]}{c}{blob[i + 1 :]}"
    elif kind == "truncate":
        out = state[: draw(st.integers(0, len(state) - 1))]
    elif kind == "truncate the bytes":
        out = f"{key_id}.{b64(raw[: draw(st.integers(0, len(raw) - 1))])}"
    elif kind == "swap the key id":
        other = draw(
            st.one_of(st.text(st.sampled_from("0123456789abcdef"), min_size=8, max_size=8), HEADER_TEXT)
        )
        assume(other != key_id)
        out = f"{other}.{blob}"
    elif kind == "drop the key id":
        out = draw(st.sampled_from([blob, "." + blob, blob + "." + key_id]))
    elif kind == "append":
        out = state + draw(st.text(SAFE_CHARS, min_size=1, max_size=20))
    elif kind == "insert":
        i = draw(st.integers(0, len(state)))
        out = state[:i] + draw(st.text(SAFE_CHARS, min_size=1, max_size=8)) + state[i:]
    elif kind == "random blob":
        out = f"{key_id}.{b64(draw(st.binary(max_size=200)))}"
    elif kind == "reorder":
        out = f"{key_id}.{b64(raw[12:] + raw[:12])}"  # nonce moved behind the ciphertext
    elif kind == "garbage":
        out = draw(SAFE_TEXT)
    elif kind == "not a string":
        out = draw(
            st.one_of(st.integers(), FINITE, st.booleans(), st.lists(SCALARS, max_size=2), st.just({}))
        )
    else:
        out = state
    return kind, out


def test_tampered_request_states_are_invalid_params_and_reach_no_task(
    endpoint: Endpoint, stack: Stack, canaries: Canaries
) -> None:
    filename = f"mrtr-{uuid.uuid4().hex[:8]}.txt"
    arguments = {"filename": filename}
    # Round one of a synchronous call (no tasks extension) that elicits: MRTR.
    first = mcp_call(
        endpoint,
        "tools/call",
        {"name": "confirm_delete", "arguments": arguments, "_meta": meta(False, **ELICITING)},
    )
    assert first["resultType"] == "input_required", first
    (key,) = first["inputRequests"]
    state = first["requestState"]
    with stack.db() as conn:
        found = conn.execute(
            "SELECT task_id FROM mcp_tasks "
            "WHERE tool_name = 'confirm_delete' AND arguments ->> 'filename' = %s",
            (filename,),
        ).fetchone()
    assert found is not None
    task_id = str(found[0])
    before = snapshot(stack, task_id)
    assert before["status"] == "input_required"
    original = opened_bytes(state)

    with Run("tampered requestState", stack, canaries) as run:

        @fuzz(400)
        @given(
            tampered=tampered_states(state),
            answer=st.one_of(st.just(YES), st.just(YES), invalid_answers()),
            extension=st.booleans(),
        )
        def case(tampered: tuple[str, Any], answer: Any, extension: bool) -> None:
            kind, request_state = tampered
            same = isinstance(request_state, str) and opened_bytes(request_state) == original
            if same and answer == YES:
                # The genuine state, or another spelling of its bytes (base64 is lenient):
                # it would answer the question. Count it; only invalid answers go with it.
                SKIPPED_EQUIVALENT_STATES[kind] += 1
                assume(False)
            run.case()
            params = {
                "name": "confirm_delete",
                "arguments": arguments,
                "_meta": meta(extension, **ELICITING),
                "inputResponses": {key: answer},
                "requestState": request_state,
            }
            response, reply = endpoint.send(request("tools/call", params, uuid.uuid4().hex))
            assert_error(reply, response, codes.INVALID_PARAMS, 400)
            assert snapshot(stack, task_id) == before, f"the MRTR task changed ({kind})"

        case()

    # The genuine retry still works after all that.
    done = mcp_call(
        endpoint,
        "tools/call",
        {
            "name": "confirm_delete",
            "arguments": arguments,
            "_meta": meta(False, **ELICITING),
            "inputResponses": {key: YES},
            "requestState": state,
        },
    )
    assert done["content"] == [{"type": "text", "text": f"Deleted {filename}"}], done


# ---- regression tests: product bugs the fuzzing found -------------------------------------------------
#
# Each of these once got a 500, a body that is not JSON, or a change it had no business making.
# Fixed since: a body that does not parse (NaN, Infinity, nesting that exhausts the parser) is a
# -32700 with id null; a parsed body nested deeper than 64 levels, or holding a NUL character, an
# unpaired surrogate (in a key or a value) or a non-finite number (1e999) is refused with HTTP 400
# and -32600 "Invalid request: ..." before anything reads or stores it, echoing the id when the id
# itself is a clean string or integer; ids are strings or integers, never booleans or floats.


def plain_post(
    endpoint: Endpoint, raw: bytes, method: str = "tools/list", name: str | None = None
) -> httpx.Response:
    headers = headers_for(method)
    if name is not None:
        headers["Mcp-Name"] = name
    return endpoint.post(None, headers, raw=raw)


def assert_refused(
    response: httpx.Response, sent: Any, code: int, status: int = 400, *, echoed: Any = None
) -> dict[str, Any]:
    """A well-formed JSON-RPC error ``code`` with HTTP ``status`` whose id is ``echoed`` (None: null)."""
    # ``check`` insists on the id of a request with a valid id coming back; the ids refused here
    # (or not echoed on purpose) are checked below instead.
    reply = check(response, sent if echoed is not None else None)
    assert_error(reply, response, code, status)
    assert reply is not None
    assert reply["id"] == echoed and type(reply["id"]) is type(echoed), (echoed, reply)
    return reply


def assert_unstorable(response: httpx.Response, sent: Any, *, echoed: Any = None) -> None:
    """Refused after parsing, before anything reads or stores it: HTTP 400, -32600."""
    reply = assert_refused(response, sent, codes.INVALID_REQUEST, echoed=echoed)
    assert reply["error"]["message"].startswith("Invalid request: "), reply


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("opener", ["[", '{"a":'])
@pytest.mark.parametrize("closed", [False, True], ids=["unterminated-1000", "closed-100000"])
def test_regression_deeply_nested_json_is_a_parse_error(
    endpoint: Endpoint, opener: str, closed: bool
) -> None:
    # Once a RecursionError out of json.loads: a plain-text HTTP 500. Now 100,000 levels are
    # refused before parsing (more than max_json_containers objects and arrays: HTTP 413).
    closer = "]" if opener == "[" else "}"
    depth = 100_000 if closed else 1000
    raw = opener * depth + ("1" + closer * depth if closed else "")
    response = plain_post(endpoint, raw.encode())
    if closed:
        assert_refused(response, None, codes.INVALID_REQUEST, 413)
    else:
        assert_refused(response, None, codes.PARSE_ERROR)


@pytest.mark.parametrize("depth", [100, 800])
def test_regression_nesting_deeper_than_64_levels_is_an_invalid_request(
    endpoint: Endpoint, depth: int
) -> None:
    body = request("tools/list", {"_meta": meta(), "x": _deep(depth)}, request_id=7)
    response = endpoint.post(body, headers_for("tools/list"))
    assert_unstorable(response, body, echoed=7)


@pytest.mark.parametrize(
    ("number", "code"),
    [
        ("1e999", codes.INVALID_REQUEST),  # valid JSON that parses to inf
        ("-1e999", codes.INVALID_REQUEST),
        ("NaN", codes.PARSE_ERROR),  # not JSON at all
        ("Infinity", codes.PARSE_ERROR),
        ("-Infinity", codes.PARSE_ERROR),
    ],
)
def test_regression_non_finite_id_gets_a_json_response(endpoint: Endpoint, number: str, code: int) -> None:
    # Once echoed as a bare NaN/Infinity token: a response body that is not JSON.
    raw = b'{"jsonrpc": "2.0", "id": %s, "method": "tools/list"}' % number.encode()
    response = plain_post(endpoint, raw)
    assert_refused(response, None, code)


@pytest.mark.parametrize("request_id", ["\ud800", "x\udfffy", "a\x00b"], ids=["surrogate", "low", "nul"])
def test_regression_unstorable_id_is_refused_and_not_echoed(endpoint: Endpoint, request_id: str) -> None:
    # A lone surrogate id once passed dispatch and failed in pydantic_core.to_json: a plain-text 500.
    body = request("tools/list", {"_meta": meta()}, request_id)
    response = endpoint.post(body, headers_for("tools/list"))
    assert_unstorable(response, body)  # the id cannot be echoed: null


@pytest.mark.parametrize("method", [*TASK_METHODS, "subscriptions/listen"])
def test_regression_nul_in_task_id(endpoint: Endpoint, canaries: Canaries, method: str) -> None:
    # Once a psycopg DataError (Postgres text cannot hold 0x00): HTTP 500 -32603.
    params: dict[str, Any] = {"_meta": meta()}
    if method == "subscriptions/listen":
        params["notifications"] = {"taskIds": ["a\x00b"]}
    else:
        params["taskId"] = "a\x00b"
        if method == "tasks/update":
            params["inputResponses"] = {}
    body = request(method, params)
    response = endpoint.post(body, headers_for(method, params))
    assert_unstorable(response, body, echoed=1)
    canaries.assert_unchanged()


# tool, arguments, _meta overrides, and what the raw body gets ("__NAN__"/"__INF__" become NaN/1e999).
UNSTORABLE_CALLS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "NUL in clientInfo": ("noop", {}, {CLIENT_INFO_KEY: {"name": "a\x00b", "version": "0"}}),
    "lone surrogate in clientInfo": ("noop", {}, {CLIENT_INFO_KEY: {"name": "\ud800", "version": "0"}}),
    "NUL in clientCapabilities": (
        "noop",
        {},
        {CAPABILITIES_KEY: {"extensions": {TASKS_EXT: {}}, "x": "\x00"}},
    ),
    "NUL in a string argument": ("slow_compute", {"seconds": 0, "label": "a\x00b"}, {}),
    "NUL in an argument name": ("noop", {"a\x00b": 1}, {}),
    "lone surrogate in an ignored argument": ("noop", {"x": "\ud800"}, {}),
    "lone surrogate in an argument name": ("noop", {"\udc00": 1}, {}),
    "arguments nested 300 deep": ("noop", {"x": _deep(300)}, {}),
    "1e999 for a float argument": ("slow_compute", {"seconds": "__INF__"}, {}),
    "NaN for a float argument": ("slow_compute", {"seconds": "__NAN__"}, {}),
}


@pytest.mark.parametrize("case", sorted(UNSTORABLE_CALLS))
def test_regression_unstorable_values_in_tools_call(endpoint: Endpoint, stack: Stack, case: str) -> None:
    # Values Postgres JSONB cannot store (NUL, lone surrogates, NaN) or pydantic_core.to_json cannot
    # serialize (nesting > ~250) once passed validation: HTTP 500 -32603 after or instead of a task.
    tool, arguments, meta_overrides = UNSTORABLE_CALLS[case]
    params = {"name": tool, "arguments": arguments, "_meta": {**meta(), **meta_overrides}}
    body = request("tools/call", params)
    raw = encode(body).replace(b'"__NAN__"', b"NaN").replace(b'"__INF__"', b"1e999")
    rows_before = task_count(stack)
    response = endpoint.post(None, headers_for("tools/call", params), raw=raw)
    try:
        if b"NaN" in raw:
            assert_refused(response, body, codes.PARSE_ERROR)  # not JSON: nothing to echo
        else:
            assert_unstorable(response, body, echoed=1)
    finally:
        created = response.json().get("result", {}).get("taskId") if response.status_code == 200 else None
        if created:
            cancel(endpoint, created)
    assert task_count(stack) == rows_before, f"a task was created ({case})"


@pytest.fixture
def question(endpoint: Endpoint, canaries: Canaries) -> Iterator[tuple[str, str]]:
    """A confirm_delete task of its own, waiting for its answer (the second worker process)."""
    task_id, key = start_confirm_delete(endpoint, f"regression-{uuid.uuid4().hex[:8]}.txt")
    try:
        yield task_id, key
    finally:
        cancel(endpoint, task_id)


@pytest.mark.parametrize(
    ("answer", "key_suffix"),
    [
        pytest.param({"action": "decline", "note": "a\x00b"}, "", id="nul"),
        pytest.param({"action": "accept", "content": {"confirm": True, "x": "\ud800"}}, "", id="surrogate"),
        pytest.param({"action": "accept", "content": {"confirm": True, "x\x00": 1}}, "", id="nul-in-field"),
        pytest.param(YES, "\x00", id="nul-in-key"),
    ],
)
def test_regression_unstorable_answer(
    endpoint: Endpoint, stack: Stack, question: tuple[str, str], answer: Any, key_suffix: str
) -> None:
    # An answer that passed validation but held NUL or a lone surrogate (in a tolerated extra field)
    # once failed when Postgres stored it: HTTP 500 -32603.
    task_id, key = question
    before = snapshot(stack, task_id)
    params = {"taskId": task_id, "inputResponses": {key + key_suffix: answer}, "_meta": meta()}
    body = request("tasks/update", params)
    response = endpoint.post(body, headers_for("tasks/update", params))
    assert_unstorable(response, body, echoed=1)
    assert snapshot(stack, task_id) == before, "the task changed"


def test_regression_null_for_a_required_boolean_is_refused(
    endpoint: Endpoint, stack: Stack, question: tuple[str, str]
) -> None:
    # {confirm: null} was once accepted (inputs._check_value returned early on None) and reached the tool.
    task_id, key = question
    before = snapshot(stack, task_id)
    params = {"taskId": task_id, "inputResponses": {key: {"action": "accept", "content": {"confirm": None}}}}
    params["_meta"] = meta()
    body = request("tasks/update", params)
    response = endpoint.post(body, headers_for("tasks/update", params))
    reply = assert_refused(response, body, codes.INVALID_PARAMS, echoed=1)
    assert "confirm" in reply["error"]["message"], reply
    assert snapshot(stack, task_id) == before, "the task changed"


@pytest.mark.parametrize("request_id", [True, False, 1.0, 1.5], ids=["true", "false", "1.0", "1.5"])
def test_regression_boolean_or_float_id_is_an_invalid_request(endpoint: Endpoint, request_id: Any) -> None:
    # A boolean id once passed the 'string or integer' check (bool is an int in Python) and was echoed.
    body = request("tools/list", {"_meta": meta()}, request_id)
    response = endpoint.post(body, headers_for("tools/list"))
    assert_refused(response, body, codes.INVALID_REQUEST)


# ---- regression tests: the 2025-11-25 layer (legacy.py) on the same endpoint ---------------------------

LEGACY_INITIALIZE = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"tasks": {}},
    "clientInfo": {"name": "fuzz", "version": "0"},
}
LEGACY_HEADERS: Headers = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
}


def session_count(stack: Stack) -> int:
    with stack.db() as conn:
        found = conn.execute("SELECT count(*) FROM mcp_sessions").fetchone()
    assert found is not None
    return int(found[0])


@pytest.fixture(scope="module")
def legacy_session(endpoint: Endpoint) -> str:
    body = request("initialize", LEGACY_INITIALIZE)
    response = endpoint.post(body, LEGACY_HEADERS)
    reply = check(response, body)
    assert reply is not None and "result" in reply, reply
    return response.headers["mcp-session-id"]


def legacy_headers(session_id: str) -> Headers:
    return {**LEGACY_HEADERS, "Mcp-Session-Id": session_id}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # initialize as a notification: nothing to answer, no session.
        pytest.param(
            {"jsonrpc": "2.0", "method": "initialize", "params": LEGACY_INITIALIZE}, None, id="notification"
        ),
        pytest.param(
            {"id": 1, "method": "initialize", "params": LEGACY_INITIALIZE},
            (codes.INVALID_REQUEST, 1),
            id="no-jsonrpc",
        ),
        pytest.param(
            {"jsonrpc": "1.0", "id": "a", "method": "initialize", "params": LEGACY_INITIALIZE},
            (codes.INVALID_REQUEST, "a"),
            id="jsonrpc-1.0",
        ),
        pytest.param(
            {"jsonrpc": "2.0", "id": [1], "method": "initialize", "params": LEGACY_INITIALIZE},
            (codes.INVALID_REQUEST, None),
            id="list-id",
        ),
        pytest.param(
            {"jsonrpc": "2.0", "id": True, "method": "initialize", "params": LEGACY_INITIALIZE},
            (codes.INVALID_REQUEST, None),
            id="bool-id",
        ),
        pytest.param(
            {"jsonrpc": "2.0", "id": 1.5, "method": "initialize", "params": LEGACY_INITIALIZE},
            (codes.INVALID_REQUEST, None),
            id="float-id",
        ),
    ],
)
def test_regression_legacy_initialize_checks_the_envelope(
    endpoint: Endpoint, stack: Stack, body: dict[str, Any], expected: tuple[int, Any] | None
) -> None:
    # initialize once skipped the JSON-RPC envelope checks: each of these got a result and a session.
    sessions_before = session_count(stack)
    response = endpoint.post(body, LEGACY_HEADERS)
    if expected is None:
        assert check(response, body) is None  # HTTP 202, empty body
    else:
        code, echoed = expected
        assert_refused(response, body, code, echoed=echoed)
    assert "mcp-session-id" not in response.headers, dict(response.headers)
    assert session_count(stack) == sessions_before, "a session was opened"


def _cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("utf-8", "surrogatepass")).decode()


# body, sent within the session, (HTTP status, code). 2025-11-25 handlers answer their errors with
# HTTP 200 (the clients of that revision read JSON-RPC errors from 200 responses); a body refused
# before dispatch (NUL, surrogates, ...) gets the 400 of any endpoint request.
LEGACY_INVALID: dict[str, tuple[dict[str, Any], bool, tuple[int, int]]] = {
    "initialize with params a string": (
        request("initialize", "x"),  # type: ignore[arg-type]
        False,
        (200, codes.INVALID_PARAMS),
    ),
    "initialize with params a list": (
        request("initialize", [LEGACY_INITIALIZE]),  # type: ignore[arg-type]
        False,
        (200, codes.INVALID_PARAMS),
    ),
    "initialize with NUL in clientInfo": (
        request("initialize", {**LEGACY_INITIALIZE, "clientInfo": {"name": "a\x00b", "version": "0"}}),
        False,
        (400, codes.INVALID_REQUEST),
    ),
    "tasks/get with NUL in taskId": (
        request("tasks/get", {"taskId": "a\x00b"}),
        True,
        (400, codes.INVALID_REQUEST),
    ),
    "tasks/list with a cursor that is not base64": (
        request("tasks/list", {"cursor": "!!!"}),
        True,
        (200, codes.INVALID_PARAMS),
    ),
    "tasks/list with a cursor that is not UTF-8": (
        request("tasks/list", {"cursor": base64.urlsafe_b64encode(b"\xff\xfe|x").decode()}),
        True,
        (200, codes.INVALID_PARAMS),
    ),
    "tasks/list with a cursor that holds no timestamp": (
        request("tasks/list", {"cursor": _cursor("yesterday|x")}),
        True,
        (200, codes.INVALID_PARAMS),
    ),
    "tasks/list with a cursor without a time zone": (
        request("tasks/list", {"cursor": _cursor("2024-01-01T00:00:00|x")}),
        True,
        (200, codes.INVALID_PARAMS),
    ),
    "tasks/list with a cursor that hides a NUL": (
        request("tasks/list", {"cursor": _cursor("2024-01-01T00:00:00+00:00|a\x00b")}),
        True,
        (200, codes.INVALID_PARAMS),
    ),
    "tasks/list with a cursor that hides a surrogate": (
        request("tasks/list", {"cursor": _cursor("2024-01-01T00:00:00+00:00|\ud800")}),
        True,
        (200, codes.INVALID_PARAMS),
    ),
}


@pytest.mark.parametrize("case", sorted(LEGACY_INVALID))
def test_regression_legacy_input_is_validated(
    endpoint: Endpoint, stack: Stack, legacy_session: str, case: str
) -> None:
    # Unchecked input once raised inside the 2025-11-25 handlers (AttributeError on non-object
    # params, NUL into Postgres): -32603.
    body, in_session, (status, code) = LEGACY_INVALID[case]
    headers = legacy_headers(legacy_session) if in_session else LEGACY_HEADERS
    sessions_before, rows_before = session_count(stack), task_count(stack)
    response = endpoint.post(body, headers)
    assert_refused(response, body, code, status, echoed=1)
    assert "mcp-session-id" not in response.headers, dict(response.headers)
    assert (session_count(stack), task_count(stack)) == (sessions_before, rows_before)


@pytest.mark.parametrize("params", [[], "", False, 0], ids=["empty-list", "empty-string", "false", "zero"])
def test_regression_legacy_initialize_with_falsy_params_is_refused(
    endpoint: Endpoint, stack: Stack, params: Any
) -> None:
    body = request("initialize", params)
    sessions_before = session_count(stack)
    response = endpoint.post(body, LEGACY_HEADERS)
    assert_refused(response, body, codes.INVALID_PARAMS, 200, echoed=1)
    assert "mcp-session-id" not in response.headers, dict(response.headers)
    assert session_count(stack) == sessions_before, "a session was opened"


DEFAULT_RETENTION_MS = 3_600_000  # Settings.retention_ms (noop sets none; the stack runs with defaults)
MAX_RETENTION_MS = 7 * 24 * 3_600_000  # Settings.max_retention_ms


@pytest.mark.parametrize(
    ("ttl", "retention_ms"),
    [
        pytest.param(True, DEFAULT_RETENTION_MS, id="true"),
        pytest.param(False, DEFAULT_RETENTION_MS, id="false"),
        pytest.param(0, DEFAULT_RETENTION_MS, id="0"),
        pytest.param(-5, DEFAULT_RETENTION_MS, id="negative"),
        pytest.param(1.5, DEFAULT_RETENTION_MS, id="float"),
        pytest.param("5000", DEFAULT_RETENTION_MS, id="string"),
        pytest.param(10**30, MAX_RETENTION_MS, id="10**30"),
        pytest.param(2**63, MAX_RETENTION_MS, id="2**63"),
        pytest.param(5000, 5000, id="5000"),  # a sane ask is honoured
    ],
)
def test_regression_legacy_task_ttl_is_checked(
    endpoint: Endpoint, stack: Stack, legacy_session: str, ttl: Any, retention_ms: int
) -> None:
    # A bool or a > int64 task.ttl once went into a bigint column: -32603. Now an invalid ttl is
    # ignored (the tool's retention applies) and a huge one is capped at the maximum retention.
    body = request("tools/call", {"name": "noop", "arguments": {}, "task": {"ttl": ttl}})
    rows_before = task_count(stack)
    response = endpoint.post(body, legacy_headers(legacy_session))
    reply = check(response, body)
    assert reply is not None and "result" in reply, (response.status_code, reply)
    task = reply["result"]["task"]
    try:
        assert task_count(stack) == rows_before + 1
        # A task that is still running reports elapsed + retention.
        assert retention_ms <= task["ttl"] < retention_ms + 60_000, (ttl, task)
        assert stack.row(task["taskId"])["retention_ms"] == retention_ms, ttl
    finally:
        cancel(endpoint, task["taskId"])


# ---- last: the canaries ------------------------------------------------------------------------------


def test_canaries_are_unchanged_after_the_whole_run(endpoint: Endpoint, canaries: Canaries) -> None:
    canaries.assert_unchanged()
    done = mcp_call(endpoint, "tasks/get", {"taskId": canaries.completed, "_meta": meta()})
    asking = mcp_call(endpoint, "tasks/get", {"taskId": canaries.asking, "_meta": meta()})
    assert done["status"] == "completed"
    assert asking["status"] == "input_required"
    assert set(asking["inputRequests"]) == {canaries.key}
