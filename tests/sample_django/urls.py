"""The sample project's URLs: Django's admin, where the MCP tasks show too."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
