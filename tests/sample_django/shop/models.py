"""The shop's orders: an ordinary Django model with its own migration."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """One order of ``quantity`` items, placed by ``customer`` (an MCP principal here)."""

    customer = models.CharField(max_length=200)
    item = models.CharField(max_length=200)
    quantity = models.PositiveIntegerField()
    placed_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.quantity} x {self.item} for {self.customer}"
