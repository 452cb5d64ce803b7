"""Retry policies: which errors of a tool's body retry, after how long, and ``ctx.retry_later``.

A flaky downstream (a model registry, an object store) is retried with backoff instead of failing
the task: ``@tool(retry_on=(TimeoutError,), max_attempts=5, backoff=exponential(initial=1,
maximum=300))``. The worker that sees a matching error ends the attempt and puts the job back in
the fair backlog with a "not before" time (``store.retry_queries``): the wait holds no worker
slot and no broker message. Everything here is checked when the tool is registered (at import),
so a bad policy fails the worker's start, never a job.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mcp_celery_tasks.errors import McpTasksError, ToolError

__all__ = [
    "DEFAULT_BACKOFF",
    "MAX_ATTEMPTS_CAP",
    "MAX_DELAY_S",
    "Backoff",
    "RetryLater",
    "RetryPolicy",
    "exponential",
    "fixed",
    "reason_text",
    "retry_later",
    "retry_policy",
]

MAX_DELAY_S: Final = 86_400.0
"""No policy waits longer than a day between attempts (``retry_max_delay_seconds`` may cap lower)."""
MAX_ATTEMPTS_CAP: Final = 100
"""A tool's ``max_attempts`` above this is a typo, not a policy."""
MAX_REASON_CHARS: Final = 200


def _seconds(name: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, not {value!r}")
    if seconds > MAX_DELAY_S:
        raise ValueError(f"{name} must be at most {MAX_DELAY_S:g} s (one day), not {value!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before the next attempt; build one with ``exponential`` or ``fixed``."""

    initial: float
    maximum: float
    factor: float
    jitter: bool

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 for the first).

        The delay grows ``initial * factor ** (attempt - 1)`` up to ``maximum``; with jitter it is
        drawn uniformly from its upper half, so retries of many tasks that failed together spread
        out, yet none comes back sooner than half the policy's delay.
        """
        steps = max(0, attempt - 1)
        try:
            base = min(self.maximum, self.initial * self.factor**steps)
        except OverflowError:
            base = self.maximum
        if self.jitter:
            base *= 0.5 + 0.5 * rand()
        return base


def exponential(
    initial: float = 1.0, maximum: float = 300.0, *, factor: float = 2.0, jitter: bool = True
) -> Backoff:
    """Delays of ``initial``, ``initial * factor``, … seconds, capped at ``maximum`` (jitter:
    each drawn from the upper half of its value)."""
    first = _seconds("exponential(initial=…)", initial, positive=True)
    top = _seconds("exponential(maximum=…)", maximum, positive=True)
    if top < first:
        raise ValueError(f"exponential(maximum={maximum!r}) must not be below initial={initial!r}")
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 1.0 <= float(factor) <= 10.0:
        raise ValueError(f"exponential(factor=…) must be a number from 1 to 10, not {factor!r}")
    if not isinstance(jitter, bool):
        raise TypeError(f"exponential(jitter=…) must be True or False, not {jitter!r}")
    return Backoff(first, top, float(factor), jitter)


def fixed(seconds: float) -> Backoff:
    """The same delay before every retry."""
    wait = _seconds("fixed(seconds)", seconds)
    return Backoff(wait, wait, 1.0, False)


DEFAULT_BACKOFF: Final = exponential(1.0, 300.0, jitter=True)
"""A tool with ``retry_on`` and no ``backoff``: 1 s, 2 s, 4 s, … up to 5 min, jittered."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A tool's retry rule: the exception types that retry, and the delays between attempts."""

    retry_on: tuple[type[Exception], ...]
    backoff: Backoff

    def matches(self, exc: BaseException) -> bool:
        return isinstance(exc, self.retry_on)


def retry_policy(
    tool_name: str, retry_on: object, backoff: object, max_attempts: object
) -> RetryPolicy | None:
    """The checked policy of ``@tool(retry_on=…, backoff=…, max_attempts=…)``; raises
    ``TypeError``/``ValueError`` naming the tool and the bad value."""
    if max_attempts is not None and (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_CAP
    ):
        raise ValueError(
            f"tool {tool_name!r}: max_attempts must be an integer from 1 to {MAX_ATTEMPTS_CAP}, "
            f"not {max_attempts!r}"
        )
    if backoff is not None and not isinstance(backoff, Backoff):
        raise TypeError(
            f"tool {tool_name!r}: backoff must come from exponential(…) or fixed(…), not {backoff!r}"
        )
    types = retry_on if isinstance(retry_on, tuple) else (retry_on,) if retry_on is not None else ()
    if not types:
        if backoff is not None:
            raise ValueError(f"tool {tool_name!r}: backoff needs retry_on (the errors to retry)")
        return None
    for kind in types:
        if not isinstance(kind, type) or not issubclass(kind, BaseException):
            raise TypeError(f"tool {tool_name!r}: retry_on takes exception classes, not {kind!r}")
        if not issubclass(kind, Exception):
            # KeyboardInterrupt, SystemExit, a cancel: never a flaky downstream.
            raise ValueError(f"tool {tool_name!r}: retry_on may not name {kind.__name__} (not an Exception)")
        if issubclass(kind, McpTasksError):
            # A ToolError or McpError is the tool's answer, an InfrastructureError is ours to ride
            # out (it never burns an attempt): neither is a flaky downstream.
            raise ValueError(
                f"tool {tool_name!r}: retry_on may not name {kind.__name__}, one of the package's own "
                "errors (raise your own exception type, or call ctx.retry_later)"
            )
    return RetryPolicy(tuple(types), backoff if isinstance(backoff, Backoff) else DEFAULT_BACKOFF)


class RetryLater(BaseException):
    """Raised by ``ctx.retry_later``: end this attempt, run again after ``seconds``.

    A ``BaseException`` for the reason ``TaskCancelled`` is one: a tool's ``except Exception``
    must not swallow it."""

    def __init__(self, seconds: float, reason: str) -> None:
        super().__init__(reason)
        self.seconds = seconds
        self.reason = reason


def retry_later(seconds: object, reason: object, max_delay_s: float) -> RetryLater:
    """The ``RetryLater`` for ``ctx.retry_later(seconds, reason)``; a bad value is a
    ``ToolError`` that names it (the task ends with that message, as any tool error)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ToolError(f"ctx.retry_later: seconds must be a number, not {seconds!r}")
    wait = float(seconds)
    if not math.isfinite(wait) or not 0 <= wait <= max_delay_s:
        raise ToolError(
            f"ctx.retry_later: seconds must be a finite number from 0 to {max_delay_s:g}, not {seconds!r}"
        )
    if not isinstance(reason, str):
        raise ToolError(f"ctx.retry_later: reason must be a string, not {type(reason).__name__}")
    return RetryLater(wait, reason)


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069]+")


def reason_text(text: str) -> str:
    """A reason fit for a status message: control and bidi characters become spaces, runs of
    whitespace one space, at most ``MAX_REASON_CHARS`` characters."""
    flat = " ".join(_UNPRINTABLE.sub(" ", text[: MAX_REASON_CHARS * 4]).split())
    if len(flat) > MAX_REASON_CHARS:
        flat = flat[: MAX_REASON_CHARS - 1] + "…"
    return flat
