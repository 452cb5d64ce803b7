"""The console's routes under its prefix (``/console`` on the API; ``http``): overview, task
list, task detail with its live stream, cancel, the audit, sign-in and out, and the static script
and style sheet.

Every page needs a signed-in admin (``security``); a GET without one goes to the sign-in form, a
POST without one, or without its CSRF token, is refused (401/403) and changes nothing. Tasks are
named by job id; their task ids stay in the server.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from importlib.resources import files
from urllib.parse import parse_qs, quote, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from mcp_celery_tasks.console import listing, live
from mcp_celery_tasks.console.actions import Actions, ServicesOf
from mcp_celery_tasks.console.http import PREFIX, cookie_path, html, next_path, prefix_of, refusal
from mcp_celery_tasks.console.limits import FIELDS, parse_limits
from mcp_celery_tasks.console.render import render
from mcp_celery_tasks.console.revocation import Revocations
from mcp_celery_tasks.console.security import (
    HEADERS,
    LOGIN_COOKIE,
    SESSION_COOKIE,
    SESSION_S,
    Admin,
    Refused,
    Sessions,
    ToolCaller,
)
from mcp_celery_tasks.console.signouts import SignOuts
from mcp_celery_tasks.console.throttle import FailedLogins
from mcp_celery_tasks.console.views import task_view
from mcp_celery_tasks.errors import InfrastructureError
from mcp_celery_tasks.json_types import JSONValue
from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store.console_calls import NotPermitted

__all__ = ["PREFIX", "console_routes"]

logger = logging.getLogger("mcp_celery_tasks.console")

MAX_FORM_BYTES = 16_384
_STATIC = {"console.js": "text/javascript", "console.css": "text/css"}

Handler = Callable[[Request, Admin], Awaitable[Response]]


async def _form(request: Request) -> dict[str, str]:
    """A urlencoded form body (bounded); the first value of each field."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise Refused(413, "the form is too large")
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


class Console(Actions, SignOuts):
    def __init__(
        self, settings: Settings, is_tool_caller: ToolCaller, services_of: ServicesOf, prefix: str
    ) -> None:
        self.prefix = prefix
        self.cookies = cookie_path(prefix)
        self.sessions = Sessions(settings, is_tool_caller)
        self.revocations = Revocations()
        self.failed_logins = FailedLogins()
        self.services_of = services_of
        self.active_limit = settings.max_active_tasks_per_principal  # the overview's default limit
        self.secure_default = settings.resource_url is not None and settings.resource_url.startswith("https")

    async def _admin(self, request: Request) -> Admin:
        authorization = request.headers.get("authorization")
        if authorization:  # a token tried on every request: held back like the sign-in form's
            address = _address(request)
            self.failed_logins.check(address)
            try:
                return self.sessions.bearer(authorization)
            except Refused:
                self.failed_logins.failed(address)
                raise
        admin = self.sessions.admin(request.cookies.get(SESSION_COOKIE))
        await self.revocations.check(admin, self.services_of(request))  # in memory, mostly
        return admin

    def page(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A GET page for admins: the sign-in form for anyone else."""

        async def endpoint(request: Request) -> Response:
            try:
                admin = await self._admin(request)
            except InfrastructureError:
                return refusal(
                    Refused(503, "the task database is unavailable; try again shortly"), self.prefix
                )
            except Refused as refused:
                if refused.status == 401 and "authorization" not in request.headers:
                    back = quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
                    return RedirectResponse(f"{self.prefix}/login?next={back}", 303, headers=HEADERS)
                return refusal(refused, self.prefix)
            try:
                return await handler(request, admin)
            except listing.BadFilter as bad:
                return refusal(Refused(400, str(bad)), self.prefix)
            except InfrastructureError:
                return refusal(
                    Refused(503, "the task database is unavailable; try again shortly"), self.prefix
                )

        return endpoint

    def action(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A POST for admins with the session's CSRF token; refused (and nothing done) otherwise."""

        async def endpoint(request: Request) -> Response:
            try:
                admin = await self._admin(request)
                form = await _form(request)
                self.sessions.check_csrf(admin, form.get("csrf"))
                request.state.form = form
                return await handler(request, admin)
            except Refused as refused:
                return refusal(refused, self.prefix)
            except NotPermitted as denied:
                hint = "; or give the console an admin login: MCP_TASKS_CONSOLE_DATABASE_URL"
                return refusal(Refused(403, f"{denied}{hint}"), self.prefix)
            except listing.BadFilter as bad:
                return refusal(Refused(400, str(bad)), self.prefix)
            except InfrastructureError:
                return refusal(
                    Refused(503, "the task database is unavailable; try again shortly"), self.prefix
                )

        return endpoint

    # ---- sign-in ---------------------------------------------------------------------------

    def _secure(self, request: Request) -> bool:
        return request.url.scheme == "https" or self.secure_default

    async def login_form(self, request: Request) -> Response:
        nonce = self.sessions.login_nonce()
        page = render(
            "login.html",
            prefix=self.prefix,
            csrf=nonce,
            next=next_path(request.query_params.get("next"), self.prefix),
            error="",
        )
        response = html(page)
        response.set_cookie(
            LOGIN_COOKIE, nonce, max_age=600, path=self.cookies, httponly=True, samesite="strict",
            secure=self._secure(request),
        )  # fmt: skip
        return response

    async def login(self, request: Request) -> Response:
        address = _address(request)
        try:
            self.failed_logins.check(address)
            form = await _form(request)
            self.sessions.check_login_nonce(request.cookies.get(LOGIN_COOKIE), form.get("csrf"))
            try:
                name = self.sessions.admin_name(form.get("token", ""))
            except Refused:
                self.failed_logins.failed(address)
                raise
        except Refused as refused:
            nonce = self.sessions.login_nonce()
            page = render(
                "login.html", prefix=self.prefix, csrf=nonce, next=f"{self.prefix}/", error=str(refused)
            )
            response = html(page, refused.status)
            response.set_cookie(
                LOGIN_COOKIE, nonce, max_age=600, path=self.cookies, httponly=True, samesite="strict",
                secure=self._secure(request),
            )  # fmt: skip
            return response
        logger.info("console: admin:%s signed in", name)
        response = RedirectResponse(next_path(form.get("next"), self.prefix), 303, headers=HEADERS)
        response.set_cookie(
            SESSION_COOKIE, self.sessions.issue(name), max_age=SESSION_S, path=self.cookies, httponly=True,
            samesite="strict", secure=self._secure(request),
        )  # fmt: skip
        response.delete_cookie(LOGIN_COOKIE, path=self.cookies)
        return response

    # ---- pages -----------------------------------------------------------------------------

    async def overview(self, request: Request, admin: Admin) -> Response:
        services = self.services_of(request)
        sections = await services.store.console_overview(default_limit=self.active_limit)
        return html(render("overview.html", prefix=self.prefix, admin=admin, **sections))

    async def tasks(self, request: Request, admin: Admin) -> Response:
        params = dict(request.query_params)
        where, oldest = listing.parse(params), listing.oldest(params)
        store = self.services_of(request).store
        page = await store.console_tasks(where, listing.page_size(params), oldest=oldest)
        older = None
        if page.more:
            last = listing.cursor(page.rows[-1], where.sort)
            older = listing.query(params, after=last) if oldest else listing.query(params, before=last)
        shown = [str(row["job_id"]) for row in page.rows]
        # Followed rows are ``row=``, never ``job=``: that is the list's job filter, which the new
        # rows' filter reads (a first page's followed ids under ``job=`` filtered every new row out).
        follow = urlencode([("row", job) for job in shown]) if 0 < len(shown) <= live.MAX_LIVE_ROWS else ""
        first = where.before is None and where.after is None
        newest_first = not oldest and where.sort == "created"  # where a task created since goes
        if first and newest_first and len(shown) <= live.MAX_LIVE_ROWS:  # the first page: new rows too
            after = [("after", listing.cursor(page.rows[0]))] if page.rows else []
            follow = urlencode([*listing.filter_fields(params).items(), ("news", "1"), *after]) + (
                f"&{follow}" if follow else ""
            )
        newest = None if first else listing.query(params, before=None, after=None)
        return html(
            render(
                "tasks.html",
                prefix=self.prefix,
                admin=admin,
                rows=page.rows,
                params=params,
                statuses=listing.STATUSES,
                older=older,
                newest=newest,
                follow=follow,
                bulk_fields=listing.FILTERS,
                oldest=oldest,
                sort=where.sort,
                sorts=listing.sort_links(params),
            )
        )

    async def task(self, request: Request, admin: Admin) -> Response:
        detail = await self.services_of(request).store.console_task(request.path_params["job_id"])
        if detail is None:
            return refusal(Refused(404, "no such job (it may have expired)"), self.prefix)
        return html(render("task.html", prefix=self.prefix, admin=admin, **task_view(detail)))

    async def task_live(self, request: Request, admin: Admin) -> Response:
        services = self.services_of(request)
        job_id = request.path_params["job_id"]
        detail = await services.store.console_task(job_id)
        if detail is None:
            return refusal(Refused(404, "no such job (it may have expired)"), self.prefix)
        task_id = str(detail.task["task_id"])
        return StreamingResponse(
            self.revocations.guarded(live.changes(services, task_id, job_id), admin, services),
            media_type="text/event-stream",
            headers={**HEADERS, "X-Accel-Buffering": "no"},
        )

    async def tasks_live(self, request: Request, admin: Admin) -> Response:
        services = self.services_of(request)
        jobs = list(dict.fromkeys(request.query_params.getlist("row")))[: live.MAX_LIVE_ROWS]
        params = dict(request.query_params)
        news = listing.parse({**listing.filter_fields(params), "after": params.get("after", "")})
        return StreamingResponse(
            self.revocations.guarded(
                live.row_changes(services, jobs, news if params.get("news") else None), admin, services
            ),
            media_type="text/event-stream",
            headers={**HEADERS, "X-Accel-Buffering": "no"},
        )

    async def cancel(self, request: Request, admin: Admin) -> Response:
        services = self.services_of(request)
        job_id = request.path_params["job_id"]
        detail = await services.store.console_task(job_id)
        if detail is None:
            return refusal(Refused(404, "no such job (it may have expired)"), self.prefix)
        reason = request.state.form.get("reason", "").strip()[:500] or "cancelled by an operator"
        owner = str(detail.task["owner"])
        outcome = await services.tasks.cancel(str(detail.task["task_id"]), owner, f"{reason} ({admin.actor})")
        affected = 1 if outcome.cancelled_now else 0
        await services.console_writes.record_console_action(
            admin.actor, "cancel", job_id, affected, {"reason": reason}
        )
        logger.info("console: %s cancelled job %s (%d changed)", admin.actor, job_id, affected)
        return RedirectResponse(f"{self.prefix}/tasks/{quote(job_id)}", 303, headers=HEADERS)

    async def limits(self, request: Request, admin: Admin) -> Response:
        store = self.services_of(request).store
        rows = await store.principal_limits()
        tools, groups = await store.console_tool_limits()
        fields = {name: label for name, (label, _, _) in FIELDS.items()}
        return html(
            render(
                "limits.html",
                prefix=self.prefix,
                admin=admin,
                rows=rows,
                fields=fields,
                tools=tools,
                groups=groups,
            )
        )

    async def set_limits(self, request: Request, admin: Admin) -> Response:
        principal, limits = parse_limits(request.state.form)
        store = self.services_of(request).console_writes
        await store.console_set_limits(principal, admin.actor, limits)
        detail: dict[str, JSONValue] = {
            name: value for name, value in limits.items() if isinstance(value, int | float | str)
        }
        await store.record_console_action(admin.actor, "set limits", f"principal {principal}", 1, detail)
        logger.info("console: %s changed the limits of %s: %s", admin.actor, principal, sorted(limits))
        return RedirectResponse(f"{self.prefix}/limits", 303, headers=HEADERS)

    async def audit(self, request: Request, admin: Admin) -> Response:
        actions, limits = await self.services_of(request).store.console_audit()
        return html(render("audit.html", prefix=self.prefix, admin=admin, actions=actions, limits=limits))

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return Response(status_code=404, headers=HEADERS)
        body = files("mcp_celery_tasks.console").joinpath("static", name).read_bytes()
        return Response(body, media_type=_STATIC[name], headers={**HEADERS, "Cache-Control": "max-age=300"})


def _address(request: Request) -> str:
    return request.client.host if request.client is not None else "?"


def console_routes(
    settings: Settings, is_tool_caller: ToolCaller, services_of: ServicesOf, *, prefix: str = PREFIX
) -> list[Route]:
    """The console's routes under ``prefix`` (``/console``; ``""`` or ``/`` is the root), to be
    put in front of the app's. ``is_tool_caller(token)``: whether a token opens the MCP endpoint
    (the console refuses such a token with 403)."""
    at = prefix_of(prefix)
    console = Console(settings, is_tool_caller, services_of, at)
    home = [Route(at, lambda request: RedirectResponse(f"{at}/", 307), methods=["GET"])] if at else []
    return [
        *home,
        Route(f"{at}/", console.page(console.overview), methods=["GET"]),
        Route(f"{at}/login", console.login_form, methods=["GET"]),
        Route(f"{at}/login", console.login, methods=["POST"]),
        Route(f"{at}/logout", console.action(console.logout), methods=["POST"]),
        Route(f"{at}/logout/everywhere", console.action(console.logout_everywhere), methods=["POST"]),
        Route(f"{at}/tasks", console.page(console.tasks), methods=["GET"]),
        Route(f"{at}/tasks/live", console.page(console.tasks_live), methods=["GET"]),
        Route(f"{at}/tasks/{{job_id}}", console.page(console.task), methods=["GET"]),
        Route(f"{at}/tasks/{{job_id}}/live", console.page(console.task_live), methods=["GET"]),
        Route(f"{at}/tasks/{{job_id}}/cancel", console.action(console.cancel), methods=["POST"]),
        Route(f"{at}/tasks/{{job_id}}/retry", console.action(console.retry), methods=["POST"]),
        Route(f"{at}/bulk/confirm", console.action(console.bulk_confirm), methods=["POST"]),
        Route(f"{at}/bulk", console.action(console.bulk), methods=["POST"]),
        Route(f"{at}/limits", console.page(console.limits), methods=["GET"]),
        Route(f"{at}/limits", console.action(console.set_limits), methods=["POST"]),
        Route(f"{at}/limits/tool", console.action(console.set_tool_limit), methods=["POST"]),
        Route(f"{at}/audit", console.page(console.audit), methods=["GET"]),
        Route(f"{at}/static/{{name}}", console.static, methods=["GET"]),
    ]
