"""Request → principal. Principals are namespaced strings: ``anon``, ``token:<name>``,
``jwt:<issuer>#<sub>``.

Ownership is bound to the principal, never to a connection, session, client id or clientInfo.
With ``jwt_issuer`` set the server is an OAuth 2.1 resource server (MCP authorization spec):
access tokens are JWTs checked for signature, issuer, audience and expiry, and a 401 points
clients at the protected-resource metadata document.
"""

from __future__ import annotations

import hmac
from functools import cached_property
from typing import Any, TypedDict

import jwt

from mcp_celery_tasks.settings import Settings

__all__ = ["ANONYMOUS", "Authenticator", "ResourceMetadata", "Unauthorized"]

ANONYMOUS = "anon"
METADATA_PATH = "/.well-known/oauth-protected-resource"


class ResourceMetadata(TypedDict):
    """RFC 9728 protected-resource metadata: the fields we publish."""

    resource: str
    authorization_servers: list[str]
    bearer_methods_supported: list[str]
    resource_name: str


class Unauthorized(Exception):
    """No acceptable credentials (answered with HTTP 401 and ``WWW-Authenticate``)."""


class Authenticator:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @cached_property
    def _jwks(self) -> jwt.PyJWKClient | None:
        if self.settings.jwt_jwks_url is None:
            return None
        return jwt.PyJWKClient(self.settings.jwt_jwks_url, cache_keys=True, lifespan=300, timeout=5)

    def _jwt_key(self, token: str) -> Any:
        if self.settings.jwt_public_key is not None:
            return self.settings.jwt_public_key
        if self._jwks is None:
            raise Unauthorized("no key to check JWTs with")
        try:
            return self._jwks.get_signing_key_from_jwt(token).key
        except jwt.PyJWKClientError as exc:
            raise Unauthorized(f"cannot find the token's signing key: {exc}") from exc

    def principal(self, authorization: str | None) -> str:
        """The principal for an ``Authorization`` header value (may block on a JWKS fetch)."""
        settings = self.settings
        if not settings.auth_enabled:
            return ANONYMOUS
        if not authorization:
            raise Unauthorized("missing bearer token")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("expected a bearer token")
        for name, expected in settings.auth_tokens.items():
            if hmac.compare_digest(token.encode(), expected.encode()):
                return f"token:{name}"
        if settings.jwt_issuer is None or token.count(".") != 2:
            raise Unauthorized("invalid token")
        try:
            claims = jwt.decode(
                token,
                self._jwt_key(token),
                algorithms=settings.jwt_algorithms,
                issuer=settings.jwt_issuer,
                audience=settings.jwt_audience,
                options={"require": ["exp", "iss", "sub"], "verify_aud": settings.jwt_audience is not None},
                leeway=30,
            )
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"invalid token: {exc}") from exc
        return f"jwt:{claims['iss']}#{claims['sub']}"

    def challenge(self, base_url: str, error: str) -> str:
        """The ``WWW-Authenticate`` value of a 401."""
        value = 'Bearer realm="mcp"'
        if self.settings.jwt_issuer is not None:
            value += f', resource_metadata="{self.metadata_url(base_url)}"'
        safe = error.replace('"', "'")
        return value + f', error="invalid_token", error_description="{safe}"'

    def metadata_url(self, base_url: str) -> str:
        return (self.settings.resource_url or base_url).rstrip("/").removesuffix("/mcp") + METADATA_PATH

    def metadata(self, base_url: str) -> ResourceMetadata:
        """RFC 9728 protected-resource metadata, as the MCP authorization spec asks for."""
        resource = self.settings.resource_url or base_url.rstrip("/") + "/mcp"
        return {
            "resource": resource,
            "authorization_servers": [self.settings.jwt_issuer] if self.settings.jwt_issuer else [],
            "bearer_methods_supported": ["header"],
            "resource_name": self.settings.server_name,
        }
