#!/usr/bin/env bash
# Issue 34's advice for a user's DDP program, checked against real PyTorch. The CPU reference
# workload in PyTorch DDP (bench/torch_ddp.py, instrumented with lockstep.watch) runs as a job of a
# local agent with DDP's default 25 MB buckets; its report's ddp_bucket_advice names a
# bucket_cap_mb and the exposed time the step model expects with it; the same job then runs with
# that cap. Prints what the model expected against what the second run measured, and both runs'
# step times.
#
#   bench/ddp_bucket_advice.sh [STEPS]      (default 300 steps after 20 to warm up)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${LOCKSTEP_BUILD_DIR:-$ROOT/build}
STEPS=${1:-300}
"$ROOT/lockstep.sh" build >&2
WORK=$(mktemp -d /var/tmp/lockstep-advice.XXXXXX)
AGENT_PID=
trap '[ -n "$AGENT_PID" ] && kill "$AGENT_PID" 2>/dev/null; rm -rf "$WORK"' EXIT
# shellcheck source=bench/local_agent.sh
source "$ROOT/bench/local_agent.sh"
hctl() { "$BUILD/bin/lockstepctl" --config-dir "$WORK/config" --history "$WORK/history.db" "$@"; }
start_local_agent 39517 advice-node
coretype=Haswell; grep -q avx512f /proc/cpuinfo && coretype=SkylakeX

run_job() {  # JOB_ID BUCKET_CAP_MB
  hctl start --ranks 2 --wait --job-id "$1" --env "OPENBLAS_CORETYPE=$coretype" -- /usr/bin/python3 \
    "$ROOT/bench/torch_ddp.py" --instrument --steps "$STEPS" --warmup 20 --bucket-cap-mb "$2" >"$WORK/$1.out"
  hctl report "$1" --out "$WORK/$1.json" >/dev/null
}

run_job ddp-default 25
cap=$(/usr/bin/python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["kpis"]["ddp_bucket_advice"]; print(a["bucket_cap_mb"] if a else "")' "$WORK/ddp-default.json")
if [ -z "$cap" ]; then
  /usr/bin/python3 -c 'import json,sys; k=json.load(open(sys.argv[1]))["kpis"]; print("no advice: exposed communication %.1f%% (%s)" % (100*(k["comm_overhead"] or 0), k["communication_advice"])); print({n: k.get(n) for n in ["bytes_reduced_per_step", "straggler_wait_share", "arrival_skew_us"]}); print([{n: r.get(n) for n in ["mean_data_us", "mean_compute_us", "mean_exposed_us", "mean_step_us"]} for r in json.load(open(sys.argv[1]))["ranks"]])' "$WORK/ddp-default.json"
  exit 0
fi
run_job ddp-advised "$cap"
/usr/bin/python3 - "$WORK/ddp-default.json" "$WORK/ddp-advised.json" <<'PY'
import json, statistics, sys
before, after = (json.load(open(p)) for p in sys.argv[1:3])
def measured(report):
    ranks = report["ranks"]
    return (statistics.mean(r["mean_exposed_us"] for r in ranks) / 1e3, statistics.mean(r["mean_step_us"] for r in ranks) / 1e3,
            report["kpis"]["samples_per_second"])
advice = before["kpis"]["ddp_bucket_advice"]
e0, s0, t0 = measured(before)
e1, s1, t1 = measured(after)
print("PyTorch DDP (gloo), reference MLP, 2 ranks, instrumented; report figures over the last 10 s")
print(f"{'run':<34}{'exposed ms/step':>16}{'step ms':>9}{'samples/s':>11}")
print(f"{'bucket_cap_mb=25 (DDP default)':<34}{e0:>16.2f}{s0:>9.2f}{t0:>11.0f}")
print(f"{'bucket_cap_mb=%g (advised)' % advice['bucket_cap_mb']:<34}{e1:>16.2f}{s1:>9.2f}{t1:>11.0f}")
print(f"advice: bucket_cap_mb={advice['bucket_cap_mb']:g}, expected {advice['expected_exposed_us'] / 1e3:.2f} ms exposed "
      f"(from {advice['current_exposed_us'] / 1e3:.2f} ms); measured {e1:.2f} ms: {e1 / max(1e-9, advice['expected_exposed_us'] / 1e3):.2f}x the expectation")
print("advice text: " + (before["kpis"]["communication_advice"] or "-"))
PY
