#!/usr/bin/env bash
# Lockstep's entry point; README's two commands are its two verbs.
#
#   ./lockstep.sh run    build, then train a 2-rank data-parallel job on synthetic data (CPU, Gloo)
#   ./lockstep.sh test   build, then run the whole test suite (ctest; without a GPU: -LE gpu)
#
# Both install the Debian packages they need first (apt-get, through sudo when not root) and build
# into ./build (LOCKSTEP_BUILD_DIR to change). Extra arguments to `run` go to lockstep-trainer.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=${LOCKSTEP_BUILD_DIR:-$ROOT/build}
JOBS=${LOCKSTEP_JOBS:-$(nproc)}

# What the build and the tests need, from Debian 12.
PACKAGES=(
  cmake ninja-build g++ ccache pkg-config
  libprotobuf-dev protobuf-compiler
  libzmq3-dev cppzmq-dev libsodium-dev
  libgloo-dev libopenblas-dev
  nlohmann-json3-dev libgtest-dev
  clang-14 libclang-rt-14-dev  # the protocol fuzzer (libFuzzer)
  python3-torch python3-numpy  # the PyTorch reference test and bench/
)

say() { printf '\033[1mlockstep:\033[0m %s\n' "$*" >&2; }

ensure_packages() {
  local missing=()
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { say "need root or sudo to install: ${missing[*]}"; exit 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

build() {
  ensure_packages "${PACKAGES[@]}"
  if [ ! -f "$BUILD/build.ninja" ]; then
    say "configuring $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  fi
  say "building with $JOBS jobs"
  cmake --build "$BUILD" -j "$JOBS"
}

have_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }

cmd_run() {
  build
  mkdir -p "$BUILD/run"
  say "training: 2 ranks x batch 64, MLP 784-1024-1024-10 on synthetic data (metrics: $BUILD/run/metrics.jsonl)"
  exec "$BUILD/bin/lockstep-trainer" --backend cpu --nproc 2 \
    --layers 784,1024,1024,10 --dataset synthetic:n=65536,dim=784,classes=10,seed=1 \
    --batch-per-rank 64 --steps 300 --optimizer sgd --lr 0.05 --momentum 0.9 --bucket-mb 4 \
    --metrics-out "$BUILD/run/metrics.jsonl" "$@"
}

cmd_test() {
  build
  local labels=()
  if ! have_gpu; then
    labels=(-LE gpu)
    say "no GPU here: skipping tests labelled gpu"
  fi
  ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" "${labels[@]}"
}

case "${1:-}" in
  run) shift; cmd_run "$@" ;;
  test) shift; cmd_test "$@" ;;
  build) shift; build ;;
  *)
    echo "usage: ./lockstep.sh run [trainer options...] | test | build" >&2
    exit 2
    ;;
esac
