"""Who is calling: the principal of one HTTP request to the MCP endpoint.

Two ways in. The standalone server (``create_server``) checks bearer tokens and JWTs itself
(``Authenticator``); an app that embeds the endpoint (``embed.mount``) may instead hand over the
principal its own authentication found, through ``principal_of(request)``. Either way the
answer is a principal string or ``Unauthorized`` (HTTP 401), and nothing blocks the event loop:
a JWT whose key may need a JWKS fetch is checked in a thread.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request

from mcp_celery_tasks.api.auth import Authenticator, Identity, Unauthorized

__all__ = ["MAX_PRINCIPAL_CHARS", "Gate", "PrincipalOf"]

PrincipalOf = Callable[[Request], "str | Awaitable[str | None] | None"]
"""The host app's own authentication: the caller's principal, or None (HTTP 401). It may also
raise the host's own errors (an ``HTTPException``), which the host's handlers answer."""

MAX_PRINCIPAL_CHARS = 256

logger = logging.getLogger("mcp_celery_tasks.server")


class Gate:
    def __init__(self, authenticator: Authenticator, principal_of: PrincipalOf | None = None) -> None:
        self.authenticator = authenticator
        self.principal_of = principal_of

    async def principal(self, request: Request, authorization: str | None) -> str:
        """The caller's principal; ``Unauthorized`` when there is none."""
        return (await self.identity(request, authorization)).principal

    async def identity(self, request: Request, authorization: str | None) -> Identity:
        """The caller and their token's scopes; ``Unauthorized`` when there is none."""
        if self.principal_of is not None:
            return Identity(_checked(await _maybe_awaited(self.principal_of(request))))
        settings = self.authenticator.settings
        if authorization and authorization.count(".") == 2 and settings.jwt_jwks_url:
            return await asyncio.to_thread(self.authenticator.identity, authorization)  # may fetch JWKS
        return self.authenticator.identity(authorization)

    def challenge(self, base_url: str, error: str) -> str:
        """The ``WWW-Authenticate`` value of a 401."""
        return self.authenticator.challenge(base_url, error)


async def _maybe_awaited(value: str | Awaitable[str | None] | None) -> str | None:
    return await value if inspect.isawaitable(value) else value


def _checked(principal: object) -> str:
    """A host's principal is the owner key of every task it creates: a non-empty, printable
    string (it reaches logs, admin views and terminals), of bounded length. Anything else is the
    host's bug, logged, and the request is refused (401): fail closed, never a guessed owner."""
    if principal is None:
        raise Unauthorized("the app found no principal for this request")
    if not isinstance(principal, str) or not principal or len(principal) > MAX_PRINCIPAL_CHARS:
        problem = (
            f"a {type(principal).__name__}"
            if not isinstance(principal, str)
            else f"{len(principal)} characters"
        )
    elif not principal.isprintable():
        problem = "control characters"
    else:
        return principal
    logger.error(
        "principal_of returned %s: a principal is a printable str of 1 to %d characters, or None",
        problem,
        MAX_PRINCIPAL_CHARS,
    )
    raise Unauthorized("the app gave no usable principal for this request")
