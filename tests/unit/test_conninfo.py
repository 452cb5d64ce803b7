"""Connect arguments with and without a transaction pooler in front of Postgres."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.engine import make_url

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store._conninfo import connect_kwargs

POOLED = "postgresql://app@pgbouncer:6432/tasks"
DIRECT = "postgresql://app@db:5432/tasks"


def test_a_direct_connection_prepares_and_sends_the_statement_timeout() -> None:
    kwargs = connect_kwargs(Settings(database_url=DIRECT, db_statement_timeout_ms=1234), "x")
    assert kwargs["options"] == "-c statement_timeout=1234"
    assert "prepare_threshold" not in kwargs  # psycopg's default: prepare after 5 runs
    assert kwargs["autocommit"] is True and kwargs["application_name"] == "x"


def test_through_a_transaction_pooler_nothing_is_prepared_and_no_options_are_sent() -> None:
    settings = Settings(database_url=POOLED, db_transaction_pooler=True, direct_database_url=DIRECT)
    kwargs = connect_kwargs(settings, "x")
    assert kwargs["prepare_threshold"] is None
    assert "options" not in kwargs


def test_the_session_connections_bypass_the_pooler() -> None:
    settings = Settings(database_url=POOLED, db_transaction_pooler=True, direct_database_url=DIRECT)
    assert settings.session_database_url == DIRECT
    assert settings.sqlalchemy_url == "postgresql+psycopg://app@db:5432/tasks"  # migrations
    kwargs = connect_kwargs(settings, "events", pooled=False)
    assert "prepare_threshold" not in kwargs and "options" in kwargs


def test_without_a_direct_url_the_session_connections_use_the_database_url() -> None:
    assert Settings(database_url=DIRECT).session_database_url == DIRECT


def test_a_transaction_pooler_without_a_direct_url_is_refused() -> None:
    with pytest.raises(ValidationError, match="MCP_TASKS_DIRECT_DATABASE_URL"):
        Settings(database_url=POOLED, db_transaction_pooler=True)


def test_the_direct_url_accepts_the_sqlalchemy_spelling() -> None:
    settings = Settings(direct_database_url="postgresql+psycopg://app@db/tasks")
    assert settings.direct_database_url == "postgresql://app@db/tasks"


def test_every_connection_bounds_a_silent_network_cut_on_the_client_side() -> None:
    settings = Settings(
        database_url=DIRECT,
        db_tcp_user_timeout_ms=7000,
        db_keepalives_idle_seconds=4,
        db_keepalives_interval_seconds=1,
        db_keepalives_count=2,
    )
    for kwargs in (connect_kwargs(settings, "x"), connect_kwargs(settings, "x", pooled=False)):
        assert kwargs["keepalives"] == 1 and kwargs["tcp_user_timeout"] == 7000
        assert (kwargs["keepalives_idle"], kwargs["keepalives_interval"], kwargs["keepalives_count"]) == (
            4,
            1,
            2,
        )
    defaults = connect_kwargs(Settings(database_url=DIRECT), "x")
    idle, interval, count = (
        defaults["keepalives_idle"],
        defaults["keepalives_interval"],
        defaults["keepalives_count"],
    )
    assert idle + interval * count <= 15 and 0 < defaults["tcp_user_timeout"] <= 15_000


def test_migrations_accept_a_multi_host_dsn_with_its_session_attributes() -> None:
    # A primary and its standby: libpq picks the writable one; SQLAlchemy's URL parser would
    # read "5432,standby:5433" as the port and fail, so the hosts go to its ?host= form.
    url = "postgresql://app:pw@primary:5432,standby:5433/tasks?target_session_attrs=read-write"
    migrations = Settings(database_url=url).sqlalchemy_url
    assert migrations == (
        "postgresql+psycopg://app:pw@/tasks?host=primary%3A5432&host=standby%3A5433"
        "&target_session_attrs=read-write"
    )
    args = psycopg_dialect().create_connect_args(make_url(migrations))[1]  # type: ignore[no-untyped-call]
    assert (args["host"], args["port"], args["target_session_attrs"]) == (
        "primary,standby",
        "5432,5433",
        "read-write",
    )
    assert Settings(database_url=DIRECT).sqlalchemy_url == "postgresql+psycopg://app@db:5432/tasks"
