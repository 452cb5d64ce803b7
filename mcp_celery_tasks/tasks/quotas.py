"""Per-principal quotas: one caller cannot starve the pool or the API.

Limits come from Settings, overridden per principal by rows of ``mcp_principal_limits`` (set
with ``mcp-celery-tasks tasks limits``; re-read every ``OVERRIDES_TTL_S``). A refusal is a
``QuotaExceeded`` error naming the limit and, when waiting helps, when to retry:

- active tasks (working or waiting for input): checked by the create statement itself;
- creations per second: a token bucket per principal in this process (a cheap first line), and
  one per principal shared by every API replica, taken by the create statement itself
  (``mcp_principal_buckets``): N replicas give a principal its rate once, not N times;
- requests in progress at once: counted in this process (waits for a result are not counted),
  plus what the other API replicas reported a second ago (``tasks.shared_load``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from mcp_celery_tasks.errors import InfrastructureError, QuotaExceeded
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store.row_types import PrincipalLimits

__all__ = ["Limits", "Quotas"]

T = TypeVar("T")

OVERRIDES_TTL_S = 10.0
MAX_BUCKETS = 100_000
"""Principals tracked at once; idle full buckets are dropped first (they hold no state)."""


class OverrideSource(Protocol):
    async def principal_limits(self) -> Sequence[PrincipalLimits]: ...


@dataclass(frozen=True, slots=True)
class Limits:
    """One principal's limits (0 means no limit)."""

    max_active_tasks: int
    creates_per_second: float
    create_burst: int
    max_concurrent_requests: int
    max_waiting_inputs: int = 0


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float


class Quotas:
    def __init__(self, settings: Settings, source: OverrideSource) -> None:
        self.defaults = Limits(
            max_active_tasks=settings.max_active_tasks_per_principal,
            creates_per_second=settings.creates_per_second_per_principal,
            create_burst=settings.create_burst_per_principal,
            max_concurrent_requests=settings.max_concurrent_requests_per_principal,
        )
        self._source = source
        self._overrides: dict[str, Limits] = {}
        self._loaded_at = float("-inf")
        self._buckets: dict[str, _Bucket] = {}
        self._in_progress: dict[str, int] = {}
        self.elsewhere: dict[str, int] = {}
        """Requests in progress per principal on the other API replicas (``tasks.shared_load``)."""

    async def limits(self, principal: str) -> Limits:
        """The principal's limits (overrides re-read at most every ``OVERRIDES_TTL_S``)."""
        now = time.monotonic()
        if now - self._loaded_at >= OVERRIDES_TTL_S:
            self._loaded_at = now
            try:
                rows = await self._source.principal_limits()
            except InfrastructureError:
                rows = None  # keep the last ones; the database errors reach the caller anyway
            if rows is not None:
                self._overrides = {row["principal"]: self._merge(row) for row in rows}
        return self._overrides.get(principal, self.defaults)

    def _merge(self, row: PrincipalLimits) -> Limits:
        """The defaults, with the row's overrides (a null column keeps its default)."""
        d = self.defaults
        return Limits(
            max_active_tasks=_or(row.get("max_active_tasks"), d.max_active_tasks),
            creates_per_second=_or(row.get("creates_per_second"), d.creates_per_second),
            create_burst=_or(row.get("create_burst"), d.create_burst),
            max_concurrent_requests=_or(row.get("max_concurrent_requests"), d.max_concurrent_requests),
            max_waiting_inputs=_or(row.get("max_waiting_inputs"), d.max_waiting_inputs),
        )

    def take_create(self, principal: str, limits: Limits) -> None:
        """Spend one creation token, or refuse saying when one will be there."""
        rate = limits.creates_per_second
        if rate <= 0:
            return
        burst = max(1.0, float(limits.create_burst))
        now = time.monotonic()
        bucket = self._buckets.get(principal)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._prune(now, rate, burst)
            bucket = self._buckets[principal] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.stamp) * rate)
        bucket.stamp = now
        if bucket.tokens < 1.0:
            raise self.rate_exceeded(limits, (1.0 - bucket.tokens) / rate)
        bucket.tokens -= 1.0

    @staticmethod
    def rate_exceeded(limits: Limits, wait: float, *, across_replicas: bool = False) -> QuotaExceeded:
        rate, burst = limits.creates_per_second, max(1, limits.create_burst)
        where = " across every API replica" if across_replicas else ""
        return QuotaExceeded(
            f"Too many tasks created: at most {rate:g} per second{where} (bursts of {burst:g}); "
            f"retry in {wait:.2f} s",
            limit="creates_per_second",
            maximum=rate,
            retry_after_s=wait,
        )

    def give_back(self, principal: str, limits: Limits) -> None:
        """Return the token of a create that made nothing (an idempotent call's replay)."""
        bucket = self._buckets.get(principal)
        if limits.creates_per_second > 0 and bucket is not None:
            bucket.tokens = min(max(1.0, float(limits.create_burst)), bucket.tokens + 1.0)

    def _prune(self, now: float, rate: float, burst: float) -> None:
        full = [p for p, b in self._buckets.items() if b.tokens + (now - b.stamp) * rate >= burst]
        for principal in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[principal]

    @contextlib.contextmanager
    def request(self, principal: str, limits: Limits) -> Iterator[None]:
        """Count a request in progress for its principal; refuse one over the limit."""
        count = self._in_progress.get(principal, 0)
        if 0 < limits.max_concurrent_requests <= count + self.elsewhere.get(principal, 0):
            raise QuotaExceeded(
                f"Too many requests in progress: at most {limits.max_concurrent_requests} at once",
                limit="concurrent_requests",
                maximum=limits.max_concurrent_requests,
                retry_after_s=1.0,
            )
        self._in_progress[principal] = count + 1
        try:
            yield
        finally:
            left = self._in_progress.get(principal, 1) - 1
            if left:
                self._in_progress[principal] = left
            else:
                self._in_progress.pop(principal, None)

    def in_progress(self) -> dict[str, int]:
        """This process's requests in progress per principal (a copy)."""
        return dict(self._in_progress)

    @staticmethod
    def active_exceeded(limits: Limits) -> QuotaExceeded:
        return QuotaExceeded(
            f"Too many active tasks: at most {limits.max_active_tasks} working or waiting for input "
            "at once; wait for some to finish (or cancel them)",
            limit="active_tasks",
            maximum=limits.max_active_tasks,
        )


def _or(value: T | None, default: T) -> T:
    return default if value is None else value
