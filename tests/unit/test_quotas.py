"""Quotas in one process: the token bucket, requests in progress, overrides per principal."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mcp_celery_tasks.errors import QuotaExceeded
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store.row_types import PrincipalLimits
from mcp_celery_tasks.tasks.quotas import Quotas


class Overrides:
    def __init__(self, rows: list[PrincipalLimits]) -> None:
        self.rows = rows
        self.reads = 0

    async def principal_limits(self) -> list[PrincipalLimits]:
        self.reads += 1
        return self.rows


def quotas(rows: list[PrincipalLimits] | None = None, **settings: Any) -> Quotas:
    return Quotas(Settings(**settings), Overrides(rows or []))


async def test_a_burst_then_the_rate() -> None:
    q = quotas(creates_per_second_per_principal=10, create_burst_per_principal=3)
    limits = await q.limits("alice")
    for _ in range(3):
        q.take_create("alice", limits)
    with pytest.raises(QuotaExceeded) as refused:
        q.take_create("alice", limits)
    data = refused.value.data
    assert isinstance(data, dict) and isinstance(data["retryAfterMs"], int)
    assert data["limit"] == "creates_per_second" and 0 < data["retryAfterMs"] <= 100
    assert refused.value.headers == {"Retry-After": "1"}
    q.take_create("bob", limits)  # another principal, another bucket
    await asyncio.sleep(0.11)
    q.take_create("alice", limits)  # one token back after 1/rate seconds


async def test_zero_means_no_limit() -> None:
    q = quotas(creates_per_second_per_principal=0, max_concurrent_requests_per_principal=0)
    limits = await q.limits("alice")
    for _ in range(10_000):
        q.take_create("alice", limits)
    with q.request("alice", limits), q.request("alice", limits):
        pass


async def test_requests_in_progress_are_counted_and_released() -> None:
    q = quotas(max_concurrent_requests_per_principal=2)
    limits = await q.limits("alice")
    with q.request("alice", limits), q.request("alice", limits):
        with pytest.raises(QuotaExceeded) as refused, q.request("alice", limits):
            pass
        data = refused.value.data
        assert isinstance(data, dict) and data["limit"] == "concurrent_requests"
        with q.request("bob", limits):
            pass
    with q.request("alice", limits):
        pass  # released


async def test_an_override_replaces_only_the_limits_it_sets() -> None:
    rows: list[PrincipalLimits] = [
        {"principal": "token:alice", "max_active_tasks": 5000, "creates_per_second": None}
    ]
    q = quotas(rows, max_active_tasks_per_principal=10, creates_per_second_per_principal=7)
    alice, bob = await q.limits("token:alice"), await q.limits("token:bob")
    assert (alice.max_active_tasks, alice.creates_per_second) == (5000, 7)
    assert (bob.max_active_tasks, bob.creates_per_second) == (10, 7)


async def test_overrides_are_read_at_most_every_few_seconds() -> None:
    source = Overrides([])
    q = Quotas(Settings(), source)
    await asyncio.gather(*(q.limits("x") for _ in range(100)))
    assert source.reads == 1
