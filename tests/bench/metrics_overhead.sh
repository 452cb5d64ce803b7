#!/usr/bin/env bash
# What metrics cost: shared/bench S1 and S2 against our server with MCP_TASKS_METRICS_ENABLED on
# and off, alternating inside each round (same window), then same-round ratios on ÷ off.
#
#   tests/bench/metrics_overhead.sh OUT_DIR [ROUNDS=3]
#
# Needs what run_bench.sh needs for its "ours" segment (BENCH_PY, wrk, taskset, createdb);
# results in OUT_DIR/on and OUT_DIR/off, the table in OUT_DIR/RATIOS.md.
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; fi
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=$1
ROUNDS=${2:-3}
BENCH_DIR=${BENCH_DIR:-$ROOT/../shared/bench}
BENCH_PY=${BENCH_PY:-$ROOT/../benchvenv/harness/bin/python}
mkdir -p "$OUT"

one() {  # MODE ROUND
  local flag=true
  [ "$1" = off ] && flag=false
  SEGMENTS=ours FIRST_ROUND=$2 OURS_SCENARIOS=${OURS_SCENARIOS:-S1,S2} FM_PY=${FM_PY:-$BENCH_PY} \
    OURS_ENV="${OURS_ENV:-} MCP_TASKS_METRICS_ENABLED=$flag" "$HERE/run_bench.sh" "$OUT/$1" 1
}

for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then one on "$r"; one off "$r"; else one off "$r"; one on "$r"; fi
done
PYTHONPATH=$BENCH_DIR "$BENCH_PY" "$HERE/ab_ratios.py" "$OUT/on" "$OUT/off" | tee "$OUT/RATIOS.md"
