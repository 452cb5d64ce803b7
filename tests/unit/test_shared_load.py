"""The loop that shares requests in progress between API replicas (``tasks.shared_load``): the
other replicas' counts reach the quota, a failing database keeps the last ones, and a stop
deletes this replica's rows. The SQL is tests/integration/test_concurrency_limits.py, two real
replicas tests/e2e/test_replica_quotas.py."""

from __future__ import annotations

import asyncio

import pytest

from mcp_celery_tasks.errors import InfrastructureError, QuotaExceeded
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.tasks.quotas import Quotas
from mcp_celery_tasks.tasks.shared_load import share_load


class FakeLoad:
    """Answers once with the other replicas' counts, then the database is down for good."""

    def __init__(self, answer: dict[str, int]) -> None:
        self.answer: dict[str, int] | None = answer
        self.sent: list[dict[str, int]] = []
        self.forgotten: list[str] = []

    async def share_load(self, replica: str, counts: dict[str, int], fresh_s: float) -> dict[str, int]:
        self.sent.append(counts)
        answer, self.answer = self.answer, None
        if answer is None:
            raise InfrastructureError("the task database is unavailable")
        return answer

    async def forget_load(self, replica: str) -> None:
        self.forgotten.append(replica)


class NoOverrides:
    async def principal_limits(self) -> list[dict[str, object]]:
        return []


async def test_the_other_replicas_requests_count_against_the_limit_and_survive_an_outage() -> None:
    quotas = Quotas(Settings(max_concurrent_requests_per_principal=3), NoOverrides())  # type: ignore[arg-type]
    limits = await quotas.limits("token:alice")
    store = FakeLoad({"token:alice": 2})
    with quotas.request("token:alice", limits):
        loop = asyncio.create_task(share_load(store, quotas, "me", interval_s=0.01))
        await asyncio.sleep(0.05)  # one answer, then several failed rounds
        assert store.sent[0] == {"token:alice": 1}  # this replica's own count went out
        assert len(store.sent) > 2
        assert quotas.elsewhere == {"token:alice": 2}  # kept through the outage
        with pytest.raises(QuotaExceeded) as refused, quotas.request("token:alice", limits):
            pass  # 1 here + 2 elsewhere: at the limit of 3
        assert refused.value.data == {"limit": "concurrent_requests", "max": 3, "retryAfterMs": 1000}
        with quotas.request("token:bob", limits):  # another principal: nothing elsewhere
            pass
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
    assert store.forgotten == ["me"]
