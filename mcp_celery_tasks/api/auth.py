"""Request → principal. Principals are namespaced strings: ``anon``, ``token:<name>``,
``jwt:<issuer>#<sub>``.

Ownership is bound to the principal, never to a connection, session, client id or clientInfo.
With ``jwt_issuer`` set the server is an OAuth 2.1 resource server (MCP authorization spec):
access tokens are JWTs checked for signature, issuer, audience, expiry and the scopes every
request needs (``jwt_required_scopes``); a 401 points clients at the protected-resource metadata
document and names those scopes; a tool's own ``scopes`` are checked at its call (403
``insufficient_scope``, ``errors.InsufficientScope``).

What reaches an unauthenticated client is fixed ASCII text chosen here, never a library's
message or a token's own header fields (a ``kid`` of any characters once made HTTP 500).
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypedDict
from urllib.parse import urlsplit

import jwt

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.tools.registry import all_tools

__all__ = [
    "ANONYMOUS",
    "METADATA_PATH",
    "MIN_HMAC_SECRET_BYTES",
    "Authenticator",
    "Identity",
    "ResourceMetadata",
    "Unauthorized",
]

logger = logging.getLogger("mcp_celery_tasks.server")

ANONYMOUS = "anon"
METADATA_PATH = "/.well-known/oauth-protected-resource"
KEY_REFRESH_COOLDOWN_S = 30.0
"""At most one JWKS fetch per this many seconds for a ``kid`` the cached keys lack: random
``kid``s must not turn each request into a fetch from the issuer."""
KEY_FAILURE_COOLDOWN_S = 5.0
"""After a failed JWKS fetch, tokens needing it are refused at once this long (no fetch per request)."""


class ResourceMetadata(TypedDict, total=False):
    """RFC 9728 protected-resource metadata: the fields we publish."""

    resource: str
    authorization_servers: list[str]
    bearer_methods_supported: list[str]
    resource_name: str
    scopes_supported: list[str]


class Unauthorized(Exception):
    """No acceptable credentials (answered with HTTP 401 and ``WWW-Authenticate``). The message
    is shown to the client: fixed text only."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who calls, and the scopes their token grants (None: not scope-limited — a static token,
    auth off, or an embedding app's own principal)."""

    principal: str
    scopes: frozenset[str] | None = None


_REFUSALS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.ExpiredSignatureError, "the token has expired"),
    (jwt.InvalidAudienceError, "the token is not for this resource"),
    (jwt.InvalidIssuerError, "the token is from another issuer"),
    (jwt.MissingRequiredClaimError, "the token lacks a required claim"),
    (jwt.ImmatureSignatureError, "the token is not valid yet"),
)


MIN_HMAC_SECRET_BYTES = 32
"""RFC 7518 §3.2: an HS256 key is at least as long as its hash output."""


class Authenticator:
    def __init__(self, settings: Settings) -> None:
        _check(settings)
        self.settings = settings
        self._lock = threading.Lock()
        self._refreshed_at = 0.0
        self._failed_at = 0.0

    @cached_property
    def _jwks(self) -> jwt.PyJWKClient | None:
        if self.settings.jwt_jwks_url is None:
            return None
        return jwt.PyJWKClient(self.settings.jwt_jwks_url, cache_keys=True, lifespan=300, timeout=5)

    def _jwt_key(self, token: str) -> Any:
        if self.settings.jwt_public_key is not None:
            return self.settings.jwt_public_key
        if self._jwks is None:
            raise Unauthorized("no key to check the token with")
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError:
            raise Unauthorized("the token is malformed") from None
        return self._key_for(self._jwks, kid)

    def _key_for(self, client: jwt.PyJWKClient, kid: object) -> Any:
        """The issuer's key ``kid``, fetched again at most once per cooldown when it is unknown."""
        now = time.monotonic()
        with self._lock:
            if now - self._failed_at < KEY_FAILURE_COOLDOWN_S:
                raise Unauthorized("the issuer's keys cannot be fetched now; retry shortly")
            for refresh in (False, True):
                if refresh and now - self._refreshed_at < KEY_REFRESH_COOLDOWN_S:
                    break
                try:
                    keys = client.get_signing_keys(refresh=refresh)
                except jwt.PyJWKClientError:
                    self._failed_at = now
                    logger.warning(
                        "could not fetch the JWKS from %s", self.settings.jwt_jwks_url, exc_info=True
                    )
                    raise Unauthorized("the issuer's keys cannot be fetched now; retry shortly") from None
                if refresh or not self._refreshed_at:
                    self._refreshed_at = now
                found = next((key for key in keys if key.key_id == kid), None)
                if found is not None:
                    return found.key
        raise Unauthorized("the token is signed with an unknown key")

    def principal(self, authorization: str | None) -> str:
        """The principal for an ``Authorization`` header value (may block on a JWKS fetch)."""
        return self.identity(authorization).principal

    def identity(self, authorization: str | None) -> Identity:
        """The caller for an ``Authorization`` header value (may block on a JWKS fetch)."""
        settings = self.settings
        if not settings.auth_enabled:
            return Identity(ANONYMOUS)
        if not authorization:
            raise Unauthorized("missing bearer token")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("expected a bearer token")
        for name, expected in settings.auth_tokens.items():
            if hmac.compare_digest(token.encode(), expected.encode()):
                return Identity(f"token:{name}")
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
            reason = next((text for kind, text in _REFUSALS if isinstance(exc, kind)), "invalid token")
            raise Unauthorized(reason) from exc
        scopes = _scopes_of(claims)
        missing = [scope for scope in settings.jwt_required_scopes if scope not in scopes]
        if missing:
            raise Unauthorized("the token lacks a scope every request needs")
        return Identity(f"jwt:{claims['iss']}#{claims['sub']}", scopes)

    def calls_tools(self, token: str) -> bool:
        """Whether ``token`` opens the MCP endpoint (a static token, a valid JWT): the console
        refuses such a token rather than take it for an admin's."""
        if not self.settings.auth_enabled:
            return False
        try:
            self.identity(f"Bearer {token}")
        except Unauthorized:
            return False
        return True

    def challenge(self, base_url: str, error: str) -> str:
        """The ``WWW-Authenticate`` value of a 401 (``error`` is fixed text of this module)."""
        value = 'Bearer realm="mcp"'
        if self.settings.jwt_issuer is not None:
            value += f', resource_metadata="{self.metadata_url(base_url)}"'
            if self.settings.jwt_required_scopes:
                value += f', scope="{" ".join(self.settings.jwt_required_scopes)}"'
        safe = "".join(c for c in error if c.isascii() and c.isprintable() and c not in '"\\')
        return value + f', error="invalid_token", error_description="{safe}"'

    def resource(self, base_url: str) -> str:
        """This server's resource identifier: configured (``resource_url``, else a URL audience)
        in JWT mode, never taken from the request's Host header there."""
        configured = self.settings.resource_url or _url_audience(self.settings.jwt_audience)
        return configured or base_url.rstrip("/") + "/mcp"

    def metadata_url(self, base_url: str) -> str:
        """The metadata's path-inserted URL (RFC 9728 §3.1): ``/.well-known/oauth-protected-resource/mcp``
        for ``https://host/mcp``; the root form is served too."""
        parts = urlsplit(self.resource(base_url))
        return f"{parts.scheme}://{parts.netloc}{METADATA_PATH}{parts.path.rstrip('/')}"

    def metadata(self, base_url: str) -> ResourceMetadata:
        """RFC 9728 protected-resource metadata, as the MCP authorization spec asks for."""
        document: ResourceMetadata = {
            "resource": self.resource(base_url),
            "authorization_servers": [self.settings.jwt_issuer] if self.settings.jwt_issuer else [],
            "bearer_methods_supported": ["header"],
            "resource_name": self.settings.server_name,
        }
        supported = sorted({*self.settings.jwt_required_scopes, *(s for t in all_tools() for s in t.scopes)})
        if supported:
            document["scopes_supported"] = supported
        return document


def _scopes_of(claims: dict[str, Any]) -> frozenset[str]:
    """RFC 9068 ``scope`` (space-separated), or ``scp`` (a list, as some issuers send)."""
    raw = claims.get("scope", claims.get("scp"))
    if isinstance(raw, str):
        return frozenset(raw.split())
    if isinstance(raw, list):
        return frozenset(item for item in raw if isinstance(item, str))
    return frozenset()


def _url_audience(audience: str | None) -> str | None:
    if audience and urlsplit(audience).scheme in ("https", "http") and urlsplit(audience).netloc:
        return audience
    return None


def _check(settings: Settings) -> None:
    """Refuse, at start, a JWT setup that would be unsafe to serve."""
    if settings.jwt_issuer is None:
        return
    if not (settings.resource_url or _url_audience(settings.jwt_audience)):
        raise ValueError(
            "MCP_TASKS_JWT_ISSUER needs MCP_TASKS_RESOURCE_URL (this server's public URL, e.g. "
            "https://mcp.example.com/mcp) or a URL MCP_TASKS_JWT_AUDIENCE: the protected-resource "
            "metadata must not follow the request's Host header"
        )
    hmac_algorithms = [name for name in settings.jwt_algorithms if name.upper().startswith("HS")]
    secret = settings.jwt_public_key
    if hmac_algorithms and secret is not None and len(secret.encode()) < MIN_HMAC_SECRET_BYTES:
        raise ValueError(
            f"MCP_TASKS_JWT_PUBLIC_KEY is an HMAC secret for {', '.join(hmac_algorithms)} of "
            f"{len(secret.encode())} bytes: it must be at least {MIN_HMAC_SECRET_BYTES} (RFC 7518 §3.2)"
        )
