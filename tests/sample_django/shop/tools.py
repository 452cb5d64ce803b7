"""The project's MCP tools: plain functions over the shop's ORM models.

Each job runs in a prefork child of the project's worker; Celery's Django fixup gives it a
usable connection (stale ones are closed before and after every task), so a tool uses the ORM
as a view would.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Sum

from mcp_celery_tasks import TaskContext, tool
from tests.sample_django.shop.models import Order


@tool(description="Place an order for the caller and return their order count and quantity.")
def place_order(ctx: TaskContext, item: str, quantity: int = 1) -> dict[str, Any]:
    """Create an ``Order`` for the task's principal, then sum their orders."""
    ctx.report(f"placing an order for {quantity} x {item}")
    order = Order.objects.create(customer=ctx.principal, item=item, quantity=quantity)
    mine = Order.objects.filter(customer=ctx.principal)
    total = mine.aggregate(total=Sum("quantity"))["total"]
    ctx.report("order placed", progress=1, total=1)
    return {"order_id": order.pk, "customer": ctx.principal, "orders": mine.count(), "quantity": total}


@tool(description="Export the orders, slowly (checks for a cancel every step).", poll_interval_ms=200)
def export_orders(ctx: TaskContext, seconds: float = 60.0) -> dict[str, Any]:
    """Stand-in for a long export: sleeps in cancellable slices, reporting as it goes."""
    count = Order.objects.count()
    steps = max(1, int(seconds / 0.5))
    for step in range(steps):
        ctx.report(f"exporting {count} orders", progress=step, total=steps)
        ctx.sleep(0.5)  # raises TaskCancelled once the task is cancelled
    return {"exported": count}


@tool(description="Sync the stock with a warehouse that is busy on the first try.", max_attempts=3)
def sync_stock(ctx: TaskContext, delay: float = 600.0) -> dict[str, Any]:
    """The first attempt asks to be retried after ``delay`` seconds; the next one syncs."""
    if ctx.attempt == 1:
        ctx.retry_later(delay, "the warehouse is busy")
    return {"attempt": ctx.attempt, "items": Order.objects.values("item").distinct().count()}
