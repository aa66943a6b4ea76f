#!/usr/bin/env bash
# --balance dynamic against the even split, side by side in one run: two CPU ranks on this machine,
# rank 1 made FACTOR times slower (LOCKSTEP_TEST_SLOWDOWN stands in for slower hardware). Prints
# the median step time and throughput over the second half of each run, and their ratios.
#
#   bench/balance.sh [STEPS] [FACTOR...]          (defaults: 200 steps, factors 1 2 3)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TRAINER=${LOCKSTEP_TRAINER:-$ROOT/build/bin/lockstep-trainer}
STEPS=${1:-200}
shift || true
FACTORS=("${@:-1 2 3}")
[ ${#FACTORS[@]} -eq 1 ] && read -r -a FACTORS <<<"${FACTORS[0]}"
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT

run() {  # factor mode -> "median_step_ms samples_per_s rows0/rows1"
  LOCKSTEP_TEST_SLOWDOWN="1:$1" "$TRAINER" --nproc 2 --layers 784,512,512,10 \
    --dataset synthetic:n=16384,dim=784,classes=10,seed=1 --batch-per-rank 64 --steps "$STEPS" \
    --optimizer sgd --lr 0.01 --balance "$2" --quiet --metrics-out "$DIR/$1-$2.jsonl"
  /usr/bin/python3 - "$DIR/$1-$2.jsonl" "$STEPS" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
half = int(sys.argv[2]) // 2
tail = [l for l in lines if l["step"] > half]
steps = [l["step_time_us"] / 1e3 for l in tail if l["rank"] == 0]
rows = {r: statistics.median(l["samples"] for l in tail if l["rank"] == r) for r in (0, 1)}
samples = sum(l["samples"] for l in tail)
seconds = (max(l["time_unix_us"] for l in tail) - min(l["time_unix_us"] - l["step_time_us"] for l in tail)) / 1e6
print(f"{statistics.median(steps):.2f} {samples / seconds:.0f} {rows[0]:.0f}/{rows[1]:.0f}")
PY
}

printf '%-8s %-8s %12s %11s %10s\n' "slowdown" "balance" "step ms" "samples/s" "rows 0/1"
for f in "${FACTORS[@]}"; do
  read -r even_ms even_rate even_rows < <(run "$f" even)
  read -r dyn_ms dyn_rate dyn_rows < <(run "$f" dynamic)
  printf '%-8s %-8s %12s %11s %10s\n' "${f}x" even "$even_ms" "$even_rate" "$even_rows"
  printf '%-8s %-8s %12s %11s %10s\n' "${f}x" dynamic "$dyn_ms" "$dyn_rate" "$dyn_rows"
  /usr/bin/python3 -c "print(f'{\"\":8} ratio    {$dyn_ms/$even_ms:12.2f} {$dyn_rate/$even_rate:11.2f}')"
done
