"""Signing out: this session (``logout``) or every session of the signed-in admin
(``logout_everywhere``), both server-side (``revocation``) and audited.

A sign-out revokes its session's nonce until the cookie's own expiry, so the cookie replayed
after it (copied from the browser, kept by a proxy log) is refused on every replica: deleting
the cookie alone would end nothing but the browser's copy. "Sign out everywhere" is the lost
laptop's remedy from another machine: every session of this admin issued before now, this one
included, is refused; signing in again makes a new one. ``tasks console revoke`` does the same
from the command line, for one admin or all.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from mcp_celery_tasks.console.actions import ServicesOf
from mcp_celery_tasks.console.revocation import Revocations
from mcp_celery_tasks.console.security import HEADERS, SESSION_COOKIE, SESSION_S, Admin
from mcp_celery_tasks.json_types import JSONObject
from mcp_celery_tasks.store.revocation_calls import Revocation, admin_subject

__all__ = ["SignOuts"]

logger = logging.getLogger("mcp_celery_tasks.console")


class SignOuts:
    """The sign-out POSTs, mixed into the console (``pages.Console``)."""

    services_of: ServicesOf
    revocations: Revocations
    prefix: str
    cookies: str

    async def logout(self, request: Request, admin: Admin) -> Response:
        if admin.session:  # a bearer request has no session to end
            store = self.services_of(request).store
            await store.revoke_console_session(admin.session, admin.expires, admin.actor)
            self.revocations.note(Revocation(f"session:{admin.session}", 0.0))
            logger.info("console: %s signed out", admin.actor)
        return self._signed_out()

    async def logout_everywhere(self, request: Request, admin: Admin) -> Response:
        store = self.services_of(request).store
        detail: JSONObject = {"from": "console"}
        revocation = await store.revoke_console_sessions(
            admin_subject(admin.name), admin.actor, SESSION_S, detail
        )
        self.revocations.note(revocation)
        logger.warning("console: %s revoked every session of %s", admin.actor, admin.actor)
        return self._signed_out()

    def _signed_out(self) -> Response:
        response = RedirectResponse(f"{self.prefix}/login", 303, headers=HEADERS)
        response.delete_cookie(SESSION_COOKIE, path=self.cookies)
        return response
