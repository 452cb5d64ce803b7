"""Same-round ratios of our server in two configurations (A ÷ B), e.g. metrics on ÷ off.

    PYTHONPATH=../shared/bench python tests/bench/ab_ratios.py A_DIR B_DIR

Each directory holds the ``ours-rN`` results of ``run_bench.sh`` for one configuration, with the
same round numbers (``tests/bench/metrics_overhead.sh`` makes them). Prints a Markdown table:
per-round ratios, then the median. Run by hand, not by pytest.
"""

from __future__ import annotations

import sys

from mcpbench.stats import median
from mcpbench.summarize import load

METRICS = [
    "S2@16 get ok/s",
    "S2@64 get ok/s",
    "S2@16 p50 ms",
    "S2@64 server CPU µs/op",
    "S1@16 create ok/s",
    "S1@64 create ok/s",
    "S1@1 p50 ms",
    "S1@64 server CPU µs/op",
    "S3 p50 ms",
    "S3 p99 ms",
]


def main(a_dir: str, b_dir: str) -> None:
    a, b = load(a_dir).get("ours", {}), load(b_dir).get("ours", {})
    rounds = sorted(set(a) & set(b))
    if not rounds:
        sys.exit(f"no round of ours in both {a_dir} and {b_dir}")
    print(f"| metric (A ÷ B) | {' | '.join(f'r{r}' for r in rounds)} | median |")
    print(f"|---|{'---|' * len(rounds)}---|")
    for metric in METRICS:
        ratios = [a[r][metric] / b[r][metric] for r in rounds if a[r].get(metric) and b[r].get(metric)]
        if len(ratios) == len(rounds):  # measured in every round
            cells = " | ".join(f"{x:.3f}" for x in ratios)
            print(f"| {metric} | {cells} | {median(ratios):.3f} |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
