#!/bin/bash
# No false alert (issue 43): a healthy PyTorch DDP job that runs for MINUTES (default 30) under
# the default rules and every example rule of docs/alerts.md, its webhook a real HTTP server on
# loopback. Prints the alerts that fired (0 is the target: the job is stopped before it finishes).
#
#   bench/alerts_soak.sh [BUILD_DIR] [MINUTES]
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
MINUTES=${2:-30}
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d -p /var/tmp)  # not /tmp: each job has a private one
AGENT_PID= HOOK_PID=
. "$SRC/bench/local_agent.sh"
trap 'ctl stop alert-soak --grace-ms 1000 >/dev/null 2>&1 || true; kill $AGENT_PID $HOOK_PID 2>/dev/null; rm -rf "$WORK"' EXIT

start_local_agent 17853 soak-node
/usr/bin/python3 "$SRC/bench/webhook_sink.py" 17854 "$WORK/posted.jsonl" &
HOOK_PID=$!

rules=("failed" "stalled" "restarted" "finished"
  "gpu_util < 30% for 10m -> notify" "exposed_comm > 40% for 2m -> notify" "throughput_drop > 30% for 5m -> notify"
  "straggler_wait > 30% for 5m -> notify" "loss is nan -> notify,stop" "cost > 40 -> checkpoint,stop"
  "projected_cost > 100 -> notify" "eta > 6h -> notify" "gpu_memory > 95%" "gpu_temperature > 85" "disk_free < 10%")
flags=()
for r in "${rules[@]}"; do flags+=(--alert "$r"); done
ctl start --ranks 2 --job-id alert-soak --workdir "$WORK" --notify http://127.0.0.1:17854/hook "${flags[@]}" \
  --price-core-hour 0.05 -- /usr/bin/python3 "$SRC/tests/programs/ddp_mlp.py" --instrument --steps 100000000 \
  --sleep-ms 100 >/dev/null
sleep $((MINUTES * 60))
steps=$(ctl --json status alert-soak | /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); print(max(r.get('progress',{}).get('step',0) for r in d['ranks']))")
fired=$(ctl alerts alert-soak | grep -c " firing " || true)
echo "alerts soak: $MINUTES min, $steps steps, ${#rules[@]} rules"
echo "  alerts fired: $fired; posted to the webhook: $(wc -l <"$WORK/posted.jsonl") (target: 0)"
ctl alerts alert-soak
