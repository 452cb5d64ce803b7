"""The shop app's configuration."""

from __future__ import annotations

from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "tests.sample_django.shop"
    label = "shop"
    default_auto_field = "django.db.models.BigAutoField"
