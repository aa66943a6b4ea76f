#!/bin/bash
# What the fences of docs/fences.md cost a job (issue 44): the CPU reference workload (issue 2's:
# MLP 784-1024-1024-10, batch 64 per rank, 2 ranks, SGD) through an agent, with the fences (memory
# limit, process limit, cores of its own, the device filter) and without them (--job-fences no),
# alternately, ROUNDS times each, in one run. Prints each run's samples/s (the median step of steps
# 51 on, from the trainer's metrics) and the ratio of the medians.
#
#   bench/fences_cost.sh [BUILD_DIR] [ROUNDS] [STEPS]
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
ROUNDS=${2:-3}
STEPS=${3:-400}
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d -p /var/tmp)
AGENT_PID=
. "$SRC/bench/local_agent.sh"
trap 'kill $AGENT_PID 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
WORKLOAD=(--layers 784,1024,1024,10 --dataset synthetic:n=65536,dim=784,classes=10,seed=1 --batch-per-rank 64
  --optimizer sgd --lr 0.01 --steps "$STEPS")

run() {  # FENCES(yes|no) ROUND: samples/s of one job
  local fences=$1 job="fence-$1-$2"
  AGENT_ARGS=(--job-fences "$fences")
  start_local_agent 17871 fence-node
  ctl --timeout-s 300 start --ranks 2 --wait --job-id "$job" --mem-per-rank 2G --cpus-per-rank 1 "${WORKLOAD[@]}" >/dev/null
  /usr/bin/python3 - "$WORK/agent/jobs/$job/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = {}
for r in rows:
    if r.get("step", 0) > 50:
        steps.setdefault(r["step"], []).append(r)
rates = [sum(x["samples"] for x in rs) / max(x["step_time_us"] for x in rs) * 1e6 for rs in steps.values() if len(rs) == 2]
print("%.0f" % statistics.median(rates))
PY
  kill "$AGENT_PID"
  wait "$AGENT_PID" 2>/dev/null || true
  rm -rf "$WORK/agent" "$WORK/config"
}

with=() without=()
for round in $(seq "$ROUNDS"); do
  with+=("$(run yes "$round")")
  without+=("$(run no "$round")")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
w=$(median "${with[@]}")
wo=$(median "${without[@]}")
echo "CPU reference workload, 2 ranks, samples/s: with fences ${with[*]} (median $w); without ${without[*]} (median $wo);" \
  "with/without x$(/usr/bin/python3 -c "print('%.3f' % ($w / $wo))")"
