"""The console's second slice on a live stack (the fixtures of ``test_console``: API + prefork
worker, real Postgres and Redis, Debian's Chromium through Playwright): retry as a new task, bulk
cancel and retry by the list's filter after a dry-run count, and the CSRF refusals of each."""

from __future__ import annotations

import re
import time
import uuid
from datetime import datetime
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e.test_console import ADMIN_TOKEN, _admin_http, _csrf, _job_of, _row, browser, console, page
from tests.support import wait_until

__all__ = ["browser", "console", "page"]  # the fixtures, for pytest

pytestmark = pytest.mark.timeout(240)


def _now(console: dict[str, Any]) -> datetime:
    with psycopg.connect(console["dsn"]) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _retries_of(console: dict[str, Any], job_id: str) -> list[dict[str, Any]]:
    from psycopg.rows import dict_row

    with psycopg.connect(console["dsn"], row_factory=dict_row) as conn:
        found = conn.execute(
            "SELECT * FROM mcp_tasks WHERE client_info->>'retryOf' = %s ORDER BY created_at", (job_id,)
        )
        return found.fetchall()


def _actions(console: dict[str, Any], since: datetime) -> list[tuple[Any, ...]]:
    with psycopg.connect(console["dsn"]) as conn:
        found = conn.execute(
            "SELECT actor, action, target, affected, detail FROM mcp_console_actions "
            "WHERE acted_at >= %s ORDER BY id",
            (since,),
        )
        return found.fetchall()


def _failed(console: dict[str, Any], text: str) -> str:
    job = _job_of(console, console["alice"].start("con_fail", {"text": text}))
    wait_until(lambda: _row(console, job)["status"] == "failed", 30, 0.05, what="the job to fail")
    return job


def test_an_admin_retries_a_failed_task_as_a_new_task_of_the_same_principal(
    page: Any, console: dict[str, Any]
) -> None:
    since = _now(console)
    job = _failed(console, "broken once")
    page.goto(f"/console/tasks/{job}")
    page.click("#retry button[type=submit]")
    page.wait_for_url(re.compile(r".*/console/tasks/(?!" + job + r")[0-9a-f-]{36}$"))
    new_job = page.inner_text("#job")
    (retried,) = _retries_of(console, job)
    original = _row(console, job)
    assert retried["job_id"] == new_job
    assert (retried["owner"], retried["tool_name"], retried["arguments"]) == (
        original["owner"],
        original["tool_name"],
        original["arguments"],
    )
    assert retried["client_info"] == {"name": "mcp-celery-tasks console", "retryOf": job, "by": "admin:ops"}
    assert retried["task_id"] != original["task_id"]
    # It ran (and failed again, as the tool does), and its page says whose retry it is.
    wait_until(lambda: _row(console, new_job)["status"] == "failed", 30, 0.05, what="the retry to run")
    assert "retryOf" in page.inner_text("#fields")
    # Retrying the same job again finds that retry: the tool does not run a third time.
    page.goto(f"/console/tasks/{job}")
    page.click("#retry button[type=submit]")
    page.wait_for_url(f"**/console/tasks/{new_job}")
    assert len(_retries_of(console, job)) == 1
    audited = _actions(console, since)
    assert [(a[0], a[1], a[2], a[3], a[4]["outcome"]) for a in audited] == [
        ("admin:ops", "retry", job, 1, "created"),
        ("admin:ops", "retry", job, 0, "already"),
    ]
    assert audited[0][4]["new_job"] == new_job


def test_only_a_finished_failure_is_retried(console: dict[str, Any]) -> None:
    http = _admin_http(console)
    gate = console["gates"] / f"gate-{uuid.uuid4().hex[:6]}"
    job = _job_of(console, console["alice"].start("con_hold", {"text": "busy", "gate": str(gate)}))
    shown = http.get(f"/console/tasks/{job}")
    assert 'id="retry"' not in shown.text
    refused = http.post(f"/console/tasks/{job}/retry", data={"csrf": _csrf(http, f"/console/tasks/{job}")})
    assert refused.status_code == 409, refused.text
    gate.touch()
    wait_until(lambda: _row(console, job)["status"] == "completed", 30, 0.05, what="the job to end")
    done = http.post(f"/console/tasks/{job}/retry", data={"csrf": _csrf(http, f"/console/tasks/{job}")})
    assert done.status_code == 409  # completed without an error: nothing to retry
    assert _retries_of(console, job) == []
    http.close()


def test_an_admin_bulk_retries_a_filter_after_the_dry_run_count(page: Any, console: dict[str, Any]) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    since = _now(console)
    jobs = [_failed(console, f"bulk {n}") for n in range(3)]
    page.goto(f"/console/tasks?status=failed&tool=con_fail&since={since.isoformat().replace('+', '%2B')}")
    assert sorted(
        page.locator("#tasks tbody tr").evaluate_all("rows => rows.map(r => r.dataset.job)")
    ) == sorted(jobs)
    page.click("#bulk-retry button[type=submit]")
    expect(page.locator("#bulk-count")).to_have_text("3 tasks match; retry them?")
    assert _actions(console, since) == []  # the dry run changed nothing
    page.click("#bulk-act button[type=submit]")
    expect(page.locator("#bulk-result")).to_have_text("3 of 3 retried as new tasks.")
    for job in jobs:
        (retried,) = _retries_of(console, job)
        assert retried["client_info"]["by"] == "admin:ops" and retried["owner"] == "token:alice"
    ((actor, action, target, affected, detail),) = _actions(console, since)
    assert (actor, action, affected) == ("admin:ops", "bulk retry", 3)
    assert target.startswith("filter status=failed&tool=con_fail&since=")
    assert detail["confirmed"] == 3 and detail["matched"] == 3
    page.goto("/console/audit")
    row = page.locator("#actions tbody tr").first.locator("td").all_inner_texts()
    assert row[1:5] == ["admin:ops", "bulk retry", target, "3"]


def test_bulk_retry_acts_on_no_more_than_the_count_confirmed(console: dict[str, Any]) -> None:
    since = _now(console)
    jobs = [_failed(console, f"bounded {n}") for n in range(3)]
    http = _admin_http(console)
    form = {"action": "retry", "tool": "con_fail", "since": since.isoformat(), "count": "2"}
    done = http.post("/console/bulk", data={**form, "csrf": _csrf(http, "/console/tasks")})
    assert done.status_code == 200, done.text
    assert [len(_retries_of(console, job)) for job in jobs] == [0, 1, 1]  # the newest two
    ((_, _, _, affected, detail),) = _actions(console, since)
    assert affected == 2 and detail["confirmed"] == 2
    http.close()


def test_an_admin_bulk_cancels_a_filter(page: Any, console: dict[str, Any]) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    since = _now(console)
    gate = console["gates"] / "never"
    jobs = [
        _job_of(console, console["alice"].start("con_hold", {"text": "hold", "gate": str(gate)}))
        for _ in range(2)
    ]
    page.goto(f"/console/tasks?tool=con_hold&since={since.isoformat().replace('+', '%2B')}")
    page.click("#bulk-cancel button[type=submit]")
    expect(page.locator("#bulk-count")).to_have_text("2 tasks match; cancel them?")
    page.fill("#bulk-act input[name=reason]", "drain")
    page.click("#bulk-act button[type=submit]")
    expect(page.locator("#bulk-result")).to_have_text("2 of 2 cancelled.")
    for job in jobs:
        row = _row(console, job)
        assert row["status"] == "cancelled" and "drain (admin:ops)" in row["status_message"]
    ((_, action, _, affected, _),) = _actions(console, since)
    assert (action, affected) == ("bulk cancel", 2)


def test_every_new_action_refuses_a_post_without_the_csrf_token(console: dict[str, Any]) -> None:
    since = _now(console)
    job = _failed(console, "csrf")
    http = _admin_http(console)
    bulk = {"action": "retry", "tool": "con_fail", "since": since.isoformat(), "count": "5"}
    tool = {"op": "set", "tool": "con_limited", "concurrency": "0"}
    posts = [
        (f"/console/tasks/{job}/retry", {}),
        ("/console/bulk/confirm", bulk),
        ("/console/bulk", bulk),
        ("/console/limits/tool", tool),
    ]
    for path, form in posts:
        for csrf in ({}, {"csrf": "forged"}):
            refused = http.post(path, data={**form, **csrf})
            assert refused.status_code == 403, (path, refused.text)
        tool_caller = httpx.post(
            console["base"] + path,
            data=form,
            headers={"Authorization": "Bearer alice-tool-token"},
            timeout=10,
        )
        assert tool_caller.status_code == 403
    assert _retries_of(console, job) == [] and _actions(console, since) == []
    with psycopg.connect(console["dsn"]) as conn:
        assert conn.execute("SELECT count(*) FROM mcp_tool_limits").fetchone() == (0,)
    http.close()


def test_an_admin_pauses_a_tool_and_sees_the_audit_row_then_clears_it(
    page: Any, console: dict[str, Any]
) -> None:
    since = _now(console)
    page.goto("/console/limits")
    page.fill("#set-tool-limit input[name=tool]", "con_limited")
    page.fill("#set-tool-limit input[name=concurrency]", "0")
    page.fill("#set-tool-limit input[name=note]", "<b>maintenance</b>")
    page.click("#set-tool-limit button[type=submit]")
    page.wait_for_url("**/console/limits")
    row = page.locator("#tool-limits-table tbody tr", has_text="con_limited")
    assert row.locator("td").all_inner_texts()[:4] == ["con_limited", "(all)", "0", "<b>maintenance</b>"]
    # Paused: a new job of the tool waits in the backlog, and the page's groups say so.
    job = _job_of(console, console["alice"].start("con_limited", {"text": "held back"}))
    time.sleep(1.5)  # unpaused, the release pass hands it to the broker within milliseconds
    assert _row(console, job)["dispatched_at"] is None
    page.goto("/console/limits")
    group = (
        page.locator("#tool-groups-table tbody tr", has_text="con_limited").locator("td").all_inner_texts()
    )
    assert group[2:] == ["0", "1", "2", "0"]  # in flight, waiting, declared, in force
    page.goto("/console/audit")
    fields = {
        cells[3]: cells[5]
        for cells in (
            r.locator("td").all_inner_texts()
            for r in page.locator("#limits tbody tr", has_text="tool con_limited").all()
        )
    }
    assert fields == {"concurrency": "0", "note": "<b>maintenance</b>"}
    changes = page.locator("#limits tbody tr", has_text="tool con_limited").all()
    assert all(r.locator("td").nth(1).inner_text().startswith("admin:ops") for r in changes)
    action = page.locator("#actions tbody tr").first.locator("td").all_inner_texts()
    assert action[1:5] == ["admin:ops", "set tool limit", "tool con_limited", "1"]
    # Cleared: back to its declared two at once, and the held job runs.
    page.goto("/console/limits")
    page.click("#tool-limits-table tbody tr:has-text('con_limited') button")
    page.wait_for_url("**/console/limits")
    assert page.locator("#tool-limits-table tbody tr", has_text="con_limited").count() == 0
    wait_until(lambda: _row(console, job)["status"] == "completed", 30, 0.05, what="the held job to run")
    assert [(a[1], a[2], a[3]) for a in _actions(console, since)] == [
        ("set tool limit", "tool con_limited", 1),
        ("clear tool limit", "tool con_limited", 1),
    ]


def test_the_overview_lists_the_live_workers_with_the_jobs_on_them(
    page: Any, console: dict[str, Any]
) -> None:
    gate = console["gates"] / f"gate-{uuid.uuid4().hex[:6]}"
    job = _job_of(console, console["alice"].start("con_hold", {"text": "on a worker", "gate": str(gate)}))
    wait_until(lambda: _row(console, job)["worker"], 30, 0.05, what="the job to be claimed")
    host, pid = str(_row(console, job)["worker"]).split(":")[:2]
    with psycopg.connect(console["dsn"]) as conn:
        registered = conn.execute(
            "SELECT node, queues, slots FROM mcp_workers WHERE kind = 'worker' AND hostname = %s"
            " AND (pid = %s OR %s = ANY(pids)) AND expires_at > now()",
            (host, int(pid), int(pid)),
        ).fetchone()
    assert registered is not None
    node, queues, slots = registered
    page.goto("/console/")
    row = page.locator(f'#workers tbody tr[data-node="{node}"]')
    cells = row.locator("td").all_inner_texts()
    assert cells[:4] == [node, "worker", ", ".join(queues), str(slots)]
    assert "con_hold working" in cells[5]
    assert row.locator(f'a[href="/console/tasks/{job}"]').count() == 1
    assert re.fullmatch(r"\d+\.\d s ago", cells[6])
    gate.touch()
    wait_until(lambda: _row(console, job)["status"] == "completed", 30, 0.05, what="the job to end")
    page.goto("/console/")
    assert page.locator(f'#workers tbody tr[data-node="{node}"] a[href="/console/tasks/{job}"]').count() == 0


def test_a_new_task_appears_on_an_open_list_without_a_reload(page: Any, console: dict[str, Any]) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    gate = console["gates"] / f"gate-{uuid.uuid4().hex[:6]}"
    since = _now(console)
    page.goto(f"/console/tasks?tool=con_hold&since={since.isoformat().replace('+', '%2B')}")
    expect(page.locator("#tasks td.empty")).to_have_count(1)
    page.evaluate("window.notReloaded = true")
    # Created through this API: its create wakes the open list at once.
    started = time.monotonic()
    job = _job_of(console, console["alice"].start("con_hold", {"text": "fresh", "gate": str(gate)}))
    row = page.locator(f'#tasks tr[data-job="{job}"]')
    expect(row).to_have_count(1, timeout=3_000)
    print(f"create to the row on the open list: {time.monotonic() - started:.3f} s")
    assert row.locator("td").all_inner_texts()[2:5] == [
        "con_hold",
        "token:alice",
        _row(console, job)["queue"],
    ]
    assert page.locator("#tasks td.empty").count() == 0
    # Followed like the rows shown: its end reaches the page too.
    gate.touch()
    expect(row.locator("[data-row-live=status]")).to_have_text("completed", timeout=5_000)
    # A principal's name with markup lands as text; a task of another filter stays off the list.
    mallory = _job_of(console, console["mallory"].start("con_hold", {"text": "x"}))
    other = _job_of(console, console["alice"].start("con_fail", {"text": "not listed"}))
    expect(page.locator(f'#tasks tr[data-job="{mallory}"] td').nth(3)).to_have_text(
        "token:<b id=pwned-name>mallory</b>", timeout=3_000
    )
    assert page.locator("#pwned-name").count() == 0
    assert page.locator(f'#tasks tr[data-job="{other}"]').count() == 0
    # Created elsewhere (another replica, whose create this process never sees): it shows with
    # the next NOTIFY of any task.
    elsewhere = str(uuid.uuid4())  # never the copied job's own id (its first digit may be "e")
    with psycopg.connect(console["dsn"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO mcp_tasks (task_id, job_id, owner, tool_name, arguments, status, retention_ms,"
            " poll_interval_ms, queue, max_attempts, protocol_version, client_capabilities)"
            " SELECT 'elsewhere-' || job_id, %s, owner, tool_name, arguments,"
            " 'completed', retention_ms, poll_interval_ms, queue, max_attempts, protocol_version,"
            " client_capabilities FROM mcp_tasks WHERE job_id = %s",
            (elsewhere, job),
        )
        time.sleep(0.5)
        assert page.locator(f'#tasks tr[data-job="{elsewhere}"]').count() == 0  # no signal yet
        conn.execute("SELECT pg_notify('mcp_task_events', 'some-other-task')")
    expect(page.locator(f'#tasks tr[data-job="{elsewhere}"]')).to_have_count(1, timeout=3_000)
    assert page.evaluate("window.notReloaded") is True
    assert [r.get_attribute("data-job") for r in page.locator("#tasks tbody tr").all()][:2] == [
        elsewhere,
        mallory,
    ]


def test_the_list_sorts_oldest_first_and_pages_on(console: dict[str, Any]) -> None:
    since = _now(console)
    jobs = [_failed(console, f"ordered {n}") for n in range(3)]
    http = _admin_http(console)
    path: str | None = f"/console/tasks?tool=con_fail&order=oldest&limit=2&since={since.isoformat()}"
    seen: list[str] = []
    while path is not None:
        shown = http.get(path.replace("+", "%2B"))
        assert shown.status_code == 200, shown.text
        seen += re.findall(r'<tr data-job="([^"]+)">', shown.text)
        later = re.search(r'id="older" href="([^"]+)">later', shown.text)
        path = later.group(1).replace("&amp;", "&") if later else None
    assert seen == jobs
    assert http.get("/console/tasks?order=sideways").status_code == 400
    http.close()


def _sign_in(http: httpx.Client, token: str) -> httpx.Response:
    form = http.get("/console/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert nonce is not None
    return http.post("/console/login", data={"csrf": nonce.group(1), "token": token, "next": "/console/"})


def test_ten_failed_sign_ins_from_an_address_hold_it_back_for_a_minute(console: dict[str, Any]) -> None:
    # From 127.0.0.2 (the loopback is all of 127/8): the module's other tests sign in from 127.0.0.1.
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=console["base"], transport=transport, timeout=30) as guesser:
        for n in range(10):
            assert _sign_in(guesser, f"guess-{n}").status_code == 401
        held = _sign_in(guesser, ADMIN_TOKEN)  # the right token too: no guess is checked now
        assert held.status_code == 429 and "too many failed sign-ins" in held.text
        assert "mcp_console=" not in held.headers.get("set-cookie", "")
        bearer = guesser.get("/console/tasks", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert bearer.status_code == 429
    # Another address signs in as before.
    with httpx.Client(base_url=console["base"], timeout=30) as admin:
        assert _sign_in(admin, ADMIN_TOKEN).status_code == 303


def test_a_bulk_retry_obeys_the_principals_rate_and_counts_what_it_refused(console: dict[str, Any]) -> None:
    from mcp_celery_tasks.tasks.quotas import OVERRIDES_TTL_S

    since = _now(console)
    mallory = console["mallory"]
    jobs = [_job_of(console, mallory.start("con_fail", {"text": f"rate {n}"})) for n in range(3)]
    wait_until(
        lambda: all(_row(console, job)["status"] == "failed" for job in jobs), 30, 0.05, what="failures"
    )
    owner = _row(console, jobs[0])["owner"]
    http = _admin_http(console)
    csrf = _csrf(http, "/console/limits")
    # One create now, then one every 1000 s: the retries go through the same quotas as any create.
    limits = {"csrf": csrf, "principal": owner, "creates_per_second": "0.001", "create_burst": "1"}
    assert http.post("/console/limits", data=limits).status_code == 303
    time.sleep(OVERRIDES_TTL_S + 0.5)  # the API re-reads overrides this often
    form = {"action": "retry", "owner": owner, "since": since.isoformat(), "count": "3", "csrf": csrf}
    done = http.post("/console/bulk", data=form)
    assert done.status_code == 200, done.text
    assert sum(len(_retries_of(console, job)) for job in jobs) == 1
    bulk = [a for a in _actions(console, since) if a[1] == "bulk retry"]
    ((_, _, _, affected, detail),) = bulk
    assert affected == 1 and detail["refused_by_quota"] == 2 and detail["already_retried"] == 0
    assert "Too many tasks created" in detail["reasons"][0]
    with psycopg.connect(console["dsn"], autocommit=True) as conn:
        conn.execute("DELETE FROM mcp_principal_limits WHERE principal = %s", (owner,))
    http.close()
