#!/bin/bash
# How soon a stall is seen at the default allowance (issue 32: within 15 s of the last progress
# for sub-second steps): a real agent, lockstepctl, and two jobs whose rank 1 stops moving:
#   trainer  the built-in trainer (MLP 784-256-10), rank 1 SIGSTOPped after 50 steps
#   pytorch  a PyTorch DDP (Gloo) script, rank 1 blocked in its own data loader at step 30
# For each: the seconds from the rank's last progress to the agent's stall (the stall's own
# "since"), from the stop to the first `lockstepctl status` that shows it (polled every 0.2 s),
# and the rank it names.
#
#   bench/stall_detection.sh [BUILD_DIR]
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d -p /var/tmp)  # not /tmp: each job has a private one
AGENT_PID=
trap 'for j in trainer pytorch; do "$BUILD/bin/lockstepctl" --config-dir "$WORK/config" stop "bench-$j" --grace-ms 1000 >/dev/null 2>&1 || true; done; [ -n "$AGENT_PID" ] && kill $AGENT_PID 2>/dev/null; rm -rf "$WORK"' EXIT

. "$SRC/bench/local_agent.sh"
start_local_agent 17851 bench-node

field() { /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }
now() { date +%s.%N; }

# Waits for the job's rank 1 to pass step $2; prints its pid.
await_step() {
  for _ in $(seq 600); do
    local s
    s=$(ctl --json status "$1" 2>/dev/null || true)
    if [ -n "$s" ] && [ "$(echo "$s" | field "[r for r in d['ranks'] if r['rank']==1][0].get('progress',{}).get('step',0) > $2")" = True ]; then
      echo "$s" | field "[r for r in d['ranks'] if r['rank']==1][0]['pid']"
      return
    fi
    sleep 0.2
  done
  echo "rank 1 of $1 never passed step $2" >&2
  exit 1
}

# Polls status until it shows a stall; prints the line of figures.
await_stall() {
  local job=$1 stopped=$2
  for _ in $(seq 1500); do
    local s
    s=$(ctl --json status "$job" 2>/dev/null || true)
    if [ -n "$s" ] && [ "$(echo "$s" | field "'stall' in d")" = True ]; then
      local seen since ranks
      seen=$(now)
      since=$(echo "$s" | field "d['stall']['since_unix_us'] / 1e6")
      ranks=$(echo "$s" | field "d['stall']['ranks']")
      awk -v j="$job" -v seen="$seen" -v since="$since" -v stopped="$stopped" -v r="$ranks" 'BEGIN {
        printf "  %-8s last progress -> shown %5.1f s   stop -> shown %5.1f s   names ranks %s\n", j, seen - since, seen - stopped, r }'
      return
    fi
    sleep 0.2
  done
  echo "  $job: no stall within 300 s" >&2
}

echo "stall detection at the default allowance (the larger of 14 s and 5x the p99 step):"
ctl start --ranks 2 --job-id bench-trainer --layers 784,256,10 --steps 100000000 >/dev/null
pid=$(await_step bench-trainer 50)
kill -STOP "$pid"
stopped=$(now)
await_stall bench-trainer "$stopped"
kill -CONT "$pid"
ctl stop bench-trainer --grace-ms 1000 >/dev/null

ctl start --ranks 2 --job-id bench-pytorch -- /usr/bin/python3 "$SRC/tests/programs/ddp_mlp.py" --instrument \
  --steps 100000 --hang-rank 1 --hang-at 30 >/dev/null
await_step bench-pytorch 28 >/dev/null
# Rank 1 blocks when it starts step 30: its record's step-began time is the stop.
stopped=$(ctl --json status bench-pytorch | field "__import__('time').time() - [r for r in d['ranks'] if r['rank']==1][0]['progress']['still_ms'] / 1e3")
await_stall bench-pytorch "$stopped"
