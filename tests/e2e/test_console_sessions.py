"""Server-side console sign-outs on a live stack: two API replicas over one Postgres (no worker:
these pages need none), Debian's Chromium through Playwright, plain HTTP for a replayed cookie,
and ``mcp-celery-tasks tasks console revoke`` run as a subprocess against the same database.

A revocation takes effect on the other replica through its event hub (the revoking statement's
NOTIFY), within about a second, with no query per page view."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from tests import support
from tests.e2e.test_console import ADMIN_TOKEN, browser
from tests.support import wait_until

__all__ = ["browser"]  # the fixture, for pytest

pytestmark = pytest.mark.timeout(240)

OTHER_TOKEN = "console-other-admin-token-" + "y" * 16


@pytest.fixture(scope="module")
def replicas(template_db: str) -> Iterator[dict[str, Any]]:
    name = f"mcpt_consess_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    dsn = support.create_database(name, template=template_db)
    admins = {
        "ops": hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest(),
        "other": hashlib.sha256(OTHER_TOKEN.encode()).hexdigest(),
    }
    env = support.stack_env(
        dsn,
        support.REDIS_URL,
        f"s{uuid.uuid4().hex[:6]}",
        MCP_TASKS_CONSOLE_ENABLED="true",
        MCP_TASKS_CONSOLE_ADMIN_TOKENS=json.dumps(admins),
    )
    started: list[support.Proc] = []
    try:
        bases = []
        for n in (1, 2):
            api, url = support.start_api(f"console-sessions-api{n}", env)
            started.append(api)
            bases.append(url.removesuffix("/mcp"))
        yield {"bases": bases, "dsn": dsn, "env": env}
    finally:
        for api in started:
            api.stop()
        support.drop_database(name)


def _sign_in(base: str, token: str = ADMIN_TOKEN) -> httpx.Client:
    http = httpx.Client(base_url=base, timeout=30)
    form = http.get("/console/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert nonce is not None
    signed = http.post("/console/login", data={"csrf": nonce.group(1), "token": token, "next": "/console/"})
    assert signed.status_code == 303, signed.text
    return http


def _csrf(http: httpx.Client, path: str = "/console/tasks") -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', http.get(path).text)
    assert found is not None
    return found.group(1)


def _with_cookie(base: str, cookie: str) -> httpx.Client:
    """Another client presenting a copied session cookie (a stolen laptop's browser)."""
    return httpx.Client(base_url=base, timeout=30, cookies={"mcp_console": cookie})


def _signed_in(http: httpx.Client) -> bool:
    return http.get("/console/tasks").status_code == 200


def _audit(dsn: str, action: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT actor, action, target, affected, detail FROM mcp_console_actions WHERE action = %s "
            "ORDER BY id",
            (action,),
        )
        return found.fetchall()


def _cli(replicas: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**replicas["env"], "MCP_TASKS_ADMIN_NAME": "oncall"}
    return subprocess.run(
        [sys.executable, "-m", "mcp_celery_tasks.cli", "tasks", "console", *args],
        env=env,
        cwd=support.ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_cookie_replayed_after_sign_out_is_refused_on_every_replica(replicas: dict[str, Any]) -> None:
    first, second = replicas["bases"]
    http = _sign_in(first)
    cookie = http.cookies["mcp_console"]
    copy = _with_cookie(second, cookie)
    assert _signed_in(copy)  # one signed cookie opens every replica
    out = http.post("/console/logout", data={"csrf": _csrf(http)})
    assert out.status_code == 303 and out.headers["location"] == "/console/login"
    # The copy, on the other replica, is refused within about a second: page and POST.
    started = time.monotonic()
    wait_until(lambda: not _signed_in(copy), 3, 0.02, what="the other replica to refuse the cookie")
    print(f"sign-out seen by the other replica after {1000 * (time.monotonic() - started):.0f} ms")
    refused = copy.get("/console/tasks")
    assert refused.status_code == 303 and "/console/login" in refused.headers["location"]
    posted = copy.post("/console/bulk/confirm", data={"csrf": "x", "action": "cancel"})
    assert posted.status_code == 401
    replay = _with_cookie(first, cookie)
    assert replay.get("/console/tasks").status_code == 303
    ((actor, _, target, affected, _),) = _audit(replicas["dsn"], "sign out")
    assert actor == "admin:ops" and target.startswith("session ") and affected == 1
    # Signing in again makes a new session, which works.
    assert _signed_in(_sign_in(second))
    for client in (http, copy, replay):
        client.close()


def test_signing_out_everywhere_refuses_the_other_browser_on_its_next_page_and_post(
    browser: Any, replicas: dict[str, Any]
) -> None:
    first, second = replicas["bases"]
    contexts = [browser.new_context(base_url=base) for base in (first, second)]
    laptop, desk = [context.new_page() for context in contexts]
    for tab in (laptop, desk):
        tab.goto("/console/tasks")
        tab.fill("input[name=token]", ADMIN_TOKEN)
        tab.click("button[type=submit]")
        tab.wait_for_url("**/console/tasks")
    other = _sign_in(first, OTHER_TOKEN)  # another admin's session is not touched
    desk.goto("/console/limits")  # a form loaded before the revocation, posted after it
    desk.click("#sign-out-everywhere")
    desk.wait_for_url("**/console/login")
    # The laptop (the other replica): its next POST is refused and changes nothing ...
    wait_until(
        lambda: laptop.request.get("/console/tasks", max_redirects=0).status == 303,
        3,
        0.02,
        what="the laptop's session to be refused",
    )
    laptop.click("#bulk-cancel button[type=submit]")  # the list's bulk cancel form (a POST)
    assert "sign in" in laptop.inner_text("main").lower()
    # ... and its next page is the sign-in form.
    laptop.goto("/console/audit")
    assert "/console/login" in laptop.url
    assert _signed_in(other)
    ((actor, _, target, _, detail),) = _audit(replicas["dsn"], "revoke sessions")
    assert (actor, target, detail) == ("admin:ops", "admin:ops", {"from": "console"})
    # Sign in again: a session issued after the revocation stands.
    laptop.fill("input[name=token]", ADMIN_TOKEN)
    laptop.click("button[type=submit]")
    laptop.wait_for_url("**/console/audit")
    assert "revoke sessions" in laptop.inner_text("main")
    other.close()
    for context in contexts:
        context.close()


def test_the_cli_revokes_an_admins_sessions_on_a_running_api(replicas: dict[str, Any]) -> None:
    first, second = replicas["bases"]
    ops = [_sign_in(first), _sign_in(second)]
    other = _sign_in(second, OTHER_TOKEN)
    done = _cli(replicas, "revoke", "ops", "--reason", "laptop lost <b>")
    assert done.returncode == 0, done.stderr
    assert "revoked every console session of admin:ops" in done.stdout
    started = time.monotonic()
    wait_until(lambda: not any(_signed_in(http) for http in ops), 3, 0.02, what="both to refuse it")
    print(f"CLI revocation in force on both replicas after {1000 * (time.monotonic() - started):.0f} ms")
    assert _signed_in(other)
    audited = [row for row in _audit(replicas["dsn"], "revoke sessions") if row[0] == "cli:oncall"]
    assert audited[-1][2:] == ("admin:ops", 1, {"from": "cli", "reason": "laptop lost <b>"})
    listed = _cli(replicas, "revocations", "--json")
    assert "admin:ops" in [row["subject"] for row in json.loads(listed.stdout)]
    # --all: every admin, the other one too.
    assert _cli(replicas, "revoke", "--all").returncode == 0
    wait_until(lambda: not _signed_in(other), 3, 0.02, what="every admin's sessions to be refused")
    assert _audit(replicas["dsn"], "revoke sessions")[-1][2] == "every admin"
    assert _signed_in(_sign_in(first, OTHER_TOKEN))  # a new session after it stands
    for http in [*ops, other]:
        http.close()


@pytest.mark.parametrize("args", [["revoke"], ["revoke", "ops", "--all"], ["revoke", "bad\x1b]0;name\x07"]])
def test_the_cli_refuses_a_revocation_it_cannot_name(replicas: dict[str, Any], args: list[str]) -> None:
    done = _cli(replicas, *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "\x1b" not in done.stderr


# ---- the sign-in limit's client address ---------------------------------------------------------


def _failed_sign_ins(base: str, local: str, forwarded: list[str]) -> list[int]:
    """One wrong token per entry of ``forwarded``, each claiming that X-Forwarded-For."""
    transport = httpx.HTTPTransport(local_address=local)
    codes = []
    with httpx.Client(base_url=base, transport=transport, timeout=30) as http:
        for n, claimed in enumerate(forwarded):
            form = http.get("/console/login")
            nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert nonce is not None
            data = {"csrf": nonce.group(1), "token": f"guess-{n}"}
            codes.append(
                http.post("/console/login", data=data, headers={"X-Forwarded-For": claimed}).status_code
            )
    return codes


def test_a_loopback_client_cannot_pick_its_address_for_the_sign_in_limit(replicas: dict[str, Any]) -> None:
    # No trusted proxy: the header is the client's own words, whatever address it connects from
    # (uvicorn's proxy-header middleware believed it from 127.0.0.1 and ::1).
    codes = _failed_sign_ins(replicas["bases"][0], "127.0.0.3", [f"203.0.113.{n}" for n in range(11)])
    assert codes == [401] * 10 + [429]


def test_behind_a_trusted_proxy_the_limit_holds_back_the_forwarded_client_alone(
    replicas: dict[str, Any],
) -> None:
    env = {**replicas["env"], "MCP_TASKS_TRUSTED_PROXIES": '["127.0.0.4"]'}
    api, url = support.start_api("console-sessions-proxied", env)
    try:
        base = url.removesuffix("/mcp")
        # Through the proxy: ten failures of one client (a spoofed entry on its left is skipped).
        assert _failed_sign_ins(base, "127.0.0.4", ["10.1.1.1, 198.51.100.7"] * 11) == [401] * 10 + [429]
        # Another client behind the same proxy is not held back.
        assert _failed_sign_ins(base, "127.0.0.4", ["198.51.100.8"]) == [401]
        # A peer that is no trusted proxy is counted by its own address, its header ignored.
        held = _failed_sign_ins(base, "127.0.0.5", [f"198.51.100.{n}" for n in range(20, 31)])
        assert held == [401] * 10 + [429]
    finally:
        api.stop()


# ---- the live list's new rows -------------------------------------------------------------------


def test_a_first_page_that_shows_rows_still_gets_new_ones_live(replicas: dict[str, Any]) -> None:
    # The followed rows once went in the live URL as job=, the list's own job filter: the new
    # rows were then filtered down to one shown job, and no new task ever appeared.
    base = replicas["bases"][0]
    client = support.Client(base + "/mcp")
    for n in range(3):
        client.start("slow_compute", {"seconds": 0, "label": f"shown {n}"})  # no worker: they wait
    with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        page = http.get("/console/tasks")
        found = re.search(r'data-list-live="([^"]+)"', page.text)
        assert found is not None and "row=" in found.group(1), page.text[:500]
        with http.stream("GET", found.group(1).replace("&amp;", "&")) as stream:
            lines = stream.iter_lines()
            while next(lines) != "event: row":  # the shown rows' states come first
                pass
            fresh = client.start("slow_compute", {"seconds": 0, "label": "fresh"})
            with psycopg.connect(replicas["dsn"]) as conn:
                row: Any = conn.execute(
                    "SELECT job_id FROM mcp_tasks WHERE task_id = %s", (fresh,)
                ).fetchone()
            deadline = time.monotonic() + 10
            event = ""
            for line in lines:
                assert time.monotonic() < deadline, "the new task never reached the open list"
                if line.startswith("event: "):
                    event = line[7:]
                elif event == "new" and line.startswith("data: ") and json.loads(line[6:])["job"] == row[0]:
                    break
    client.close()


# ---- the audit's retention, through the beat job a maintenance worker runs ----------------------


def test_the_maintenance_workers_collector_drops_the_audit_past_its_retention(
    replicas: dict[str, Any],
) -> None:
    from mcp_celery_tasks.broker.celery_app import COLLECT_GARBAGE, create_app
    from mcp_celery_tasks.settings import Settings

    env = {**replicas["env"], "MCP_TASKS_CONSOLE_AUDIT_RETENTION_SECONDS": "3600"}
    mark = f"retention-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(replicas["dsn"], autocommit=True) as conn:
        for age in ("2 hours", "3 days", "10 minutes"):
            conn.execute(
                "INSERT INTO mcp_console_actions (acted_at, actor, action, target, affected) "
                "VALUES (now() - %s::interval, 'admin:ops', 'cancel', %s, 1)",
                (age, f"{mark} {age}"),
            )
    worker = support.start_worker("console-sessions-maintenance", env)
    try:
        settings = Settings(
            database_url=replicas["dsn"],
            broker_url=env["MCP_TASKS_BROKER_URL"],
            maintenance_queue=env["MCP_TASKS_MAINTENANCE_QUEUE"],
        )
        create_app(settings).send_task(COLLECT_GARBAGE, queue=env["MCP_TASKS_MAINTENANCE_QUEUE"])

        def left() -> list[str] | None:
            with psycopg.connect(replicas["dsn"]) as conn:
                rows = conn.execute(
                    "SELECT target FROM mcp_console_actions WHERE target LIKE %s ORDER BY id", (f"{mark}%",)
                ).fetchall()
            return [row[0] for row in rows] if len(rows) < 3 else None

        assert wait_until(left, 60, 0.2, what="the collector to run") == [f"{mark} 10 minutes"]
    finally:
        worker.stop()


def test_signing_out_everywhere_without_the_forms_csrf_token_revokes_nothing(
    replicas: dict[str, Any],
) -> None:
    http = _sign_in(replicas["bases"][0])
    before = len(_audit(replicas["dsn"], "revoke sessions"))
    for form in ({}, {"csrf": "forged"}, {"csrf": "x" * 20_000}):
        refused = http.post("/console/logout/everywhere", data=form)
        assert refused.status_code in (403, 413) and "Traceback" not in refused.text
    assert len(_audit(replicas["dsn"], "revoke sessions")) == before
    assert _signed_in(http)
    http.close()
