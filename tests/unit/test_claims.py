"""The claim board: a pool child tells its main process which job it claimed, as which identity,
through a pipe made before the fork (``worker.claims``); real forks, no Celery."""

from __future__ import annotations

import os

import pytest

from mcp_celery_tasks.worker import claims
from mcp_celery_tasks.worker.claims import ClaimBoard


def _in_child(board: ClaimBoard, *lines: str) -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            board.close_read_end()
            for line in lines:
                board.send(line.replace("PID", str(os.getpid())))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _child_pid_of(board: ClaimBoard, job_id: str) -> int:
    board.drain()
    found = [pid for pid, (job, _) in board._claims.items() if job == job_id]
    assert len(found) == 1, board._claims
    return found[0]


def test_a_claim_told_by_a_child_is_known_to_the_main_process() -> None:
    board = ClaimBoard()
    _in_child(board, "C PID job-1 host:PID:abcd1234\n")
    pid = _child_pid_of(board, "job-1")
    # (The child is gone by now, so only identity() is asked, not forget_the_dead.)
    assert board.identity(pid, "job-1") == f"host:{pid}:abcd1234"
    assert board.identity(pid, "job-2") is None  # another job of that pid: not claimed


def test_the_end_of_a_job_forgets_its_claim() -> None:
    board = ClaimBoard()
    _in_child(board, "C PID job-1 host:PID:abcd1234\n", "E PID job-1\n")
    board.drain()
    assert board._claims == {}


def test_what_a_dead_child_said_is_forgotten() -> None:
    board = ClaimBoard()
    _in_child(board, "C PID job-1 host:PID:abcd1234\n")
    board.drain()
    assert board._claims
    board.forget_the_dead()
    assert board._claims == {}


def test_the_main_process_tells_itself_nothing() -> None:
    board = ClaimBoard()
    board.send(f"C {os.getpid()} job-1 me\n")  # a threads pool: the job runs in the main process
    board.drain()
    assert board.identity(os.getpid(), "job-1") is None


def test_a_full_pipe_drops_the_line_instead_of_blocking_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    board = ClaimBoard()
    monkeypatch.setattr(board, "_owner", -1)  # as if this were a child
    for n in range(5000):  # far more than a pipe holds, nobody reading
        board.send(f"C 1 job-{n} host:1:abcd1234\n")
    board.drain()
    kept = board._claims[1][0]
    assert kept != "job-4999", "every line fit: the test did not fill the pipe"
    assert board.identity(1, kept) == "host:1:abcd1234"  # what fit was read, whole lines only


def test_without_a_board_claims_are_not_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claims, "_BOARD", None)
    claims.claimed("job-1", "me")  # nothing to write to: no error
    claims.ended("job-1")
