"""How every connection of ours is opened: one place for the psycopg connect arguments.

Through a transaction-mode pooler (``Settings.db_transaction_pooler``) consecutive statements
of one client may run on different server connections: a statement psycopg prepared on one
does not exist on the next ("prepared statement … does not exist"), and PgBouncer refuses
startup ``options`` it does not know. So there psycopg never prepares (``prepare_threshold``
None) and the statement timeout is left to the role or the pooler.

Every TCP connection is bounded on the client side too (issue 28): a cut link drops packets
without a reset, and a statement already sent would otherwise wait for its answer until the
kernel gives up retransmitting (about 15 minutes). ``tcp_user_timeout`` bounds unacknowledged
data, keepalives bound a connection that waits in silence; libpq ignores both on a unix socket.
The server-side ``statement_timeout`` cannot help there: its error never arrives.
"""

from __future__ import annotations

from typing import TypedDict

from mcp_celery_tasks.settings import Settings

__all__ = ["ConnectKwargs", "connect_kwargs"]


class ConnectKwargs(TypedDict, total=False):
    """``psycopg.connect``'s keyword arguments that we set."""

    autocommit: bool
    connect_timeout: int
    application_name: str
    prepare_threshold: None
    options: str
    keepalives: int
    keepalives_idle: int
    keepalives_interval: int
    keepalives_count: int
    tcp_user_timeout: int


def connect_kwargs(settings: Settings, application_name: str, *, pooled: bool = True) -> ConnectKwargs:
    """Arguments for ``psycopg.connect`` (and the pool's ``kwargs``) besides the DSN.

    ``pooled`` is False for a connection that goes to ``settings.session_database_url`` (it
    bypasses the pooler, so it may prepare and send options).
    """
    kwargs: ConnectKwargs = {
        "autocommit": True,
        "connect_timeout": max(1, int(settings.db_connect_timeout_seconds)),
        "application_name": application_name,
        "keepalives": 1,
        "keepalives_idle": settings.db_keepalives_idle_seconds,
        "keepalives_interval": settings.db_keepalives_interval_seconds,
        "keepalives_count": settings.db_keepalives_count,
        "tcp_user_timeout": settings.db_tcp_user_timeout_ms,
    }
    if pooled and settings.db_transaction_pooler:
        kwargs["prepare_threshold"] = None
    else:
        kwargs["options"] = f"-c statement_timeout={settings.db_statement_timeout_ms}"
    return kwargs
