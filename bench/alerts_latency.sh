#!/bin/bash
# From a condition holding for its `for` to the webhook receiving the alert (issue 43; target
# ≤ 2 s). RUNS jobs (default 5) of one rank whose first step makes `loss < 1000000 for 2s` hold;
# each latency is the webhook's receipt less (the first step's report + 2 s), on this machine's clock.
#
#   bench/alerts_latency.sh [BUILD_DIR] [RUNS]
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
RUNS=${2:-5}
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d -p /var/tmp)
AGENT_PID= HOOK_PID=
. "$SRC/bench/local_agent.sh"
trap 'kill $AGENT_PID $HOOK_PID 2>/dev/null; rm -rf "$WORK"' EXIT

start_local_agent 17855 latency-node
/usr/bin/python3 "$SRC/bench/webhook_sink.py" 17856 "$WORK/posted.jsonl" &
HOOK_PID=$!
for i in $(seq "$RUNS"); do
  ctl start --ranks 1 --wait --job-id "latency-$i" --workdir "$WORK" --notify http://127.0.0.1:17856/hook \
    --alert 'loss < 1000000 for 2s -> notify' -- /usr/bin/python3 "$SRC/bench/reporting_rank.py" 60 0.1 >/dev/null
  ctl logs "latency-$i" --rank 0 | sed -n 's/^first-step-us //p' >"$WORK/first-$i"
done
/usr/bin/python3 - "$WORK" "$RUNS" <<'PY'
import json, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
posted = [json.loads(l) for l in open(work + "/posted.jsonl")]
lat = []
for i in range(1, runs + 1):
    first = int(open("%s/first-%d" % (work, i)).read())
    got = [p for p in posted if p["job"] == "latency-%d" % i and p["state"] == "firing"]
    lat.append((got[0]["received_us"] - (first + 2_000_000)) / 1e6)
print("alert latency (condition held for its `for` -> webhook): median %.2f s, max %.2f s over %d runs (target <= 2 s)"
      % (statistics.median(lat), max(lat), runs))
print("  each: " + ", ".join("%.2f" % x for x in lat))
PY
