"""Same-round ratios of our server against fastmcp-tasks and the F2/F1 floors.

    PYTHONPATH=../shared/bench python tests/bench/ours_ratios.py OUT_DIR

Reads the result files that tests/bench/run_bench.sh leaves in OUT_DIR (through the shared
harness's own loader) and prints a Markdown table: every ratio is "ours ÷ other", computed inside
one round, then the median over rounds. Run by hand, not by pytest.
"""

from __future__ import annotations

import sys

from mcpbench.stats import median
from mcpbench.summarize import load

PEERS = [("fastmcp-tasks", "fastmcp-tasks"), ("f2-h11", "F2 h11"), ("f2-uvloop", "F2 uvloop")]

# (what, our metric, the other's metric, better when the ratio is higher or lower, segments)
METRICS = [
    ("tasks/get ok/s @16", "S2@16 get ok/s", "S2@16 get ok/s", "higher", PEERS),
    ("tasks/get ok/s @64", "S2@64 get ok/s", "S2@64 get ok/s", "higher", PEERS),
    ("tasks/get p50 @16", "S2@16 p50 ms", "S2@16 p50 ms", "lower", PEERS),
    ("tasks/get server CPU/op @64", "S2@64 server CPU µs/op", "S2@64 server CPU µs/op", "lower", PEERS),
    ("create ok/s @1", "S1@1 create ok/s", "S1@1 create ok/s", "higher", PEERS),
    ("create ok/s @16", "S1@16 create ok/s", "S1@16 create ok/s", "higher", PEERS),
    ("create ok/s @64", "S1@64 create ok/s", "S1@64 create ok/s", "higher", PEERS),
    ("create p50 @1", "S1@1 p50 ms", "S1@1 p50 ms", "lower", PEERS),
    ("create p99 @64", "S1@64 p99 ms", "S1@64 p99 ms", "lower", PEERS),
    (
        "create server CPU/op @64 (ours, fastmcp: incl. execution)",
        "S1@64 server CPU µs/op",
        "S1@64 server CPU µs/op",
        "lower",
        PEERS,
    ),
    (
        "create p50 @1 vs F1 insert+commit+publish sequential p50",
        "S1@1 p50 ms",
        "F1 both x1 p50 ms",
        "lower",
        [("f1", "F1")],
    ),
    (
        "create ok/s @16 vs F1 insert+commit+publish x16 threads",
        "S1@16 create ok/s",
        "F1 both x16 ops/s",
        "higher",
        [("f1", "F1")],
    ),
    ("noop end-to-end p50 (S3)", "S3 p50 ms", "S3 p50 ms", "lower", PEERS[:1]),
    ("noop end-to-end p99 (S3)", "S3 p99 ms", "S3 p99 ms", "lower", PEERS[:1]),
    ("sleep_ms(100) end-to-end p50 (S3b)", "S3b p50 ms", "S3b p50 ms", "lower", PEERS[:1]),
    ("input round trip: update ack → completed p50 (S4)", "S4 p50 ms", "S4 p50 ms", "lower", PEERS[:1]),
    (
        "tasks/update ack p50 (S4)",
        "S4 tasks/update ack p50 ms",
        "S4 tasks/update ack p50 ms",
        "lower",
        PEERS[:1],
    ),
    ("cancel ack → cancelled p50 (S5)", "S5 p50 ms", "S5 p50 ms", "lower", PEERS[:1]),
    (
        "tasks/cancel ack p50 (S5)",
        "S5 tasks/cancel ack p50 ms",
        "S5 tasks/cancel ack p50 ms",
        "lower",
        PEERS[:1],
    ),
    ("server RSS peak during S1 (S6)", "S6 server RSS peak MiB", "S6 server RSS peak MiB", "lower", PEERS),
]


def render(data: dict[str, dict[int, dict[str, float]]]) -> str:
    out = [
        "",
        "## Same-round ratios: ours ÷ others",
        "",
        "ours ÷ other, computed inside each round (same run window), then the median over rounds; "
        "'better' says which side of 1 favours us. Quote these, not absolute numbers from different rounds.",
        "",
        "| ratio | vs | better | median | per round |",
        "|---|---|---|---:|---|",
    ]
    ours = data.get("ours", {})
    if not ours:
        out.append("| (no `ours` results) | | | | |")
    for what, ours_metric, other_metric, better, segments in METRICS:
        for seg, name in segments:
            other = data.get(seg, {})
            per: list[float | None] = []
            for rnd in sorted(set(ours) & set(other)):
                a, b = ours[rnd].get(ours_metric), other[rnd].get(other_metric)
                per.append(a / b if a is not None and b else None)
            vals = [v for v in per if v is not None]
            if vals:
                rounds = " / ".join("-" if v is None else f"{v:.2f}" for v in per)
                out.append(f"| {what} | {name} | {better} | {median(vals):.2f}x | {rounds} |")
    errs = [
        f"{k} = {v:g} (round {rnd})"
        for rnd, m in sorted(ours.items())
        for k, v in m.items()
        if k.endswith("errors") and v
    ]
    if ours:
        out += ["", "Errors counted by the harness for ours: " + ("; ".join(errs) if errs else "none") + "."]
    return "\n".join(out) + "\n"


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    sys.stdout.write(render(load(sys.argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
