#!/bin/bash
# The agent's memory while it refuses forged records (issue 44; target: unchanged within 1 MiB
# after 10,000). Job A's one rank reports a step every 0.1 s (loss 1.0); job B's one rank claims
# to be job A's rank 0 (bench/forged_sender.py) and pushes COUNT records (default 10000) of loss
# 12345 through its own report socket as fast as it can. The agent's RSS is read before B starts
# and a second after it ended; job A's stream, recorded from its start by `lockstepctl watch`, is
# searched for the forged loss; the agent's log, for its refusals.
#
#   bench/forged_records.sh [BUILD_DIR] [COUNT]
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
COUNT=${2:-10000}
FORGED_LOSS=12345
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d -p /var/tmp)
AGENT_PID= WATCH_PID=
. "$SRC/bench/local_agent.sh"
cleanup() {
  ctl stop forged-b --grace-ms 1000 >/dev/null 2>&1 || true
  ctl stop forged-a --grace-ms 1000 >/dev/null 2>&1 || true
  [ -n "$WATCH_PID" ] && kill "$WATCH_PID" 2>/dev/null
  [ -n "$AGENT_PID" ] && kill "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
[ "$(id -u)" = 0 ] || { echo "run as root: the agent refuses by the senders' processes, as a node's agent runs" >&2; exit 1; }

start_local_agent 17883 forged-node
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$AGENT_PID/status"; }

ctl --timeout-s 120 start --ranks 1 --job-id forged-a --workdir "$WORK" -- /usr/bin/python3 -c '
import time, lockstep
for i in range(1, 100000):
    time.sleep(0.1)
    lockstep.step(samples=1, loss=1.0, step=i)' >/dev/null
# Job A's stream from its first record to its end, into a history of its own.
"$BUILD/bin/lockstepctl" --config-dir "$WORK/config" --history "$WORK/history.db" --json watch forged-a \
  >"$WORK/watch.jsonl" 2>"$WORK/watch.err" &
WATCH_PID=$!
sleep 10  # A reports, the agent's allocations settle
before=$(rss_kib)

ctl --timeout-s 300 start --ranks 1 --wait --job-id forged-b --workdir "$WORK" -- \
  /usr/bin/python3 "$SRC/bench/forged_sender.py" forged-a "$COUNT" "$FORGED_LOSS" >"$WORK/b.out" 2>&1 ||
  { echo "job B did not succeed:" >&2; cat "$WORK/b.out" >&2; exit 1; }
sleep 1
after=$(rss_kib)
sender=$(ctl logs forged-b --rank 0 | grep '^forged records made' || true)

sleep 2  # A's records of the last seconds, then A's end ends the watch
ctl --timeout-s 120 stop forged-a --grace-ms 1000 >/dev/null
for _ in $(seq 300); do kill -0 "$WATCH_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$WATCH_PID" 2>/dev/null && { echo "the watch of job A did not end:" >&2; cat "$WORK/watch.err" >&2; exit 1; }
WATCH_PID=

/usr/bin/python3 - "$WORK" "$before" "$after" "$COUNT" "$FORGED_LOSS" "$sender" <<'PY'
import json, re, sqlite3, sys
work, before, after, count, forged, sender = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
m = re.match(r"forged records made (\d+) dropped-on-sender (\d+)", sender)
made, dropped = (int(m.group(1)), int(m.group(2))) if m else (None, None)
db = sqlite3.connect(work + "/history.db")
steps, = db.execute("SELECT count(*) FROM steps WHERE job_id = 'forged-a'").fetchone()
forged_in, = db.execute("SELECT count(*) FROM steps WHERE job_id = 'forged-a' AND loss = ?", (forged,)).fetchone()
shown = top = 0
for line in open(work + "/watch.jsonl"):
    try:
        snap = json.loads(line)
    except ValueError:
        continue
    shown += sum(1 for r in snap.get("ranks", []) if r.get("loss") == forged)
    top = max([top] + [r.get("step") or 0 for r in snap.get("ranks", [])])
log = open(work + "/agent.log", errors="replace").read().splitlines()
refusals = [l for l in log if "refused" in l]
print("forged records claiming job A: %s sent by job B (%s made, %s dropped on B's side)"
      % ("?" if made is None else made - dropped, made, dropped))
print("agent RSS: before %.2f MiB, after %.2f MiB, difference %+.2f MiB (target: within 1 MiB)"
      % (before / 1024, after / 1024, (after - before) / 1024))
print("job A's stream: %d step reports recorded, %d with the forged loss %g; watch snapshots showing it: %d"
      " (highest step shown %d; forged steps are > 1000000)" % (steps, forged_in, forged, shown, top))
print("agent log: %d refusal lines" % len(refusals))
for l in refusals:
    print("  " + l)
PY
