"""The pipe of an isolated body (``worker.body_wire``) and what the body's environment keeps
(``worker.hardening``): frames, nested calls, errors that keep their kind, refusals."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from mcp_celery_tasks.errors import (
    InputNotSupported,
    JobSuspended,
    McpError,
    SoftTimeLimitExceeded,
    TaskCancelled,
    ToolError,
    WorkerStopping,
)
from mcp_celery_tasks.json_types import JSONObject, JSONValue
from mcp_celery_tasks.tools.retries import RetryLater
from mcp_celery_tasks.worker import hardening
from mcp_celery_tasks.worker.body_wire import Peer, ProtocolViolation, RemoteError, decode_error, encode_error
from mcp_celery_tasks.worker.gpu_memory import held_by
from mcp_celery_tasks.worker.watchdog import process_tree, rss_bytes, tree_rss_bytes
from tests.support import wait_until


@pytest.mark.parametrize(
    "exc",
    [
        TaskCancelled("the task was cancelled"),
        WorkerStopping("stopping"),
        JobSuspended("gave the slot back"),
        SoftTimeLimitExceeded("past the soft limit"),
        ToolError("no such file"),
        InputNotSupported("no elicitation", "elicitation"),
        McpError(-32002, "not found"),
        RetryLater(2.5, "429"),
        ValueError("bad key"),
    ],
)
def test_an_error_crosses_the_pipe_as_the_same_kind(exc: BaseException) -> None:
    back = decode_error(encode_error(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    if isinstance(exc, RetryLater):
        assert isinstance(back, RetryLater) and (back.seconds, back.reason) == (2.5, "429")
    if isinstance(exc, InputNotSupported):
        assert isinstance(back, InputNotSupported) and back.capability == "elicitation"
    if isinstance(exc, McpError):
        assert isinstance(back, McpError) and back.code == -32002


def test_an_unknown_exception_keeps_its_name_and_message_only() -> None:
    back = decode_error(encode_error(ZeroDivisionError("x")))
    assert isinstance(back, RemoteError) and str(back) == "ZeroDivisionError: x"


@pytest.mark.parametrize("error", ["text", {"type": "nonsense"}, {"type": "retry_later", "seconds": "1"}])
def test_a_malformed_error_is_a_protocol_violation(error: object) -> None:
    assert isinstance(decode_error(error), ProtocolViolation)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def _serve(peer: Peer) -> threading.Thread:
    def loop() -> None:
        try:
            message, binary = peer.receive()
            peer.serve_one(message, binary)
        except ProtocolViolation:
            pass

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_calls_nest_and_bytes_travel_as_bytes(pair: tuple[socket.socket, socket.socket]) -> None:
    a_sock, b_sock = pair
    seen: list[str] = []

    def a_handler(op: str, args: JSONObject, binary: bytes | None) -> tuple[JSONValue, bytes | None]:
        seen.append(op)
        return None, b"chunk-" + str(args["n"]).encode()

    a = Peer(a_sock, a_handler, max_json_bytes=1 << 16, max_binary_bytes=1 << 16)

    def b_handler(op: str, args: JSONObject, binary: bytes | None) -> tuple[JSONValue, bytes | None]:
        # While answering a's "outer", b asks a twice: a serves both before it gets its reply.
        got = [b.call("read", {"n": n}) for n in (1, 2)]
        return {"got": [g.decode() for g in got], "sent": (binary or b"").decode()}, None

    b = Peer(b_sock, b_handler, max_json_bytes=1 << 16, max_binary_bytes=1 << 16)
    thread = _serve(b)
    assert a.call("outer", {}, b"payload") == {"got": ["chunk-1", "chunk-2"], "sent": "payload"}
    assert seen == ["read", "read"]
    thread.join(5)


def test_an_unknown_op_gets_an_error_reply_and_the_server_goes_on(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a_sock, b_sock = pair

    def b_handler(op: str, args: JSONObject, binary: bytes | None) -> tuple[JSONValue, bytes | None]:
        if op != "known":
            raise ValueError(f"unknown operation {op!r}")
        return "fine", None

    a = Peer(a_sock, lambda *_: (None, None), max_json_bytes=1 << 16, max_binary_bytes=1 << 16)
    b = Peer(b_sock, b_handler, max_json_bytes=1 << 16, max_binary_bytes=1 << 16)
    first = _serve(b)
    with pytest.raises(ValueError, match="unknown operation 'drop_tables'"):
        a.call("drop_tables")
    first.join(5)
    second = _serve(b)
    assert a.call("known") == "fine"
    second.join(5)


def test_a_frame_over_its_bound_is_refused_before_it_is_read(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a_sock, b_sock = pair
    a = Peer(a_sock, lambda *_: (None, None), max_json_bytes=1 << 20, max_binary_bytes=1 << 20)
    b = Peer(b_sock, lambda *_: (None, None), max_json_bytes=100, max_binary_bytes=100)
    a.send_json({"id": 1, "op": "x", "args": {"blob": "y" * 500}})
    with pytest.raises(ProtocolViolation, match="over the bound of 100"):
        b.receive()


@pytest.mark.parametrize("payload", [b"[1, 2]", b"not json", b'{"re": 7, "ok": 1}'])
def test_what_is_not_a_request_or_the_awaited_reply_is_a_violation(
    pair: tuple[socket.socket, socket.socket], payload: bytes
) -> None:
    a_sock, b_sock = pair
    b = Peer(b_sock, lambda *_: (None, None), max_json_bytes=1 << 16, max_binary_bytes=1 << 16)
    a_sock.sendall(b"J" + len(payload).to_bytes(4, "big") + payload)
    b.send_json({"id": 1, "op": "x", "args": {}})
    with pytest.raises(ProtocolViolation):
        b.wait_for(1)


def test_the_body_environment_keeps_devices_and_drops_every_credential() -> None:
    dsn = "postgresql://worker:s3cret-pw@db:5432/tasks"
    environ = {
        "PATH": "/usr/bin",
        "CUDA_VISIBLE_DEVICES": "2",
        "HF_HOME": "/models",
        "MCP_TASKS_DATABASE_URL": dsn,
        "MCP_TASKS_AUTH_TOKENS_FILE": "/run/secrets/tokens",
        "DATABASE_URL": "postgresql://other@db/x",
        "PGPASSWORD": "pw",
        "MY_APP_DSN": dsn,
        "LEGACY_PASS": "s3cret-pw",
        "CELERY_BROKER_URL": "amqp://guest:guest@mq//",
    }
    kept = hardening.clean_environment(environ, [dsn, "redis://:r3dis-pw@cache:6379/0"])
    assert kept == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "2", "HF_HOME": "/models"}


_READ_PARENT = """
import os, sys
from mcp_celery_tasks.worker import hardening
if sys.argv[1] == "drop":
    hardening.drop_capabilities()
try:
    with open(f"/proc/{os.getppid()}/environ", "rb") as f:
        print("read", b"ISO_MARK=" in f.read())
except OSError as e:
    print("denied", e.errno)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux")
def test_an_undumpable_process_keeps_its_environ_from_a_child_without_capabilities() -> None:
    script = (
        "import os, subprocess, sys\n"
        "from mcp_celery_tasks.worker import hardening\n"
        "if sys.argv[1] == 'undumpable': hardening.undumpable()\n"
        f"code = {_READ_PARENT!r}\n"
        "done = subprocess.run([sys.executable, '-c', code, sys.argv[2]], capture_output=True, text=True)\n"
        "print(done.stdout)\n"
    )
    env = {**os.environ, "ISO_MARK": "1"}

    def run(mode: str, child: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", script, mode, child], capture_output=True, text=True, env=env
        )
        return done.stdout.strip()

    assert run("undumpable", "drop") == "denied 13"
    if os.geteuid() == 0:
        # Root: the control is a child that keeps its capabilities (it passes any check); one
        # without them is refused by the capability rule too (its set is not the parent's).
        assert run("undumpable", "keep") == "read True"
        assert run("dumpable", "drop") == "denied 13"
    else:
        assert run("dumpable", "drop") == "read True"  # same uid, dumpable: readable


def test_a_forked_child_stays_undumpable() -> None:
    script = (
        "import os\nfrom mcp_celery_tasks.worker import hardening\nhardening.undumpable()\n"
        "pid = os.fork()\nif pid == 0:\n    print(hardening.is_dumpable()); os._exit(0)\nos.waitpid(pid, 0)\n"
    )
    assert (
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True).stdout.strip()
        == "False"
    )


def test_the_memory_of_a_child_counts_towards_its_parent() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; b = bytearray(150 * 2**20); print('ok', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ok"
        assert tree_rss_bytes(os.getpid()) - rss_bytes(os.getpid()) >= 140 * 2**20
    finally:
        child.kill()
        child.wait()


def test_device_memory_held_by_a_child_counts_towards_its_parent() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        wait_until(lambda: child.pid in process_tree(os.getpid()), 10, what="the child to be listed")
        listed = [(child.pid, 300 * 2**20), (1, 7 * 2**20)]  # what NVML lists: our child's and another's
        assert held_by(os.getpid(), "0", lambda device: listed) == 300 * 2**20
        assert held_by(child.pid, "0", lambda device: listed) == 300 * 2**20
    finally:
        child.kill()
        child.wait()
