"""Who may use the console, and what every console response carries.

Admins are not tool callers: an admin presents a console token (``console_admin_tokens`` holds
only their SHA-256 hashes) once, on the login form, and gets a signed session cookie (HttpOnly,
SameSite=Strict, Secure over https) naming ``admin:<name>``. A token that opens the MCP endpoint
(``auth_tokens``, a JWT) is recognised and refused with 403, never taken for an admin's. A session
ends when it expires, its admin's token is removed from the settings, or it is revoked server-side
(signed out, or all of its admin's sessions revoked: ``revocation``); the cookie carries its
issue time and a nonce for that.

Every POST carries a CSRF token bound to the session (an HMAC of its nonce), the login form's a
double-submit value of its own cookie. Every response is ``no-store`` under a strict
Content-Security-Policy (scripts and styles from ``/console/static`` only; no framing).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from mcp_celery_tasks.settings import Settings

__all__ = ["HEADERS", "SESSION_COOKIE", "Admin", "Keys", "Refused", "Sessions", "ToolCaller"]

logger = logging.getLogger("mcp_celery_tasks.console")

SESSION_COOKIE = "mcp_console"
LOGIN_COOKIE = "mcp_console_login"
SESSION_S = 8 * 3600

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "object-src 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


ToolCaller = Callable[[str], bool]
"""Whether a token opens the MCP endpoint (the API's authenticator says: ``api.server``)."""


class Refused(Exception):
    """Not an admin: ``status`` 401 (no or unknown credentials) or 403 (a tool caller's token, a
    missing or wrong CSRF token). The message is fixed text of this module."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Admin:
    """A signed-in admin: ``actor`` is ``admin:<name>``; ``csrf`` the session's POST token. A
    session's ``session`` is the SHA-256 of its nonce (what a sign-out revokes), ``issued_ms`` and
    ``expires`` its issue time (ms) and expiry (s); a bearer request has no session (``""``)."""

    name: str
    csrf: str
    session: str = ""
    issued_ms: int = 0
    expires: int = 0

    @property
    def actor(self) -> str:
        return f"admin:{self.name}"


class Keys:
    """The session signing key: derived from the first of ``secret_keys`` (shared by every API
    replica), else one per process (sessions then open only on the replica that made them)."""

    def __init__(self, settings: Settings) -> None:
        if settings.secret_keys:
            seed = settings.secret_keys[0].encode()
        else:
            logger.warning("MCP_TASKS_SECRET_KEYS is not set: console sessions open only in this process")
            seed = secrets.token_bytes(32)
        self.session = hmac.new(seed, b"mcp-celery-tasks console session", hashlib.sha256).digest()

    def sign(self, data: bytes) -> str:
        return _b64(hmac.new(self.session, data, hashlib.sha256).digest())


class Sessions:
    def __init__(self, settings: Settings, is_tool_caller: ToolCaller) -> None:
        _check(settings)
        self.settings = settings
        self.is_tool_caller = is_tool_caller
        self.keys = Keys(settings)

    # ---- credentials -----------------------------------------------------------------------

    def admin_name(self, token: str) -> str:
        """The admin a console token belongs to; ``Refused`` for anything else."""
        token = token.strip()
        if not token:
            raise Refused(401, "enter an admin token")
        digest = hashlib.sha256(token.encode()).hexdigest()
        for name, expected in self.settings.console_admin_tokens.items():
            if hmac.compare_digest(digest, expected.strip().lower()):
                return name
        if self.is_tool_caller(token):
            raise Refused(403, "this token calls tools; it does not open the console")
        raise Refused(401, "unknown admin token")

    def bearer(self, authorization: str) -> Admin:
        """An ``Authorization: Bearer`` console request (a script's, not a browser's: a header is
        no ambient credential, so it needs no CSRF token)."""
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            raise Refused(401, "expected a bearer token")
        return Admin(self.admin_name(token), csrf="")

    # ---- the session cookie ----------------------------------------------------------------

    def issue(self, name: str) -> str:
        now = time.time()
        payload = {
            "n": name,
            "x": int(now) + SESSION_S,
            "i": int(now * 1000),
            "c": secrets.token_urlsafe(16),
        }
        data = json.dumps(payload, separators=(",", ":")).encode()
        return f"{_b64(data)}.{self.keys.sign(data)}"

    def admin(self, cookie: str | None) -> Admin:
        """The admin of a session cookie; ``Refused(401)`` when it is missing, forged, expired or
        its admin's token is gone from the settings."""
        if not cookie or "." not in cookie:
            raise Refused(401, "sign in")
        body, _, signature = cookie.partition(".")
        try:
            data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except ValueError:
            raise Refused(401, "sign in") from None
        if not hmac.compare_digest(signature, self.keys.sign(data)):
            raise Refused(401, "sign in")
        payload = json.loads(data)
        name = payload["n"]
        if payload["x"] < time.time() or name not in self.settings.console_admin_tokens:
            raise Refused(401, "your session has ended; sign in again")
        nonce = str(payload["c"]).encode()
        expires = int(payload["x"])
        issued_ms = int(payload.get("i", (expires - SESSION_S) * 1000))  # cookies issued before "i"
        return Admin(
            name,
            self.keys.sign(b"csrf:" + nonce),
            session=hashlib.sha256(nonce).hexdigest(),
            issued_ms=issued_ms,
            expires=expires,
        )

    def check_csrf(self, admin: Admin, presented: str | None) -> None:
        if admin.csrf == "":  # a bearer request
            return
        if not presented or not hmac.compare_digest(presented, admin.csrf):
            raise Refused(403, "the form's CSRF token is missing or wrong; reload the page")

    @staticmethod
    def login_nonce() -> str:
        return secrets.token_urlsafe(16)

    @staticmethod
    def check_login_nonce(cookie: str | None, presented: str | None) -> None:
        if not cookie or not presented or not hmac.compare_digest(cookie, presented):
            raise Refused(403, "the form's CSRF token is missing or wrong; reload the page")


def _check(settings: Settings) -> None:
    """Refuse, at start, an admin entry that is not a SHA-256 hash (a token pasted in plain text
    would sit in the environment, and never match)."""
    for name, digest in settings.console_admin_tokens.items():
        if not re.fullmatch(r"[0-9a-fA-F]{64}", digest.strip()):
            raise ValueError(
                f"MCP_TASKS_CONSOLE_ADMIN_TOKENS[{name!r}] must be the SHA-256 hex digest of the admin's "
                "token (64 hex digits), never the token itself"
            )
    if not settings.console_admin_tokens:
        logger.warning(
            "the console is enabled but MCP_TASKS_CONSOLE_ADMIN_TOKENS is empty: nobody can sign in"
        )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")
