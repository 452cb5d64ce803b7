#!/usr/bin/env bash
# Benchmark our server next to fastmcp-tasks and the F2/F1 floors, in the same run window.
# Run by hand (never by pytest); the harness stays in the shared bench folder (read-only).
#
#   tests/bench/run_bench.sh OUT_DIR [ROUNDS=3]
#
# Each round runs the segments of SEGMENTS (default "ours fastmcp f2h11 f2uvloop f1"), starting
# one further along every round. "ours" is done here; the others are the shared run_baseline.sh
# called for one segment at a time. At the end: OUT_DIR/SUMMARY.md (medians, the shared ratios,
# and same-round ratios of ours against the others). Logs go to OUT_DIR/logs.
#
# Environment (defaults in brackets):
#   BENCH_PY      harness + floors python      [<repo>/../benchvenv/harness/bin/python]
#   FM_PY         fastmcp-tasks venv python    [<repo>/../benchvenv/fastmcp/bin/python]
#   BENCH_PG_DSN  floors' database             [postgresql://postgres@127.0.0.1:5432/benchfloor]
#   BENCH_DIR     the shared harness           [<repo>/../shared/bench]
#   SERVER_CPUS [0]  CLIENT_CPUS [1]  HARNESS_ARGS (extra mcpbench args)  SEGMENTS  FIRST_ROUND [1]
#   OURS_PORT [18901]  OURS_BROKER [redis://127.0.0.1:6379/6]  OURS_QUEUE [mcp.bench]
#   OURS_DB [mcp_tasks_bench] on PGHOST [127.0.0.1] / PGPORT [5432] as PGUSER [postgres]
#   OURS_CLI      [<repo>/.venv/bin/mcp-celery-tasks]  OURS_SCENARIOS [S1,S2,S3,S3b,S4,S5,S6]
#   OURS_WORKER_CONCURRENCY [2]   OURS_ENV  extra MCP_TASKS_* assignments for our processes,
#                                 e.g. OURS_ENV="MCP_TASKS_DB_POOL_MAX=20"
#   REDIS_PID     redis-server pid for the aux CPU column [oldest redis-server]
# Every process this script starts is stopped by pid (the worker also by its process group).
set -euo pipefail

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then usage; exit 2; fi

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=$1
ROUNDS=${2:-3}
BENCH_DIR=${BENCH_DIR:-$ROOT/../shared/bench}
BENCH_PY=${BENCH_PY:-$ROOT/../benchvenv/harness/bin/python}
FM_PY=${FM_PY:-$ROOT/../benchvenv/fastmcp/bin/python}
BENCH_PG_DSN=${BENCH_PG_DSN:-postgresql://postgres@127.0.0.1:5432/benchfloor}
SERVER_CPUS=${SERVER_CPUS:-0}
CLIENT_CPUS=${CLIENT_CPUS:-1}
HARNESS_ARGS=${HARNESS_ARGS:-}
SEGMENTS=${SEGMENTS:-"ours fastmcp f2h11 f2uvloop f1"}
FIRST_ROUND=${FIRST_ROUND:-1}
OURS_PORT=${OURS_PORT:-18901}
OURS_BROKER=${OURS_BROKER:-redis://127.0.0.1:6379/6}
OURS_QUEUE=${OURS_QUEUE:-mcp.bench}
OURS_DB=${OURS_DB:-mcp_tasks_bench}
OURS_CLI=${OURS_CLI:-$ROOT/.venv/bin/mcp-celery-tasks}
OURS_SCENARIOS=${OURS_SCENARIOS:-S1,S2,S3,S3b,S4,S5,S6}
OURS_WORKER_CONCURRENCY=${OURS_WORKER_CONCURRENCY:-2}
OURS_ENV=${OURS_ENV:-}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
OURS_DB_URL="postgresql://$PGUSER@$PGHOST:$PGPORT/$OURS_DB"
OURS_URL="http://127.0.0.1:$OURS_PORT/mcp"

for exe in "$BENCH_PY" "$FM_PY" "$OURS_CLI"; do
  [ -x "$exe" ] || { echo "missing $exe (see tests/bench/README.md)" >&2; exit 2; }
done
for cmd in wrk taskset setsid curl createdb dropdb; do
  command -v "$cmd" >/dev/null || { echo "missing $cmd on PATH" >&2; exit 2; }
done
[ -f "$BENCH_DIR/run_baseline.sh" ] || { echo "no harness at BENCH_DIR=$BENCH_DIR" >&2; exit 2; }

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/logs
mkdir -p "$LOG"

say() { echo "[bench $(date -u +%H:%M:%S)] $*"; }
find_redis_pid() { if [ -n "${REDIS_PID:-}" ]; then echo "$REDIS_PID"; else pgrep -o -x redis-server || true; fi; }

# ------------------------------------------------------------------ the "ours" segment
OURS_PIDS=()     # pids started by the current "ours" segment
OURS_GROUPS=()   # process groups started by it (the Celery worker and its pool children)

ours_stop() {
  local p g
  for p in "${OURS_PIDS[@]:-}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null || true; done
  # Celery's warm shutdown can take a while; the prefork children go with their group.
  for _ in $(seq 1 120); do
    local alive=0
    for p in "${OURS_PIDS[@]:-}"; do [ -n "$p" ] && kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.25
  done
  for p in "${OURS_PIDS[@]:-}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true; done
  for g in "${OURS_GROUPS[@]:-}"; do [ -n "$g" ] && kill -KILL -- "-$g" 2>/dev/null || true; done
  for p in "${OURS_PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  OURS_PIDS=()
  OURS_GROUPS=()
}

ours_redis_cleanup() {  # only the keys our queue and Celery/kombu bookkeeping leave in OURS_BROKER
  "$BENCH_PY" - "$OURS_BROKER" "$OURS_QUEUE" <<'PY'
import sys, redis
r = redis.Redis.from_url(sys.argv[1]); q = sys.argv[2]; n = 0
for pat in (f"{q}*", f"_kombu.binding.{q}*", f"_kombu.binding_permanent.{q}*", "_kombu.binding.celery*",
            "unacked*"):
    keys = list(r.scan_iter(match=pat, count=1000))
    for i in range(0, len(keys), 500):
        n += r.delete(*keys[i:i + 500])
print(f"redis cleanup ({sys.argv[1]}): {n} keys deleted; {r.dbsize()} keys left in that db")
PY
}

ours_wait_http() {  # the harness's readiness probe: any HTTP answer to a tasks/get
  for _ in $(seq 1 150); do
    local code
    code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$OURS_URL" -H 'Content-Type: application/json' \
      -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2026-07-28' \
      -H 'Mcp-Method: tasks/get' -H 'Mcp-Name: probe' \
      -d '{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"probe","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}},"io.modelcontextprotocol/clientInfo":{"name":"bench","version":"0"}}}}' \
      || true)
    if [ -n "$code" ] && [ "$code" != 000 ]; then return 0; fi
    for p in "${OURS_PIDS[@]}"; do kill -0 "$p" 2>/dev/null || { echo "process $p died" >&2; return 1; }; done
    sleep 0.2
  done
  echo "our API at $OURS_URL did not answer" >&2
  return 1
}

ours_wait_worker() {  # one noop task must complete end to end (worker consuming, publish path up)
  (cd "$BENCH_DIR" && "$BENCH_PY" - "$OURS_URL" <<'PY'
import asyncio, sys
from mcpbench.client import Client
from mcpbench.wire import TERMINAL

async def main(url: str) -> str:
    async with Client(url, connections=1, timeout_s=10) as c:
        r = await c.call_tool("noop")
        if r.get("resultType") != "task":
            return f"not a task: {r}"
        t, _, _ = await c.wait_for(r["taskId"], lambda t: t.get("status") in TERMINAL, 0.1, 90)
        return t.get("status")

status = asyncio.run(main(sys.argv[1]))
print(f"readiness noop task: {status}")
sys.exit(0 if status == "completed" else 1)
PY
  )
}

seg_ours() {
  local r=$1 label="ours-r$1" rpid api wpid
  rpid=$(find_redis_pid)
  [ -x "$OURS_CLI" ] || { echo "missing $OURS_CLI" >&2; return 1; }
  ours_redis_cleanup
  dropdb --if-exists --force "$OURS_DB"
  createdb "$OURS_DB"
  # Our processes see only the MCP_TASKS_* set here (plus OURS_ENV), never the caller's.
  local envs=()
  local k
  for k in $(compgen -e | grep '^MCP_TASKS_' || true); do envs+=(-u "$k"); done
  # The bench fixtures (noop, sleep_ms, ask, spin) are test modules: importable from the checkout.
  envs+=(MCP_TASKS_DATABASE_URL="$OURS_DB_URL" MCP_TASKS_BROKER_URL="$OURS_BROKER"
         MCP_TASKS_DEFAULT_QUEUE="$OURS_QUEUE" MCP_TASKS_TOOL_MODULES='["tests.fixtures.bench"]'
         PYTHONPATH="$ROOT")
  # One principal measured at full speed: the per-principal quotas are off (0 = no limit), as
  # they are for the peer. Fair dispatch stays on (it is how jobs reach the broker).
  envs+=(MCP_TASKS_CREATES_PER_SECOND_PER_PRINCIPAL=0 MCP_TASKS_MAX_ACTIVE_TASKS_PER_PRINCIPAL=0
         MCP_TASKS_MAX_CONCURRENT_REQUESTS_PER_PRINCIPAL=0 MCP_TASKS_MAX_WAITING_INPUTS_PER_PRINCIPAL=0)
  local extra
  read -r -a extra <<< "$OURS_ENV"
  envs+=("${extra[@]}")
  env "${envs[@]}" "$OURS_CLI" migrate > "$LOG/ours-migrate-r$r.log" 2>&1
  env "${envs[@]}" taskset -c "$SERVER_CPUS" "$OURS_CLI" serve --port "$OURS_PORT" --log-level warning \
    > "$LOG/ours-api-r$r.log" 2>&1 &
  api=$!; OURS_PIDS+=("$api")
  # setsid: the worker leads its own process group, so its pool children can be stopped with it.
  setsid env "${envs[@]}" taskset -c "$SERVER_CPUS" "$OURS_CLI" worker -P prefork \
    -c "$OURS_WORKER_CONCURRENCY" -Q "$OURS_QUEUE" -n bench@localhost --log-level warning \
    > "$LOG/ours-worker-r$r.log" 2>&1 &
  wpid=$!; OURS_PIDS+=("$wpid"); OURS_GROUPS+=("$wpid")
  ours_wait_http
  ours_wait_worker >> "$LOG/ours-worker-r$r.log" 2>&1 || {
    echo "our worker did not complete a noop task (see $LOG/ours-worker-r$r.log)" >&2; return 1; }
  sleep 2
  say "round $r: ours API $api + worker $wpid (prefork -c $OURS_WORKER_CONCURRENCY) on CPUs $SERVER_CPUS," \
      "db $OURS_DB, broker $OURS_BROKER"
  local aux=()
  [ -n "$rpid" ] && aux=(--aux-pid "redis=$rpid")
  # shellcheck disable=SC2086  # HARNESS_ARGS is a list of words
  (cd "$BENCH_DIR" && "$BENCH_PY" -m mcpbench --url "$OURS_URL" --label "$label" --out-dir "$OUT" \
     --client-cpus "$CLIENT_CPUS" --server-pid "$api,$wpid" --scenarios "$OURS_SCENARIOS" \
     "${aux[@]}" $HARNESS_ARGS) > "$LOG/$label.log" 2>&1
  grep -E '^\|' "$LOG/$label.log" || true
  for p in "$api" "$wpid"; do
    kill -0 "$p" 2>/dev/null || { echo "our process $p died during the run" >&2; return 1; }
  done
  ours_stop
  ours_redis_cleanup
}

# ------------------------------------------------------------------ peer and floor segments
seg_shared() {  # SEGMENT ROUND: the shared baseline script, for that one segment and round
  FM_PY=$FM_PY BENCH_PY=$BENCH_PY BENCH_PG_DSN=$BENCH_PG_DSN SERVER_CPUS=$SERVER_CPUS \
    CLIENT_CPUS=$CLIENT_CPUS HARNESS_ARGS=$HARNESS_ARGS SEGMENTS=$1 FIRST_ROUND=$2 \
    "$BENCH_DIR/run_baseline.sh" "$OUT" 1
}

# ------------------------------------------------------------------ rounds
# Each segment runs in a background subshell that the script waits for: a trapped Ctrl-C or TERM
# interrupts that wait at once (a foreground child that handles SIGINT itself would hide it), and
# the trap stops every descendant of the segment by pid; the segment's EXIT trap cleans up after.
FAILED=()
INTERRUPTED=0
SEG_PID=
descendants() { local c; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done; }
on_signal() {
  INTERRUPTED=1
  if [ -n "$SEG_PID" ]; then
    local pids
    pids=$(descendants "$SEG_PID")
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null || true  # shellcheck disable=SC2086
  fi
  return 0
}
trap on_signal INT TERM

run_segment() {  # SEGMENT ROUND; a failing segment is reported and the run goes on
  local s=$1 r=$2 rc=0
  (
    set -e
    trap ours_stop EXIT
    case $s in
      ours) seg_ours "$r" ;;
      fastmcp | f2h11 | f2uvloop | f1) seg_shared "$s" "$r" ;;
      *) echo "unknown segment $s" >&2; exit 2 ;;
    esac
  ) &
  SEG_PID=$!
  wait "$SEG_PID" || rc=$?
  if [ $INTERRUPTED = 1 ]; then
    say "interrupted during $s round $r; stopping its processes"
    wait "$SEG_PID" 2>/dev/null || true
  elif [ $rc != 0 ]; then
    FAILED+=("$s-r$r")
    say "segment $s round $r FAILED (exit $rc); logs in $LOG"
  fi
  SEG_PID=
}

read -r -a segs <<< "$SEGMENTS"
n=${#segs[@]}
say "out=$OUT rounds=$ROUNDS from $FIRST_ROUND segments=[$SEGMENTS] server CPUs=$SERVER_CPUS" \
    "client CPUs=$CLIENT_CPUS redis pid=$(find_redis_pid) load=$(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$FIRST_ROUND" $((FIRST_ROUND + ROUNDS - 1))); do
  for i in $(seq 0 $((n - 1))); do   # rotate: each round starts one segment further along
    [ $INTERRUPTED = 1 ] || run_segment "${segs[$(((i + r - 1) % n))]}" "$r"
  done
done

{
  (cd "$BENCH_DIR" && "$BENCH_PY" -m mcpbench.summarize "$OUT")
  PYTHONPATH=$BENCH_DIR "$BENCH_PY" "$HERE/ours_ratios.py" "$OUT"
} > "$OUT/SUMMARY.md"
say "done: $OUT/SUMMARY.md"
if [ $INTERRUPTED = 1 ]; then exit 130; fi
if [ ${#FAILED[@]} -gt 0 ]; then
  say "failed segments: ${FAILED[*]}"
  exit 1
fi
