"""A Django project with Celery: its own ``celery -A`` worker runs MCP tools that use the ORM,
and ``mcp_celery_tasks.contrib.django`` shows the tasks in its admin (a real browser).

The project (tests/sample_django) configures Celery from Django's settings and calls
``install``; the API publishes through the same app (MCP_TASKS_CELERY_APP). Its database is
a per-module clone of ``template_db`` (the ``mcp_tasks`` table) plus Django's own migrations.
The admin runs under Django's ``runserver``; Chromium (Debian's, with its chromedriver) logs in
and uses the changelist and its actions, whose effects are read back from Postgres and the API.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from tests import support
from tests.support import ROOT, Client, Proc, start_api, wait_until

BROKERS = {"redis": support.REDIS_URL, "rabbitmq": support.AMQP_URL}
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PASSWORD = "sample-admin-password"
CHANGELIST = "/admin/mcp_tasks/task/"

pytestmark = pytest.mark.timeout(300)


def _manage(env: dict[str, str], *args: str) -> str:
    """``python -m django ARGS`` in the project's settings; its output."""
    done = subprocess.run(
        [sys.executable, "-m", "django", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout


def _spawn(name: str, args: list[str], env: dict[str, str]) -> Proc:
    log = support.log_path(name)
    popen = subprocess.Popen(
        [sys.executable, *args], env=env, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    return Proc(name, popen, log)


USERS = f"""
from django.contrib.auth.models import Permission, User
User.objects.create_superuser("root", "root@example.com", {PASSWORD!r})
User.objects.create_user("clerk", "clerk@example.com", {PASSWORD!r}, is_staff=True)
viewer = User.objects.create_user("viewer", "viewer@example.com", {PASSWORD!r}, is_staff=True)
viewer.user_permissions.add(Permission.objects.get(codename="view_task", content_type__app_label="mcp_tasks"))
"""
"""A superuser; a staff user with no permission on the tasks; one who may view but not act."""


@pytest.fixture(scope="module", params=sorted(BROKERS))
def project(request: pytest.FixtureRequest, template_db: str) -> Iterator[dict[str, Any]]:
    if request.param == "rabbitmq" and not support.rabbitmq_reachable():
        pytest.skip("no RabbitMQ on this machine")
    name = f"mcpt_django_{request.param}_{os.getpid()}"
    database_url = support.create_database(name, template=template_db)
    prefix = f"shop{support.free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_TASKS_", "SAMPLE_", "DJANGO_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.sample_django.settings",
        SAMPLE_DJANGO_DATABASE_URL=database_url,
        SAMPLE_BROKER_URL=BROKERS[request.param],
        SAMPLE_QUEUE_PREFIX=prefix,
        MCP_TASKS_DATABASE_URL=database_url,
        MCP_TASKS_CELERY_APP="tests.sample_django.celery:app",
        MCP_TASKS_MAINTENANCE_QUEUE=f"{prefix}.maintenance",
        PYTHONUNBUFFERED="1",
    )
    _manage(env, "migrate", "--noinput")
    _manage(env, "shell", "-c", USERS)
    # The project's own worker command, as its team runs it.
    worker = _spawn(
        f"django-{request.param}-worker",
        ["-m", "celery", "-A", "tests.sample_django.celery", "worker", "-P", "prefork", "-c", "2",
         "-Q", f"{prefix}.default,{prefix}.mcp", "-n", f"{prefix}@localhost", "--loglevel", "info"],
        env,
    )  # fmt: skip
    port = support.free_port()
    web = _spawn(
        f"django-{request.param}-web",
        ["-m", "django", "runserver", "--noreload", "--insecure", f"127.0.0.1:{port}"],
        env,
    )
    api: Proc | None = None
    try:
        api, url = start_api(f"django-{request.param}-api", env)
        admin_url = f"http://127.0.0.1:{port}"

        def serving() -> bool:
            if web.popen.poll() is not None:
                raise AssertionError(f"runserver exited: {web.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(admin_url + "/admin/login/", timeout=1).status_code == 200
            return False

        wait_until(serving, 60, 0.2, what="Django's runserver to answer")
        wait_until(lambda: "ready." in worker.log.read_text(), 60, 0.2, what="the project's worker")
        yield {"url": url, "admin": admin_url, "env": env, "database_url": database_url}
    finally:
        if api is not None:
            api.stop()
        web.stop()
        worker.stop(signal.SIGQUIT, timeout=20)
        support.drop_database(name)


def _query(project: dict[str, Any], sql: str, *params: object) -> list[tuple[Any, ...]]:
    with contextlib.closing(psycopg.connect(project["database_url"])) as conn:
        return conn.execute(sql, params).fetchall()


def test_a_tool_uses_the_django_orm_in_the_projects_own_worker(project: dict[str, Any]) -> None:
    client = Client(project["url"])
    try:
        names = {tool["name"] for tool in client.request("tools/list").result["tools"]}
        assert names == {"place_order", "export_orders", "sync_stock"}
        first = client.start("place_order", {"item": "teapot", "quantity": 2})
        done = client.wait_status(first, timeout=60)
        assert done["status"] == "completed", done
        second = client.start("place_order", {"item": "cup", "quantity": 3})
        done = client.wait_status(second, timeout=60)
        assert done["status"] == "completed", done
    finally:
        client.close()
    result = done["result"]["structuredContent"]
    assert result["customer"] == "anon" and result["orders"] >= 2 and result["quantity"] >= 5
    rows = _query(
        project, "SELECT customer, item, quantity FROM shop_order WHERE id = %s", result["order_id"]
    )
    assert rows == [("anon", "cup", 3)]
    (queue,) = _query(project, "SELECT queue FROM mcp_tasks WHERE task_id = %s", second)[0]
    assert queue.endswith(".mcp")  # the project's route for MCP jobs


# ---- the admin, in a browser ------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if missing:
        message = f"no {' or '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--window-size=1400,1000"):  # fmt: skip
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium')}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _login(driver: Any, project: dict[str, Any], user: str) -> None:
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(project["admin"] + "/admin/login/")
    driver.find_element(By.NAME, "username").send_keys(user)
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_until(lambda: "/admin/login/" not in driver.current_url, 20, 0.1, what=f"{user} to log in")


def _act(driver: Any, project: dict[str, Any], action: str, task_ids: list[str]) -> str:
    """Tick ``task_ids`` on the changelist, run ``action``; the messages shown after it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(project["admin"] + CHANGELIST)
    for task_id in task_ids:
        driver.find_element(By.CSS_SELECTOR, f"input[name=_selected_action][value='{task_id}']").click()
    Select(driver.find_element(By.NAME, "action")).select_by_value(action)
    driver.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "ul.messagelist"), 30, 0.1, what="messages")
    return str(driver.find_element(By.CSS_SELECTOR, "ul.messagelist").text)


def _status(project: dict[str, Any], task_id: str) -> tuple[Any, ...]:
    return _query(project, "SELECT status, retry_at, attempts FROM mcp_tasks WHERE task_id = %s", task_id)[0]


def test_the_admin_lists_tasks_read_only_and_cancels_and_retries_them(
    project: dict[str, Any], browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    client = Client(project["url"])
    try:
        done = client.start("place_order", {"item": "kettle"})
        assert client.wait_status(done, timeout=60)["status"] == "completed"
        running = client.start("export_orders", {"seconds": 120})
        waiting = client.start("sync_stock", {"delay": 600})
        wait_until(lambda: _status(project, waiting)[1], 60, 0.1, what="sync_stock to wait for its retry")
        wait_until(
            lambda: "exporting" in (client.get(running).result.get("statusMessage") or ""),
            60, 0.1, what="export_orders to run",
        )  # fmt: skip

        # Anonymous: the login page. A staff user without the permission: refused.
        browser.delete_all_cookies()
        browser.get(project["admin"] + CHANGELIST)
        assert "/admin/login/" in browser.current_url and done not in browser.page_source
        _login(browser, project, "clerk")
        browser.get(project["admin"] + CHANGELIST)
        assert done not in browser.page_source and "403" in browser.title + browser.page_source

        # A viewer sees the rows but neither actions nor add, change or delete.
        _login(browser, project, "viewer")
        browser.get(project["admin"] + CHANGELIST)
        rows = browser.find_element(By.ID, "result_list").text
        assert done in rows and "place_order" in rows and "completed" in rows
        assert not browser.find_elements(By.NAME, "action")
        assert not browser.find_elements(By.CSS_SELECTOR, ".object-tools a.addlink")

        # The superuser: the two actions only (no delete), the rows newest first, read-only pages.
        _login(browser, project, "root")
        browser.get(project["admin"] + CHANGELIST)
        rows = browser.find_element(By.ID, "result_list").text
        assert rows.index(waiting) < rows.index(done)
        expected = [(done, "place_order", "completed"), (running, "export_orders", "working"),
                    (waiting, "sync_stock", "working")]  # fmt: skip
        for task_id, tool, status in expected:
            row = browser.find_element(By.XPATH, f"//tr[.//input[@value='{task_id}']]").text
            assert tool in row and status in row, row
        offered = [o.get_attribute("value") for o in Select(browser.find_element(By.NAME, "action")).options]
        assert offered == ["", "cancel_tasks", "retry_now"]
        if os.environ.get("MCP_TASKS_TEST_SCREENSHOTS"):
            browser.save_screenshot(os.environ["MCP_TASKS_TEST_SCREENSHOTS"])
        assert not browser.find_elements(By.CSS_SELECTOR, ".object-tools a.addlink")
        browser.get(project["admin"] + f"{CHANGELIST}{done}/change/")
        assert not browser.find_elements(By.CSS_SELECTOR, "input[name=_save]")
        assert not browser.find_elements(By.CSS_SELECTOR, "a.deletelink")
        assert done in browser.page_source
        add = httpx.get(project["admin"] + CHANGELIST + "add/", cookies=_cookies(browser))
        assert add.status_code == 403

        # Retry now: the waiting retry runs at once; the finished task is left as it was.
        shown = _act(browser, project, "retry_now", [waiting, done])
        assert "1 task will retry now; 1 task not waiting for a retry" in shown, shown
        final = client.wait_status(waiting, timeout=30)
        assert final["status"] == "completed", final
        assert final["result"]["structuredContent"]["attempt"] == 2
        assert _status(project, done)[0] == "completed"

        # Cancel: the running export stops; the finished tasks stay finished.
        shown = _act(browser, project, "cancel_tasks", [running, done])
        assert "Cancelled 1 task; 1 task already finished or cancelled" in shown, shown
        assert client.wait_status(running, timeout=30)["status"] == "cancelled"
        assert _status(project, running)[0] == "cancelled" and _status(project, done)[0] == "completed"
        wait_until(
            lambda: _query(project, "SELECT finished_at FROM mcp_tasks WHERE task_id = %s", running)[0][0],
            30, 0.1, what="the cancelled job to stop",
        )  # fmt: skip
    finally:
        client.close()


def _cookies(driver: Any) -> dict[str, str]:
    return {cookie["name"]: cookie["value"] for cookie in driver.get_cookies()}


def test_the_task_model_refuses_writes(project: dict[str, Any]) -> None:
    code = (
        "import django; django.setup()\n"
        "from mcp_celery_tasks.contrib.django.models import Task\n"
        "task = Task.objects.first() or Task(task_id='none')\n"
        "for write in (task.save, task.delete):\n"
        "    try:\n"
        "        write()\n"
        "    except TypeError as exc:\n"
        "        print('refused:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=project["env"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("refused: mcp_tasks is read-only") == 2, out.stdout
