"""Fixtures on real services: Postgres databases cloned from a migrated template, and a live
API + prefork worker stack per broker."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_celery_tasks.settings import Settings
from mcp_celery_tasks.store import migrate
from tests import support

# The shell must not leak configuration into the tests.
for _key in [k for k in os.environ if k.startswith("MCP_TASKS_") and not k.startswith("MCP_TASKS_TEST_")]:
    del os.environ[_key]

SUFFIX = uuid.uuid4().hex[:8]
"""Names this pytest process's databases, queues and stacks: each xdist worker imports this module
itself, so each draws its own and no two share a database, a queue or an examples folder (one
Redis database number is shared; every key in it is named for a queue)."""
_counter = itertools.count()
IN_CI = os.environ.get("CI") == "true"
_embedded: contextlib.ExitStack | None = None


PAIRED_DIRECTORIES = ("faults", "conformance")
"""Marked ``paired`` whole: scripts/test runs them after the parallel pass, three files at a time.
The fault suite restarts its own embedded services and kills process groups, and asserts recovery
within seconds; the conformance runner's scenarios wait on a 5 s question timeout. Both mostly
wait (on restarts, leases, timeouts) rather than compute, so three of them side by side keep their
clocks; beside the CPU-bound parallel pass, or beside a ``serial`` test's hostile tools, they
would not."""


def pytest_configure(config: pytest.Config) -> None:
    """Use the machine's services; on a bare machine start embedded Postgres and Redis."""
    global _embedded
    if config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput"):
        return  # the xdist controller runs no test: each worker starts what it needs
    forced = os.environ.get("MCP_TASKS_TEST_EMBEDDED") == "1"
    if not forced and ("MCP_TASKS_TEST_DATABASE_URL" in os.environ or support.postgres_reachable()):
        return
    if IN_CI:
        raise pytest.UsageError(f"CI needs PostgreSQL at {support.ADMIN_DSN}")
    from mcp_celery_tasks.cli.dev.embedded import embedded_services

    _embedded = contextlib.ExitStack()
    folder = support.ROOT / ".cache" / "test-services" / (support.XDIST_WORKER or "main")
    services = _embedded.enter_context(embedded_services(folder))
    support.ADMIN_DSN = services.database_url.replace("/mcp_tasks?", "/postgres?")
    support.REDIS_URL = services.broker_url


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = support.ROOT / "tests"
    for item in items:
        if item.path.is_relative_to(tests) and item.path.relative_to(tests).parts[0] in PAIRED_DIRECTORIES:
            item.add_marker(pytest.mark.paired)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _embedded is not None:
        _embedded.close()


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    name = f"mcpt_{SUFFIX}_template"
    dsn = support.create_database(name)
    migrate.upgrade(Settings(database_url=dsn))
    yield name
    support.drop_database(name)


@pytest.fixture
def db_url(template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    name = f"mcpt_{SUFFIX}_{next(_counter)}"
    dsn = support.create_database(name, template=template_db)
    yield dsn
    support.drop_database(name)


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(database_url=db_url, broker_url=support.REDIS_URL, tool_modules=["workers"])


@pytest.fixture(scope="session")
def e2e_db(template_db: str) -> Iterator[str]:
    name = f"mcpt_{SUFFIX}_e2e"
    dsn = support.create_database(name, template=template_db)
    yield dsn
    support.drop_database(name)


@pytest.fixture(scope="session")
def stack(e2e_db: str) -> Iterator[support.Stack]:
    """API + prefork worker on Redis, shared by the e2e tests."""
    with support.running_stack("redis", e2e_db, support.REDIS_URL, f"{SUFFIX}r") as live:
        yield live


@pytest.fixture(scope="session")
def rabbit_stack(template_db: str) -> Iterator[support.Stack]:
    """API + prefork worker on RabbitMQ (its own database)."""
    if os.environ.get("MCP_TASKS_TEST_EMBEDDED") == "1" or not support.rabbitmq_reachable():
        if IN_CI:
            pytest.fail("CI needs RabbitMQ on 127.0.0.1:5672")
        pytest.skip("no RabbitMQ on this machine")
    name = f"mcpt_{SUFFIX}_rabbit"
    dsn = support.create_database(name, template=template_db)
    with support.running_stack("rabbitmq", dsn, support.AMQP_URL, f"{SUFFIX}a") as live:
        yield live
    support.drop_database(name)


@pytest.fixture(params=["redis", "rabbitmq"])
def any_stack(request: pytest.FixtureRequest) -> support.Stack:
    """Each broker in turn."""
    name = "stack" if request.param == "redis" else "rabbit_stack"
    stack: support.Stack = request.getfixturevalue(name)
    return stack


@pytest.fixture
def client(stack: support.Stack) -> Iterator[support.Client]:
    c = stack.client()
    yield c
    c.close()


@pytest.fixture(scope="session")
def ext_tasks() -> Path:
    """The TypeScript SDK client with the tasks extension (``scripts/install-peers``), and its
    driver script ``tests/e2e/peers/ext_tasks_client.mjs`` as ``client.mjs``; skipped without
    npm, except in CI."""
    folder = support.ROOT / ".cache" / "peers-ts-ext"
    if not (folder / "node_modules" / "@modelcontextprotocol" / "ext-tasks" / "package.json").exists():
        ran = subprocess.run(
            [str(support.ROOT / "scripts" / "install-peers")], capture_output=True, text=True, timeout=900
        )
        if ran.returncode != 0 or shutil.which("node") is None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"scripts/install-peers failed: {ran.stderr[-2000:]}")
            pytest.skip("npm could not install @modelcontextprotocol/client and ext-tasks")
    shutil.copy(support.ROOT / "tests" / "e2e" / "peers" / "ext_tasks_client.mjs", folder / "client.mjs")
    return folder
