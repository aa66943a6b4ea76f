#!/usr/bin/env bash
# The projection to other rank counts against measured runs (issue 19; docs/benchmarks.md): the
# CPU reference workload at 1, 2 and 4 ranks on this machine; the 1-rank and 2-rank runs project
# the rest (lockstep-bench-projection), which prints the error at each.
#
#   bench/projection.sh [--steps N]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${LOCKSTEP_BUILD_DIR:-$ROOT/build}/bin
STEPS=200
[ "${1:-}" = "--steps" ] && STEPS=$2
"$ROOT/lockstep.sh" build >&2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
WORKLOAD=(--backend cpu --layers 784,1024,1024,10 --dataset synthetic:n=65536,dim=784,classes=10,seed=1
          --batch-per-rank 64 --optimizer sgd --lr 0.01 --threads 1 --quiet --steps "$STEPS")
echo "cores: $(nproc)"
for ranks in 1 2 4; do
  "$BIN/lockstep-trainer" "${WORKLOAD[@]}" --nproc "$ranks" --metrics-out "$WORK/$ranks.jsonl"
done
"$BIN/lockstep-bench-projection" "$(nproc)" 1 "$WORK/1.jsonl" "$WORK/2.jsonl" "$WORK/4.jsonl"
