#!/usr/bin/env bash
# Every GPU check of issue 6 in one run on the GPU machine (one H200; see
# ../shared/gpu-machine/README.md), from the bundle made here with bench/gpu/bundle.sh:
#
#   1. the tests labelled `gpu` (tests/gpu_test.cpp): CUDA fp32 against the CPU backend, bf16
#      against fp32, checkpoint and resume, the agent's real NVML readings during a CUDA job;
#   2. the reference benchmark, MLP 1024-4096-4096-4096-1000, batch 8192, bf16, SGD momentum,
#      world size 1 through NCCL, with GEMM algorithms timed at start-up and with the heuristic's
#      first choice, beside PyTorch's eager and DDP numbers from the same machine, with samples/s,
#      model TFLOP/s (6 x parameters x samples/s) and the ratio;
#   3. where nsys exists there, the GPU time per kernel over 60 steps.
#
# Locally:  bench/gpu/bundle.sh
# There:    run(command="bash bench/gpu/device_check.sh", carry=["gpu-bundle"], timeout_s=540)
# Figures and logs go to $OUT (or ./gpu-check-out).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=$ROOT/gpu-bundle
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
say() { printf '== %s\n' "$*"; }

[ -d "$BUNDLE/bin" ] || { echo "no $BUNDLE: run bench/gpu/bundle.sh and carry gpu-bundle" >&2; exit 2; }
[ -d "$BUNDLE/lib" ] || tar -C "$BUNDLE" -xJf "$BUNDLE/lib.tar.xz"
# cuBLASLt and NCCL: the machine's CUDA toolkit, else PyTorch's wheels.
libs=$BUNDLE/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do
  [ -d "$d" ] && libs=$libs:$d
done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LOCKSTEP_TEST_BIN_DIR=$BUNDLE/bin
PY=/opt/torch/.venv/bin/python
[ -x "$PY" ] || PY=python3

say "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ldd "$BUNDLE/bin/lockstep-trainer" | grep -E "not found|cublas|nccl"

say "1. tests labelled gpu"
timeout 300 "$BUNDLE/bin/gpu_test" --gtest_output="json:$OUT/gpu_test.json" 2>&1 | tee "$OUT/gpu_test.txt" | grep -E "^\[|Failure|Expected|Which|error" 
tests_rc=${PIPESTATUS[0]}

say "2. reference MLP: lockstep-trainer --backend cuda (GEMM algorithms timed at start-up, then the heuristic's first)"
workload=(--layers 1024,4096,4096,4096,1000 --activation gelu --precision bf16 --batch-per-rank 8192
          --optimizer sgd --lr 0.01 --momentum 0.9 --dataset synthetic:n=65536,dim=1024,classes=1000,seed=1)
timeout 120 "$BUNDLE/bin/lockstep-trainer" --backend cuda "${workload[@]}" --steps 200 --log-every 50 \
  --metrics-out "$OUT/bench.jsonl" 2>&1 | tee "$OUT/bench.txt"
LOCKSTEP_GEMM_TUNING=0 timeout 120 "$BUNDLE/bin/lockstep-trainer" --backend cuda "${workload[@]}" --steps 200 \
  --log-every 100 --metrics-out "$OUT/bench-heuristic.jsonl" 2>&1 | tee "$OUT/bench-heuristic.txt"
say "2. reference MLP: PyTorch (bench/gpu/mlp_reference.py)"
timeout 240 "$PY" "$ROOT/bench/gpu/mlp_reference.py" 2>&1 | tail -1 | tee "$OUT/torch.json"

NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  say "3. where a step's time goes (nsys, 60 steps)"
  timeout 120 "$NSYS" profile --stats=false -o "$OUT/steps" --force-overwrite true \
    "$BUNDLE/bin/lockstep-trainer" --backend cuda "${workload[@]}" --steps 60 --quiet >/dev/null 2>&1
  timeout 60 "$NSYS" stats --report cuda_gpu_kern_sum --format csv "$OUT/steps.nsys-rep" 2>/dev/null \
    | tee "$OUT/kernels.csv" | cut -d, -f1-4,9 | head -25
  rm -f "$OUT"/steps.sqlite
else
  say "3. no nsys on this machine: no per-kernel breakdown"
fi

say "figures"
"$PY" - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
params = 1024*4096 + 4096 + 2*(4096*4096 + 4096) + 4096*1000 + 1000

def figures(name):
    try:
        steps = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if l.strip()]
    except OSError as e:
        return repr(e)
    tail = steps[50:]  # after warm-up
    if not tail:
        return f"only {len(steps)} steps"
    mean_ms = statistics.mean(s["step_time_us"] for s in tail) / 1e3
    samples = 8192 / (mean_ms / 1e3)
    split = {k: statistics.mean(s[k] for s in tail) / 1e3
             for k in ("data_time_us", "compute_time_us", "exposed_comm_time_us")}
    return {"step_ms_mean": mean_ms, "step_ms_median": statistics.median(s["step_time_us"] for s in tail) / 1e3,
            "samples_s": samples, "tflops": 6 * params * samples / 1e12, "split_ms": split,
            "steps": len(steps), "final_loss": steps[-1].get("global_loss")}

res = {"lockstep_tuned": figures("bench"), "lockstep_heuristic": figures("bench-heuristic")}
try:
    res["torch"] = json.loads(open(f"{out}/torch.json").read())
    for k in ("lockstep_tuned", "lockstep_heuristic"):
        if isinstance(res[k], dict):
            res[k]["ratio_vs_ddp"] = res[k]["samples_s"] / res["torch"]["mlp_ddp1"]["samples_s"]
            res[k]["ratio_vs_plain"] = res[k]["samples_s"] / res["torch"]["mlp_plain"]["samples_s"]
except Exception as e:  # PyTorch's run failed: say so, keep ours
    res["torch"] = repr(e)
print(json.dumps(res, indent=1))
json.dump(res, open(f"{out}/figures.json", "w"), indent=1)
PY
say "tests exit code $tests_rc"
exit "$tests_rc"
