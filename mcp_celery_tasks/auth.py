"""Request → principal. Principals are namespaced strings: ``anon``, ``token:<name>``.

Ownership is bound to the principal, never to a connection, session, client id or clientInfo.
"""

from __future__ import annotations

import hmac

from mcp_celery_tasks.settings import Settings

__all__ = ["ANONYMOUS", "Unauthorized", "authenticate"]

ANONYMOUS = "anon"


class Unauthorized(Exception):
    """No acceptable credentials (answered with HTTP 401 and ``WWW-Authenticate``)."""


def authenticate(settings: Settings, authorization: str | None) -> str:
    """The principal for an ``Authorization`` header value."""
    if not settings.auth_enabled:
        return ANONYMOUS
    if not authorization:
        raise Unauthorized("missing bearer token")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("expected a bearer token")
    token = token.strip()
    for name, expected in settings.auth_tokens.items():
        if hmac.compare_digest(token.encode(), expected.encode()):
            return f"token:{name}"
    raise Unauthorized("invalid token")
