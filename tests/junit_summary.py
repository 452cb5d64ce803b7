"""One summary line for several pytest runs, from their ``--junitxml`` reports, in pytest's own
format: scripts/test runs a parallel pass and a serial pass, and CI reads the last
``N passed`` line of the log.

    python -m tests.junit_summary REPORT.xml [REPORT.xml ...]
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path


def counts(report: Path) -> tuple[Counter[str], float]:
    """Outcomes of one report (``passed``, ``failed``, ``error``, ``skipped``) and its wall time."""
    root = ElementTree.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    seen: Counter[str] = Counter()
    seconds = 0.0
    for suite in suites:
        tests, failed, errors, skipped = (
            int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")
        )
        seen.update(passed=tests - failed - errors - skipped, failed=failed, error=errors, skipped=skipped)
        seconds += float(suite.get("time", "0"))
    return seen, seconds


def summary(reports: list[Path]) -> str:
    total: Counter[str] = Counter()
    seconds = 0.0
    missing = [str(r) for r in reports if not r.exists()]
    for report in reports:
        if report.exists():
            seen, took = counts(report)
            total += seen
            seconds += took
    order = ("failed", "passed", "skipped", "error")  # pytest's order
    parts = [f"{total[k]} {k if k != 'error' or total[k] == 1 else 'errors'}" for k in order if total[k]]
    line = f" {', '.join(parts) or 'no tests ran'} in {seconds:.2f}s (all passes) "
    if missing:
        line += f"(no report: {', '.join(missing)}) "
    return line.center(100, "=")


if __name__ == "__main__":
    print(summary([Path(arg) for arg in sys.argv[1:]]))
