#!/bin/bash
# What evaluating alert rules costs the agent (issue 43): a job of RANKS ranks (default 64) that
# only report, 10 steps a second each (bench/reporting_rank.py), run twice on one agent: without
# rules, then with 20. Prints the agent's CPU seconds per second of each run, side by side. The
# agent has RANKS GPUs of the tests' stand-in NVML (tests/support/fake_nvml.c), sampled as real
# ones are, so that the ranks (one a GPU, as a GPU job places them) fit a 2-core machine.
#
#   bench/alerts_cost.sh [BUILD_DIR] [RANKS] [SECONDS]
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
RANKS=${2:-64}
SECONDS_RUN=${3:-40}
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d -p /var/tmp)
AGENT_PID=
. "$SRC/bench/local_agent.sh"
trap 'ctl stop cost-none --grace-ms 1000 >/dev/null 2>&1 || true; ctl stop cost-rules --grace-ms 1000 >/dev/null 2>&1 || true; kill $AGENT_PID 2>/dev/null; rm -rf "$WORK"' EXIT

export LOCKSTEP_FAKE_NVML_GPUS=$RANKS
AGENT_ARGS=(--nvml-library "$BUILD/tests/liblockstep_fake_nvml.so")
start_local_agent 17857 cost-node
cpu() { awk '{print $14 + $15}' "/proc/$AGENT_PID/stat"; }  # clock ticks, user + system
rules=("failed" "stalled" "restarted" "finished" "gpu_util < 30% for 10m" "exposed_comm > 40% for 2m"
  "throughput_drop > 30% for 5m" "straggler_wait > 30% for 5m" "loss is nan -> notify,stop" "cost > 40"
  "projected_cost > 100" "eta > 6h" "gpu_memory > 95%" "gpu_temperature > 85" "disk_free < 10%"
  "loss > 100 for 1m" "exposed_comm > 90%" "throughput_drop > 80% for 1m" "straggler_wait > 60%" "gpu_util < 5% for 30m -> stop")
measure() {  # JOB FLAGS...: the agent's CPU seconds per second over SECONDS_RUN, after 20 s to start
  local job=$1
  shift
  ctl --timeout-s 120 start --ranks "$RANKS" --backend cuda --job-id "$job" --workdir "$WORK" "$@" -- /usr/bin/python3 "$SRC/bench/reporting_rank.py" \
    100000 0.1 >/dev/null
  sleep 20
  local before after
  before=$(cpu)
  sleep "$SECONDS_RUN"
  after=$(cpu)
  ctl --timeout-s 120 stop "$job" --grace-ms 1000 >/dev/null
  sleep 10  # the ranks' processes gone before the next job starts its own
  /usr/bin/python3 -c "print('%.4f' % (($after - $before) / $(getconf CLK_TCK) / $SECONDS_RUN))"
}
flags=()
for r in "${rules[@]}"; do flags+=(--alert "$r"); done
none=$(measure cost-none)
with=$(measure cost-rules "${flags[@]}")
echo "agent CPU, $RANKS ranks at 10 steps/s each: no rules $none s/s, ${#rules[@]} rules $with s/s" \
  "(x$(/usr/bin/python3 -c "print('%.2f' % ($with / $none))"))"
