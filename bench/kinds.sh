#!/usr/bin/env bash
# The kinds of data parallelism (issue 45) side by side in one run, on the CPU reference workload
# (MLP 784-1024-1024-10, batch 64 per rank, 2 ranks on this machine; SGD with momentum 0.9, so that
# there is optimizer state to shard): all-reduce, sharding (ZeRO 1-3), the parameter server
# synchronous (one, and split over the 2 ranks with --ps-ranks 2) and asynchronous. Each without
# and with a straggler (rank 1 made FACTOR times slower by LOCKSTEP_TEST_SLOWDOWN). Prints, over the second half of each run: samples/s, the
# median step, the exposed communication share, what each rank holds of the model's state, the
# mean loss of the last 20 updates, and the throughput ratio to all-reduce.
#
#   bench/kinds.sh [STEPS] [FACTOR]          (defaults: 300 steps, factor 3)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TRAINER=${LOCKSTEP_TRAINER:-$ROOT/build/bin/lockstep-trainer}
STEPS=${1:-300}
FACTOR=${2:-3}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT

KINDS=("allreduce|--sync allreduce" "shard-optimizer|--shard optimizer" "shard-gradients|--shard gradients"
       "shard-parameters|--shard parameters" "ps-sync|--sync parameter-server"
       "ps-split|--sync parameter-server --ps-ranks 2"
       "ps-async-k1|--sync parameter-server --staleness 1" "ps-async-k4|--sync parameter-server --staleness 4")

run() {  # name factor flags... -> one line of figures
  local name=$1 factor=$2
  shift 2
  LOCKSTEP_TEST_SLOWDOWN="1:$factor" "$TRAINER" --nproc 2 --layers 784,1024,1024,10 \
    --dataset synthetic:n=65536,dim=784,classes=10,seed=1 --batch-per-rank 64 --steps "$STEPS" --threads 1 \
    --optimizer sgd --lr 0.01 --momentum 0.9 --quiet --metrics-out "$DIR/$name-$factor.jsonl" "$@"
  /usr/bin/python3 - "$DIR/$name-$factor.jsonl" "$STEPS" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
half = int(sys.argv[2]) // 2
tail = [l for l in lines if l["step"] > half]
samples = sum(l["samples"] for l in tail)
seconds = (max(l["time_unix_us"] for l in tail) - min(l["time_unix_us"] - l["step_time_us"] for l in tail)) / 1e6
steps = [l["step_time_us"] / 1e3 for l in tail if l["rank"] == 0]
exposed = sum(l["exposed_comm_time_us"] for l in tail) / sum(l["step_time_us"] for l in tail)
most = lambda key: max(l.get(key) or 0 for l in tail) / 2**20
last = sorted((l["step"], l["global_loss"]) for l in lines if l.get("global_loss") is not None)
loss = statistics.mean(v for _, v in {s: v for s, v in last}.items() if _ > int(sys.argv[2]) - 20)
print(f"{samples / seconds:.0f} {statistics.median(steps):.2f} {100 * exposed:.1f} "
      f"{most('param_bytes'):.1f} {most('grad_bytes'):.1f} {most('optimizer_state_bytes'):.1f} {loss:.4f}")
PY
}

printf '%-16s %-9s %10s %8s %8s %9s %8s %9s %8s %7s\n' kind straggler samples/s "step ms" exposed% \
  "params MiB" "grads" "opt state" "loss" "x a-r"
for factor in 1 "$FACTOR"; do
  base=""
  for entry in "${KINDS[@]}"; do
    name=${entry%%|*}
    read -r -a flags <<<"${entry#*|}"
    read -r rate step exposed params grads state loss < <(run "$name" "$factor" "${flags[@]}")
    [ -z "$base" ] && base=$rate
    ratio=$(/usr/bin/python3 -c "print(f'{$rate / $base:.2f}')")
    printf '%-16s %-9s %10s %8s %8s %9s %8s %9s %8s %7s\n' "$name" "${factor}x" "$rate" "$step" "$exposed" \
      "$params" "$grads" "$state" "$loss" "$ratio"
  done
done
