#!/usr/bin/env bash
# Every GPU check of issue 6 in one run on the GPU machine (one H200; see
# ../shared/gpu-machine/README.md), from the bundle made here with bench/gpu/bundle.sh. Most
# valuable first, every step capped, so that a failure leaves device time for a second try:
#
#   0. a smoke run: five bf16 steps of a small model (stops the script if it fails);
#   1. the reference benchmark, MLP 1024-4096-4096-4096-1000, batch 8192, bf16, SGD momentum,
#      world size 1 through NCCL (GEMM algorithms timed at start-up, fused GELU epilogues);
#   2. PyTorch's eager and DDP numbers for the same workload on the same machine;
#   3. the tests labelled `gpu` (tests/gpu_test.cpp): CUDA fp32 against the CPU backend, bf16
#      against fp32, checkpoint and resume, the agent's real NVML readings during a CUDA job;
#   4. the benchmark again with the heuristic's first GEMM algorithms, and without fused epilogues;
#   5. where nsys exists there, the GPU time per kernel over 60 steps;
#   6. every collective (issue 42): FSDP's all-gathers and reduce-scatters and a program's own NCCL
#      all-reduce through the lockstep package's wrappers, against the program's own CUDA events;
#   then samples/s, model TFLOP/s (6 x parameters x samples/s) and the ratios, in figures.json.
#
# Locally:  bench/gpu/bundle.sh
# There:    run(command="bash bench/gpu/device_check.sh", carry=["gpu-bundle"], timeout_s=540)
# Or only issue 45's kinds on GPUs (tests/gpu_kinds_test.cpp, about four minutes):
#           run(command="bash bench/gpu/device_check.sh kinds", carry=["gpu-bundle"], timeout_s=360)
# Figures and logs go to $OUT (or ./gpu-check-out). The caps add up to 525 s.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUNDLE=$ROOT/gpu-bundle
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
say() { printf '== %s\n' "$*"; }

[ -d "$BUNDLE/bin" ] || { echo "no $BUNDLE: run bench/gpu/bundle.sh and carry gpu-bundle" >&2; exit 2; }
[ -d "$BUNDLE/lib" ] || tar -C "$BUNDLE" -xJf "$BUNDLE/lib.tar.xz"
PY=/opt/torch/.venv/bin/python
[ -x "$PY" ] || PY=python3
MACHINE_LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}  # PyTorch runs with the machine's own libraries
# Ours: the bundle's Debian libraries, then cuBLASLt and NCCL from the CUDA toolkit, else from
# PyTorch's wheels.
libs=$BUNDLE/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do
  [ -d "$d" ] && libs=$libs:$d
done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LOCKSTEP_TEST_BIN_DIR=$BUNDLE/bin
# The own-program gpu test (issue 13) runs its DDP script with the machine's PyTorch.
export LOCKSTEP_TORCH_PYTHON=$PY
# The bundle carries Debian's libibverbs (Gloo links it); one GPU needs no InfiniBand.
export NCCL_IB_DISABLE=1 NCCL_DEBUG=WARN
TRAINER=$BUNDLE/bin/lockstep-trainer

say "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
for lib in libcublasLt.so.13 libnccl.so.2; do
  found=$(IFS=:; for d in $LD_LIBRARY_PATH; do [ -e "$d/$lib" ] && { echo "$d/$lib"; break; }; done)
  echo "$lib: ${found:-$(ldconfig -p | grep -m1 "$lib" || echo 'NOT FOUND')}"
done

if [ "${1:-}" = kinds ]; then
  say "the parameter server (synchronous, split, asynchronous) with GPU ranks; ZeRO 1, 2 and 3 (over NCCL: two GPUs)"
  timeout 300 "$BUNDLE/bin/gpu_kinds_test" --gtest_output="json:$OUT/gpu_kinds_test.json" 2>&1 \
    | tee "$OUT/gpu_kinds_test.txt" | grep -E "^\[|Failure|Expected|Which|error|SKIP"
  rc=${PIPESTATUS[0]}
  pkill -f "$BUNDLE/bin/lockstep-trainer" && say "stopped ranks a failed test left running"
  exit "$rc"
fi

say "0. smoke: five bf16 steps of a small model"
if ! timeout 45 "$TRAINER" --backend cuda --precision bf16 --activation gelu --layers 64,128,10 \
     --dataset synthetic:n=2048,dim=64,classes=10,seed=1 --batch-per-rank 256 --steps 5 --timeout-s 20 \
     --log-every 1 2>&1 | tee "$OUT/smoke.txt"; then
  say "the smoke run failed: stopping here (see $OUT/smoke.txt)"
  exit 3
fi

workload=(--layers 1024,4096,4096,4096,1000 --activation gelu --precision bf16 --batch-per-rank 8192
          --optimizer sgd --lr 0.01 --momentum 0.9 --dataset synthetic:n=65536,dim=1024,classes=1000,seed=1
          --timeout-s 20)
bench() {  # NAME [VAR=VALUE...]: 200 steps of the reference workload into $OUT/NAME.jsonl
  local name=$1
  shift
  env "$@" timeout 45 "$TRAINER" --backend cuda "${workload[@]}" --steps 200 --log-every 100 \
    --metrics-out "$OUT/$name.jsonl" 2>&1 | tee "$OUT/$name.txt"
}

say "1. reference MLP: lockstep-trainer --backend cuda"
bench bench

say "2. reference MLP: PyTorch (bench/gpu/mlp_reference.py)"
LD_LIBRARY_PATH=$MACHINE_LD_LIBRARY_PATH timeout 90 "$PY" "$ROOT/bench/gpu/mlp_reference.py" 2>"$OUT/torch.err" \
  | grep '^{' | tail -1 | tee "$OUT/torch.json"
tail -3 "$OUT/torch.err"

say "3. tests labelled gpu"
timeout 180 "$BUNDLE/bin/gpu_test" --gtest_output="json:$OUT/gpu_test.json" 2>&1 | tee "$OUT/gpu_test.txt" \
  | grep -E "^\[|Failure|Expected|Which|error"
tests_rc=${PIPESTATUS[0]}
pkill -f "$BUNDLE/bin/lockstep-trainer" && say "stopped ranks a failed test left running"

say "4. reference MLP: the heuristic's first GEMM algorithms; then no fused epilogues"
bench bench-heuristic LOCKSTEP_GEMM_TUNING=0
bench bench-unfused LOCKSTEP_GPU_FUSED=0

NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  say "5. where a step's time goes (nsys, 60 steps)"
  timeout 45 "$NSYS" profile --stats=false -o "$OUT/steps" --force-overwrite true \
    "$TRAINER" --backend cuda "${workload[@]}" --steps 60 --quiet >/dev/null 2>&1
  timeout 30 "$NSYS" stats --report cuda_gpu_kern_sum --format csv "$OUT/steps.nsys-rep" 2>/dev/null \
    | tee "$OUT/kernels.csv" | cut -d, -f1-4,9 | head -25
  rm -f "$OUT"/steps.sqlite
else
  say "5. no nsys on this machine: no per-kernel breakdown"
fi

say "6. every collective: FSDP and a program's own all-reduce (bench/gpu/fsdp_check.py)"
LD_LIBRARY_PATH=$MACHINE_LD_LIBRARY_PATH LOCKSTEP_PYTHON_DIR=$BUNDLE/python timeout 90 "$PY" \
  "$ROOT/bench/gpu/fsdp_check.py" 2>"$OUT/fsdp.err" | tee "$OUT/fsdp.json"
fsdp_rc=${PIPESTATUS[0]}
tail -3 "$OUT/fsdp.err"
say "collectives check exit code $fsdp_rc"

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
    samples = statistics.mean(s["samples"] for s in tail) / (mean_ms / 1e3)
    split = {k: statistics.mean(s[f"{k}_time_us"] for s in tail) / 1e3 for k in ("data", "compute", "exposed_comm")}
    return {"step_ms_mean": mean_ms, "step_ms_median": statistics.median(s["step_time_us"] for s in tail) / 1e3,
            "samples_s": samples, "tflops": 6 * params * samples / 1e12, "split_ms": split,
            "steps": len(steps), "final_loss": steps[-1].get("global_loss")}

runs = {"lockstep": "bench", "lockstep_heuristic_gemms": "bench-heuristic", "lockstep_unfused": "bench-unfused"}
res = {key: figures(name) for key, name in runs.items()}
try:
    res["torch"] = json.loads(open(f"{out}/torch.json").read())
    for key in runs:
        if isinstance(res[key], dict):
            res[key]["ratio_vs_ddp"] = res[key]["samples_s"] / res["torch"]["mlp_ddp1"]["samples_s"]
            res[key]["ratio_vs_plain"] = res[key]["samples_s"] / res["torch"]["mlp_plain"]["samples_s"]
except Exception as e:  # PyTorch's run failed: say so, keep ours
    res["torch"] = repr(e)
print(json.dumps(res, indent=1))
json.dump(res, open(f"{out}/figures.json", "w"), indent=1)
PY
say "tests exit code $tests_rc, collectives check $fsdp_rc"
[ "$tests_rc" -ne 0 ] && exit "$tests_rc"
exit "$fsdp_rc"
