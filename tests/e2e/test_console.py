"""The admins' web console on a live stack (API + prefork worker, real Postgres and Redis),
used through Debian's Chromium driven by Playwright, and through plain HTTP for what a browser
would not send (a POST without its CSRF token, a tool caller's bearer token).

Playwright drives ``/usr/bin/chromium`` itself (``executable_path``): no browser download.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import support
from tests.support import Client, wait_until

CHROMIUM = "/usr/bin/chromium"
ADMIN_TOKEN = "console-admin-token-" + "x" * 20
ALICE_TOKEN = "alice-tool-token"
XSS_TOKEN = "xss-tool-token"
PAYLOAD = "<img src=x id=pwned onerror=alert(1)><script>alert(2)</script>\x1b]0;owned\x07"
XSS_NAME = "<b id=pwned-name>mallory</b>"
SHOWN = "<img src=x id=pwned onerror=alert(1)><script>alert(2)</script>"
"""What the page shows of PAYLOAD: the markup as text, the terminal escape dropped."""

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def console(template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    name = f"mcpt_console_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    dsn = support.create_database(name, template=template_db)
    suffix = f"c{uuid.uuid4().hex[:6]}"
    env = support.stack_env(
        dsn,
        support.REDIS_URL,
        suffix,
        MCP_TASKS_TOOL_MODULES=json.dumps(
            ["tests.fixtures.conformance", "tests.fixtures.console", "tests.fixtures.artifacts"]
        ),
        MCP_TASKS_CONSOLE_ENABLED="true",
        MCP_TASKS_CONSOLE_ADMIN_TOKENS=json.dumps({"ops": hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()}),
        MCP_TASKS_AUTH_TOKENS=json.dumps({"alice": ALICE_TOKEN, XSS_NAME: XSS_TOKEN}),
    )
    worker = support.start_worker("console-worker", env)
    api: support.Proc | None = None
    try:
        api, url = support.start_api("console-api", env)
        alice = Client(url, token=ALICE_TOKEN)
        wait_until(
            lambda: alice.call_tool("greet", {"name": "ready"}, extension=False).status == 200,
            60,
            0.2,
            what="the worker to run a job",
        )
        yield {
            "url": url,
            "base": url.removesuffix("/mcp"),
            "dsn": dsn,
            "alice": alice,
            "mallory": Client(url, token=XSS_TOKEN),
            "gates": tmp_path_factory.mktemp("gates"),
        }
        alice.close()
    finally:
        if api is not None:
            api.stop()
        worker.stop(signal.SIGQUIT, timeout=20)
        support.drop_database(name)


def _job_of(console: dict[str, Any], task_id: str) -> str:
    import psycopg

    with psycopg.connect(console["dsn"]) as conn:
        row = conn.execute("SELECT job_id FROM mcp_tasks WHERE task_id = %s", (task_id,)).fetchone()
    assert row is not None
    return str(row[0])


def _row(console: dict[str, Any], job_id: str) -> dict[str, Any]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(console["dsn"], row_factory=dict_row) as conn:
        row = conn.execute("SELECT * FROM mcp_tasks WHERE job_id = %s", (job_id,)).fetchone()
    assert row is not None
    return row


def _finished(console: dict[str, Any], job_id: str) -> bool:
    return _row(console, job_id)["finished_at"] is not None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, console: dict[str, Any]) -> Iterator[Any]:
    """A signed-in admin's tab; every dialog (an ``alert`` an injection would open) is recorded."""
    context = browser.new_context(base_url=console["base"])
    tab = context.new_page()
    tab.dialogs = []
    tab.on("dialog", lambda dialog: (tab.dialogs.append(dialog.message), dialog.dismiss()))
    tab.goto("/console/tasks")
    assert tab.url.endswith("/console/login?next=/console/tasks")
    tab.fill("input[name=token]", ADMIN_TOKEN)
    tab.click("button[type=submit]")
    tab.wait_for_url("**/console/tasks")
    yield tab
    assert tab.dialogs == []
    context.close()


def _admin_http(console: dict[str, Any]) -> httpx.Client:
    """A signed-in admin's session over plain HTTP (its cookie), and the page's CSRF token."""
    http = httpx.Client(base_url=console["base"], timeout=30)
    form = http.get("/console/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert nonce is not None
    signed = http.post(
        "/console/login", data={"csrf": nonce.group(1), "token": ADMIN_TOKEN, "next": "/console/"}
    )
    assert signed.status_code == 303, signed.text
    return http


def _csrf(http: httpx.Client, path: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', http.get(path).text)
    assert found is not None
    return found.group(1)


# ---- security --------------------------------------------------------------------------------


def test_console_pages_carry_a_strict_policy_and_need_an_admin(console: dict[str, Any]) -> None:
    anonymous = httpx.get(console["base"] + "/console/tasks", timeout=10)
    assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/console/login")
    page = httpx.get(console["base"] + "/console/login", timeout=10)
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert page.headers["x-frame-options"] == "DENY"
    assert "<script>" not in page.text and 'src="/console/static/console.js"' in page.text
    cookie = page.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie


def test_a_tool_callers_token_is_refused_by_the_console(console: dict[str, Any]) -> None:
    task_id = console["alice"].start("con_hold", {"text": "held", "gate": str(console["gates"] / "never")})
    job = _job_of(console, task_id)
    http = httpx.Client(base_url=console["base"], timeout=30)
    for path in (f"/console/tasks/{job}", "/console/"):
        refused = http.get(path, headers={"Authorization": f"Bearer {ALICE_TOKEN}"})
        assert refused.status_code == 403, refused.text
        assert "held" not in refused.text
    cancel = http.post(f"/console/tasks/{job}/cancel", headers={"Authorization": f"Bearer {ALICE_TOKEN}"})
    assert cancel.status_code == 403
    # On the login form too: a tool caller's token is recognised and refused, not taken for an admin's.
    form = http.get("/console/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert nonce is not None
    login = http.post("/console/login", data={"csrf": nonce.group(1), "token": ALICE_TOKEN})
    assert login.status_code == 403 and "calls tools" in login.text
    assert "mcp_console=" not in login.headers.get("set-cookie", "")
    assert _row(console, job)["status"] == "working"
    console["alice"].cancel(task_id)


def test_a_post_without_the_csrf_token_changes_nothing(console: dict[str, Any]) -> None:
    task_id = console["alice"].start("con_hold", {"text": "held", "gate": str(console["gates"] / "never")})
    job = _job_of(console, task_id)
    http = _admin_http(console)
    for data in ({}, {"csrf": "forged"}):
        refused = http.post(f"/console/tasks/{job}/cancel", data=data)
        assert refused.status_code == 403, refused.text
        limits = http.post(
            "/console/limits", data={**data, "principal": "token:alice", "max_active_tasks": "0"}
        )
        assert limits.status_code == 403, limits.text
    assert _row(console, job)["status"] == "working"
    import psycopg

    with psycopg.connect(console["dsn"]) as conn:
        found = conn.execute("SELECT count(*) FROM mcp_principal_limits WHERE principal = 'token:alice'")
        assert found.fetchone() == (0,)
    # The same admin with the page's token: done.
    done = http.post(f"/console/tasks/{job}/cancel", data={"csrf": _csrf(http, f"/console/tasks/{job}")})
    assert done.status_code == 303
    assert _row(console, job)["status"] == "cancelled"
    http.close()


def test_a_script_with_the_admin_token_needs_no_cookie(console: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    listed = httpx.get(console["base"] + "/console/tasks", headers=headers, timeout=30)
    assert listed.status_code == 200 and 'id="tasks"' in listed.text
    wrong = httpx.get(
        console["base"] + "/console/tasks", headers={"Authorization": "Bearer nope"}, timeout=30
    )
    assert wrong.status_code == 401


def test_the_task_id_never_reaches_a_page(console: dict[str, Any]) -> None:
    task_id = console["alice"].start("con_hold", {"text": "quiet"})
    job = _job_of(console, task_id)
    console["alice"].wait_status(task_id)
    http = _admin_http(console)
    for path in ("/console/", "/console/tasks", f"/console/tasks/{job}", "/console/audit"):
        shown = http.get(path)
        assert shown.status_code == 200
        assert task_id not in shown.text
    assert job in http.get("/console/tasks").text
    http.close()


# ---- the list ----------------------------------------------------------------------------------


def test_the_list_pages_by_keyset_and_keeps_its_filter_in_the_url(console: dict[str, Any]) -> None:
    label = uuid.uuid4().hex[:8]
    ids = [console["alice"].start("con_hold", {"text": f"{label}-{n}"}) for n in range(5)]
    jobs = [_job_of(console, task_id) for task_id in ids]
    http = _admin_http(console)
    seen: list[str] = []
    path: str | None = "/console/tasks?tool=con_hold&owner=token:alice&limit=2"
    while path is not None and len(seen) < 50:
        shown = http.get(path)
        assert shown.status_code == 200
        seen += re.findall(r'<tr data-job="([^"]+)">', shown.text)
        older = re.search(r'id="older" href="([^"]+)"', shown.text)
        path = older.group(1).replace("&amp;", "&") if older else None
    assert len(seen) == len(set(seen))  # no row twice across pages
    ordered = [job for job in seen if job in jobs]
    assert ordered == list(reversed(jobs))  # newest first, every one of them
    whole = http.get(f"/console/tasks?job={jobs[2]}")
    assert re.findall(r'<tr data-job="([^"]+)">', whole.text) == [jobs[2]]
    bad = http.get("/console/tasks?status=nonsense")
    assert bad.status_code == 400
    http.close()


def test_a_hostile_sort_or_cursor_gets_a_clear_400_page(console: dict[str, Any]) -> None:
    http = _admin_http(console)
    for query, said in (
        ("sort=<script>alert(1)</script>", "sort: one of created, finished"),
        ("sort=finished&before=2026-12-03T10:00:00%2B00:00~job", "a page cursor of another sort"),
        ("before=finished~2026-12-03T10:00:00%2B00:00~job", "a page cursor of another sort"),
        ("sort=finished&before=finished~1e999~job", "not a date and time"),
        ("order=sideways", "order: one of newest, oldest"),
        ("owner=%00", "a NUL character"),
    ):
        refused = http.get(f"/console/tasks?{query}")
        assert refused.status_code == 400, query
        assert (
            said in refused.text and "<script>alert" not in refused.text and "Traceback" not in refused.text
        )
    http.close()


# ---- in the browser --------------------------------------------------------------------------


def test_an_admin_filters_opens_a_task_and_watches_it_complete(page: Any, console: dict[str, Any]) -> None:
    gate = console["gates"] / f"gate-{uuid.uuid4().hex[:6]}"
    label = f"watch-{uuid.uuid4().hex[:6]}"
    task_id = console["alice"].start("con_hold", {"text": label, "gate": str(gate)})
    job = _job_of(console, task_id)
    wait_until(lambda: _row(console, job)["started_at"] is not None, 30, 0.05, what="the job to start")
    page.fill("input[name=tool]", "con_hold")
    page.select_option("select[name=status]", "working")
    page.click("#filters button[type=submit]")
    page.wait_for_url(re.compile(r".*/console/tasks\?status=working&tool=con_hold.*"))
    page.click(f'tr[data-job="{job}"] a')
    page.wait_for_url(f"**/console/tasks/{job}")
    assert page.inner_text("#status") == "working"
    expect = pytest.importorskip("playwright.sync_api").expect
    expect(page.locator("#message")).to_contain_text(label)
    page.evaluate("window.notReloaded = true")
    gate.touch()
    started = time.monotonic()
    # The job's end reaches the open page through the hub's NOTIFY and the page's stream.
    expect(page.locator("#status")).to_have_text("completed", timeout=5_000)
    print(f"gate to 'completed' on the page: {time.monotonic() - started:.3f} s")
    assert page.evaluate("window.notReloaded") is True
    assert label in page.inner_text("#result")
    assert "finished" in page.inner_text("#timeline")


def test_a_column_header_sorts_the_list_and_the_url_keeps_the_sort(
    page: Any, console: dict[str, Any]
) -> None:
    label = uuid.uuid4().hex[:8]
    gates = [console["gates"] / f"sort-{label}-{n}" for n in range(3)]
    jobs = [
        _job_of(console, console["alice"].start("con_hold", {"text": f"{label}-{n}", "gate": str(gate)}))
        for n, gate in enumerate(gates)
    ]
    for n in (1, 2, 0):  # finished in another order than created
        gates[n].touch()
        wait_until(functools.partial(_finished, console, jobs[n]), 30, 0.05, what="a finish")

    def shown() -> list[str]:
        rows = page.locator("#tasks tbody tr").evaluate_all("rows => rows.map(r => r.dataset.job)")
        return [job for job in rows if job in jobs]

    page.goto("/console/tasks?tool=con_hold&owner=token:alice")
    assert shown() == [jobs[2], jobs[1], jobs[0]]  # newest created first
    page.click("#sort-finished")
    page.wait_for_url(re.compile(r".*/console/tasks\?tool=con_hold&owner=token%3Aalice&sort=finished$"))
    assert shown() == [jobs[0], jobs[2], jobs[1]]  # newest finished first
    assert page.get_attribute("th[aria-sort]", "aria-sort") == "descending"
    page.click("#sort-finished")  # again: reversed
    page.wait_for_url(re.compile(r".*sort=finished&order=oldest$"))
    assert shown() == [jobs[1], jobs[2], jobs[0]]
    page.reload()  # the sort is the URL's: a saved link shows the same list
    assert shown() == [jobs[1], jobs[2], jobs[0]]
    page.click("#sort-created")
    page.wait_for_url(re.compile(r".*/console/tasks\?tool=con_hold&owner=token%3Aalice$"))
    assert shown() == [jobs[2], jobs[1], jobs[0]]


def test_the_list_updates_its_rows_without_a_reload(page: Any, console: dict[str, Any]) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    gate = console["gates"] / f"gate-{uuid.uuid4().hex[:6]}"
    label = f"listed-{uuid.uuid4().hex[:6]}"
    job = _job_of(console, console["alice"].start("con_hold", {"text": label, "gate": str(gate)}))
    wait_until(lambda: _row(console, job)["status_message"] == label, 30, 0.05, what="the report")
    page.goto("/console/tasks?tool=con_hold&owner=token:alice")
    row = page.locator(f'tr[data-job="{job}"]')
    expect(row.locator("[data-row-live=status]")).to_have_text("working")
    page.evaluate("window.notReloaded = true")
    gate.touch()
    expect(row.locator("[data-row-live=status]")).to_have_text("completed", timeout=5_000)
    assert page.evaluate("window.notReloaded") is True


def test_signing_out_ends_the_browsers_session(page: Any) -> None:
    page.click("form.logout button[type=submit]")
    page.wait_for_url("**/console/login")
    page.goto("/console/audit")
    assert "/console/login?next=/console/audit" in page.url


def test_a_tasks_question_and_its_answer_show_on_its_page(page: Any, console: dict[str, Any]) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    alice = console["alice"]
    filename = f"<b>report-{uuid.uuid4().hex[:6]}</b>"
    params = {
        "name": "confirm_delete",
        "arguments": {"filename": filename},
        "_meta": support.meta(elicitation={}),
    }
    task_id = alice.request("tools/call", params).result["taskId"]
    task = alice.wait_status(task_id, ("input_required",))
    (key,) = task["inputRequests"]
    page.goto(f"/console/tasks/{_job_of(console, task_id)}")
    assert page.inner_text("#status") == "input_required"
    inputs = page.locator("#inputs tbody tr").first
    assert "waiting" in inputs.inner_text() and f"Delete {filename}?" in inputs.inner_text()
    alice.update(task_id, {key: {"action": "accept", "content": {"confirm": True}}})
    expect(page.locator("#status")).to_have_text("completed", timeout=5_000)
    expect(page.locator("#timeline")).to_contain_text(f"answered {key}")
    assert f"Deleted {filename}" in page.inner_text("#result")
    page.reload()  # the inputs table is drawn by the server: answered now, with the answer
    assert "answered" in page.locator("#inputs tbody tr").first.inner_text()
    assert '"confirm": true' in page.inner_text("#input-answer-1")


def test_a_tasks_artifacts_are_listed_on_its_page_by_name_never_by_content(
    page: Any, console: dict[str, Any]
) -> None:
    name = "<svg onload=alert(3)>.txt"
    task_id = console["alice"].start("publish_text", {"text": "secret weights", "name": name})
    console["alice"].wait_status(task_id)
    page.goto(f"/console/tasks/{_job_of(console, task_id)}")
    listed = page.inner_text("#artifacts")
    assert name in listed and "text/plain" in listed and "14 bytes" in listed
    assert "secret weights" not in page.inner_text("#artifacts")
    assert page.locator("main svg").count() == 0


def test_an_admin_cancels_a_task_and_sees_the_audit_row(page: Any, console: dict[str, Any]) -> None:
    task_id = console["alice"].start(
        "con_hold", {"text": "to cancel", "gate": str(console["gates"] / "never")}
    )
    job = _job_of(console, task_id)
    wait_until(lambda: _row(console, job)["started_at"] is not None, 30, 0.05, what="the job to start")
    page.goto(f"/console/tasks/{job}")
    page.fill("#cancel input[name=reason]", "runaway job")
    page.click("#cancel button[type=submit]")
    page.wait_for_url(f"**/console/tasks/{job}")
    # Cancelled at once; the worker stops at its next checkpoint (cooperatively), and the live page
    # shows it: stopping, then cancelled once the job has finished.
    expect = pytest.importorskip("playwright.sync_api").expect
    expect(page.locator("#status")).to_have_text("cancelled", timeout=15_000)
    row = _row(console, job)
    assert row["cancel_requested_at"] is not None and row["finished_at"] is not None
    assert "runaway job" in row["status_message"] and "admin:ops" in row["status_message"]
    page.goto("/console/audit")
    first = page.locator("#actions tbody tr").first
    cells = first.locator("td").all_inner_texts()
    assert cells[1:5] == ["admin:ops", "cancel", job, "1"]
    assert "runaway job" in cells[5]


def test_an_admin_edits_a_principals_limit_and_sees_the_audit_rows(
    page: Any, console: dict[str, Any]
) -> None:
    principal = f"token:team-{uuid.uuid4().hex[:6]}"
    page.goto("/console/limits")
    page.fill("#set-limits input[name=principal]", principal)
    page.fill("#set-limits input[name=max_active_tasks]", "7")
    page.fill("#set-limits input[name=note]", "<i>batch</i> team")
    page.click("#set-limits button[type=submit]")
    page.wait_for_url("**/console/limits")
    row = page.locator("#limits-table tbody tr", has_text=principal)
    assert row.locator("td").nth(1).inner_text() == "7"
    assert "<i>batch</i> team" in row.inner_text()
    page.goto("/console/audit")
    changes = page.locator("#limits tbody tr", has_text=f"principal {principal}")
    fields = {cells[3]: cells[5] for cells in (r.locator("td").all_inner_texts() for r in changes.all())}
    assert fields == {"max_active_tasks": "7", "note": "<i>batch</i> team"}
    assert all("admin:ops" in r.locator("td").nth(1).inner_text() for r in changes.all())
    action = page.locator("#actions tbody tr", has_text=f"principal {principal}").locator("td")
    assert action.all_inner_texts()[1:5] == ["admin:ops", "set limits", f"principal {principal}", "1"]
    import psycopg

    with psycopg.connect(console["dsn"]) as conn:
        stored = conn.execute(
            "SELECT max_active_tasks FROM mcp_principal_limits WHERE principal = %s", (principal,)
        ).fetchone()
    assert stored == (7,)


def test_payloads_in_arguments_results_messages_and_principals_render_inert(
    page: Any, console: dict[str, Any]
) -> None:
    held = console["mallory"].start("con_hold", {"text": PAYLOAD})
    failed = console["mallory"].start("con_fail", {"text": PAYLOAD})
    console["mallory"].wait_status(held)
    console["mallory"].wait_status(failed)
    page.goto("/console/tasks?" + httpx.QueryParams({"owner": f"token:{XSS_NAME}"}).__str__())
    assert page.locator("#tasks tbody tr[data-job]").count() == 2
    assert XSS_NAME in page.inner_text("#tasks")
    for task_id in (held, failed):
        page.goto(f"/console/tasks/{_job_of(console, task_id)}")
        page.wait_for_load_state("networkidle")
        assert SHOWN in page.inner_text("#arguments")
        assert XSS_NAME in page.inner_text("#owner")
        body = page.inner_text("main")
        assert SHOWN in body and "\x1b" not in body
        assert page.locator("#pwned, #pwned-name, main script").count() == 0
    page.goto(f"/console/tasks/{_job_of(console, held)}")
    assert SHOWN in page.inner_text("#result")
    # A status message shows while the task runs (the result replaces it).
    running = console["mallory"].start("con_hold", {"text": PAYLOAD, "gate": str(console["gates"] / "never")})
    job = _job_of(console, running)
    wait_until(lambda: _row(console, job)["status_message"] == PAYLOAD, 30, 0.05, what="the report")
    page.goto(f"/console/tasks/{job}")
    assert SHOWN in page.inner_text("#message")
    console["mallory"].cancel(running)
    page.goto(f"/console/tasks/{_job_of(console, failed)}")
    assert SHOWN in page.inner_text("#error-body")
    page.goto("/console/")
    for tab in ("/console/", f"/console/tasks?owner=token:{XSS_NAME}"):
        page.goto(tab)
        assert page.locator("#pwned, #pwned-name, main script").count() == 0
    assert page.dialogs == []


def test_the_overview_shows_work_per_queue_and_principal_and_the_last_hours_failures(
    page: Any, console: dict[str, Any]
) -> None:
    held = console["alice"].start("con_hold", {"text": "overview", "gate": str(console["gates"] / "never")})
    failed = console["alice"].start("con_fail", {"text": "broken on purpose"})
    console["alice"].wait_status(failed)
    wait_until(
        lambda: _row(console, _job_of(console, held))["started_at"] is not None, 30, 0.05, what="a start"
    )
    page.goto("/console/")
    alice = page.locator("#principals tbody tr", has_text="token:alice")
    assert int(alice.locator("td").nth(4).inner_text()) >= 1  # running
    queue = page.locator("#queues tbody tr", has_text="con_hold")
    assert int(queue.locator("td").nth(4).inner_text()) >= 1
    failures = page.locator("#failures tbody tr", has_text="con_fail")
    assert int(failures.locator("td").nth(1).inner_text()) >= 1
    assert int(failures.locator("td").nth(4).inner_text()) >= 1  # the last day's too
    totals = page.locator("#queue-totals tbody tr").first
    assert int(totals.locator("td").nth(3).inner_text()) >= 1  # running in the queue
    share = page.locator("#shares tbody tr", has_text="token:alice")
    assert share.locator("td").nth(2).inner_text() == "1000"  # the default limit, no override
    assert share.locator("td").nth(4).inner_text().endswith("%")  # of the live worker's slots
    assert page.locator("#recent li", has_text=_job_of(console, failed)).count() == 1
    console["alice"].cancel(held)


def test_every_page_has_a_screenshot(page: Any, console: dict[str, Any], tmp_path: Path) -> None:
    """The README's pictures (``scripts/console-screenshots`` writes them into docs/console/)."""
    folder = Path(os.environ.get("MCP_TASKS_TEST_CONSOLE_SCREENSHOTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    alice = console["alice"]
    gate = console["gates"] / f"shot-{uuid.uuid4().hex[:6]}"
    running = alice.start("con_hold", {"text": "epoch 3 of 8: loss 0.231", "gate": str(gate)})
    alice.start("con_fail", {"text": "CUDA out of memory (on purpose)"})
    wait_until(
        lambda: _row(console, _job_of(console, running))["started_at"] is not None, 30, 0.05, what="a start"
    )
    page.set_viewport_size({"width": 1280, "height": 900})
    shots = {
        "overview.png": "/console/",
        "tasks.png": "/console/tasks?owner=token:alice",
        "task.png": f"/console/tasks/{_job_of(console, running)}",
        "limits.png": "/console/limits",
        "audit.png": "/console/audit",
    }
    for name, path in shots.items():
        page.goto(path)
        page.wait_for_load_state("domcontentloaded")
        page.screenshot(path=str(folder / name), full_page=True)
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page.goto("/console/tasks?tool=con_fail&status=failed")
    page.click("#bulk-retry button[type=submit]")  # the dry run's count, before anything changes
    page.wait_for_selector("#bulk-count")
    page.screenshot(path=str(folder / "bulk.png"), full_page=True)
    page.context.clear_cookies()
    page.goto("/console/login")
    page.screenshot(path=str(folder / "login.png"))
    gate.touch()


def _commits(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


STATS_FLUSH_S = 11.0
"""A backend reports its transaction counts when it goes idle, at most once a second, and an idle
one within 10 s (PostgreSQL's PGSTAT_IDLE_INTERVAL): counts of a burst show up to that late."""


def _transactions_in(dsn: str, seconds: float) -> int:
    """Transactions the database ran in ``seconds``, after the last burst's counts have arrived."""
    time.sleep(STATS_FLUSH_S)  # no event tells when another backend's counts are in
    before = _commits(dsn)
    time.sleep(seconds)
    return _commits(dsn) - before


@pytest.mark.timeout(180)
def test_open_live_pages_cost_no_query_of_their_own_while_nothing_changes(console: dict[str, Any]) -> None:
    import asyncio

    never = str(console["gates"] / "never")
    jobs = [
        _job_of(console, console["alice"].start("con_hold", {"text": f"idle {n}", "gate": never}))
        for n in range(20)
    ]

    # The worker runs two at a time: the others wait in the backlog, watched all the same.
    def started() -> bool:
        return sum(_row(console, job)["started_at"] is not None for job in jobs) == 2

    wait_until(started, 30, 0.05, what="two jobs to start")
    measured: list[int] = []

    async def watch() -> None:
        opened: asyncio.Queue[str] = asyncio.Queue()
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(base_url=console["base"], headers=headers, timeout=60) as http:

            async def follow(job: str) -> None:
                async with http.stream("GET", f"/console/tasks/{job}/live") as stream:
                    assert stream.status_code == 200
                    async for line in stream.aiter_lines():
                        if line.startswith("event: state"):
                            opened.put_nowait(job)

            followers = [asyncio.create_task(follow(job)) for job in jobs]
            for _ in jobs:  # every stream has its first state
                await asyncio.wait_for(opened.get(), 30)
            measured.append(await asyncio.to_thread(_transactions_in, console["dsn"], 5.0))
            for follower in followers:
                follower.cancel()
            await asyncio.gather(*followers, return_exceptions=True)

    # In a thread of its own: Playwright's sync API (the module's browser) holds this thread's loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, watch()).result()
    idle = _transactions_in(console["dsn"], 5.0)  # the same stack with no page open
    # 20 pages reading their rows 4 times a second would add 400 transactions in 5 s; the hub's one
    # batched re-read of every watched task adds about 20, however many pages are open.
    print(f"transactions in 5 s: {measured[0]} with 20 live pages open, {idle} with none")
    assert measured[0] - idle < 100, (measured[0], idle)
    for job in jobs:
        console["alice"].cancel(_task_of(console, job))


def _task_of(console: dict[str, Any], job_id: str) -> str:
    return str(_row(console, job_id)["task_id"])
