#!/bin/bash
# No false stall (issue 32): a PyTorch DDP job at the default allowance that runs for MINUTES
# (default 30), whose steps take about 0.2 s and which every 100 steps spends 20 s in an announced
# "checkpoint" (lockstep.phase). Polls `lockstepctl status --json` every 5 s and reads the agent's
# log at the end; prints the checkpoints taken and the stalls seen (0 is the target).
#
#   bench/stall_soak.sh [BUILD_DIR] [MINUTES]
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
MINUTES=${2:-30}
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d -p /var/tmp)  # not /tmp: each job has a private one
AGENT_PID=
. "$SRC/bench/local_agent.sh"
trap 'ctl stop soak --grace-ms 1000 >/dev/null 2>&1 || true; [ -n "$AGENT_PID" ] && kill $AGENT_PID 2>/dev/null; rm -rf "$WORK"' EXIT

start_local_agent 17852 soak-node

ctl start --ranks 2 --job-id soak -- /usr/bin/python3 "$SRC/tests/programs/ddp_mlp.py" --instrument --steps 100000000 \
  --sleep-ms 200 --phase-every 100 --phase-s 20 >/dev/null
end=$(( $(date +%s) + MINUTES * 60 ))
seen=0
while [ "$(date +%s)" -lt "$end" ]; do
  if ctl --json status soak 2>/dev/null | grep -q '"stall":{'; then seen=$((seen + 1)); fi
  sleep 5
done
steps=$(ctl --json status soak | /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); print(max(r.get('progress',{}).get('step',0) for r in d['ranks']))")
stalls=$(grep -c "stalled" "$WORK/agent.log" || true)
echo "soak: $MINUTES min, $steps steps, $((steps / 100)) announced checkpoints of 20 s"
echo "  polls that showed a stall: $seen; stalls in the agent's log: $stalls (target: 0)"
