"""The shop's first migration: the orders table."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("customer", models.CharField(max_length=200)),
                ("item", models.CharField(max_length=200)),
                ("quantity", models.PositiveIntegerField()),
                ("placed_at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
    ]
