#!/bin/bash
# What sampling costs the agent: its CPU use with 8 GPUs (the NVML stand-in of the tests, whose
# calls cost next to nothing, so this is the agent's own work: the sampler thread, numbering and
# buffering the samples) at 5 Hz and 20 Hz, side by side, with no client fetching (a fetch is one
# reply per batch, not per sample). Prints % of one core per 8 GPUs and the ratio.
#
#   bench/agent_sampling.sh [BUILD_DIR] [SECONDS]
set -euo pipefail
BUILD=${1:-build}
SECONDS_EACH=${2:-20}
GPUS=${LOCKSTEP_FAKE_NVML_GPUS:-8}
export LOCKSTEP_FAKE_NVML_GPUS=$GPUS
WORK=$(mktemp -d -p /var/tmp)  # not /tmp: each job has a private one
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

measure() {
  local hz=$1 port=$2 state="$WORK/agent-$1"
  "$BUILD/bin/lockstep-agent" --listen "tcp://127.0.0.1:$port" --state-dir "$state" --name "bench-$hz" \
    --nvml-library "$BUILD/tests/liblockstep_fake_nvml.so" --sample-hz "$hz" >"$WORK/agent-$hz.log" 2>&1 &
  local pid=$!
  for _ in $(seq 50); do [ -f "$state/agent.pub" ] && break; sleep 0.1; done
  sleep 2
  local before after
  before=$(ticks $pid)
  sleep "$SECONDS_EACH"
  after=$(ticks $pid)
  kill $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  awk -v t=$((after - before)) -v hz="$HZ" -v s="$SECONDS_EACH" -v g="$GPUS" \
    'BEGIN { printf "%.3f\n", 100 * t / hz / s * 8 / g }'
}

five=$(measure 5 17811)
twenty=$(measure 20 17812)
echo "agent CPU with $GPUS GPUs (NVML stand-in), % of one core per 8 GPUs, over ${SECONDS_EACH}s each:"
echo "  5 Hz:  $five"
echo "  20 Hz: $twenty"
awk -v a="$five" -v b="$twenty" 'BEGIN { if (a > 0) printf "  ratio 20 Hz / 5 Hz: %.2fx\n", b / a }'
