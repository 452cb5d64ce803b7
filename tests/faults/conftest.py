"""Fixtures of the fault suite: services of its own (so it may stop them), a database per test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.faults.services import FaultServices, fault_services

_counter = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: a fault scenario that takes more than ~20 s")


@pytest.fixture(scope="session")
def services() -> Iterator[FaultServices]:
    """Embedded PostgreSQL and a Redis broker, started once for the suite."""
    with fault_services() as started:
        yield started


@pytest.fixture(autouse=True)
def _services_up_again(services: FaultServices) -> Iterator[None]:
    """Whatever a test did to them, the next one finds both services running."""
    yield
    if not services.postgres.running():
        services.postgres.start()
    if not services.broker.running():
        services.broker.start()


@pytest.fixture
def fault_db(services: FaultServices, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh migrated database; it is left behind for inspection until the suite ends."""
    name = f"faults_{next(_counter)}_{request.node.name[:30]}".lower().replace("[", "_").replace("]", "")
    dsn = services.create_database(name)
    yield dsn
    # Postgres may be down when a test failed mid-outage; the folder goes away with the suite.
    if services.postgres.running():
        services.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
