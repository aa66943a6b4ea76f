#!/usr/bin/env bash
# Lockstep's entry point; README's two commands are its two verbs.
#
#   ./lockstep.sh run    build, start a local agent on loopback and open the app connected to it
#                        (without a display: run a 2-rank CPU job through lockstepctl instead)
#   ./lockstep.sh test   build, then run the whole test suite (ctest; without a GPU: -LE gpu)
#
# and, for maintainers: `build`, `package` (the Debian packages, in build/packages; README,
# "Installing from packages") and `screenshot [FILE]` (README's dashboard picture, under xvfb).
#
# Both install the Debian packages they need first (apt-get, through sudo when not root) and build
# into ./build (LOCKSTEP_BUILD_DIR to change). `run` keeps its agent's state and the app's keys in
# build/run and listens on 127.0.0.1:17700 (LOCKSTEP_RUN_PORT to change).
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
  nlohmann-json3-dev libgtest-dev libsqlite3-dev zlib1g-dev
  libcurl4-openssl-dev  # alerts' webhooks (HTTP, HTTPS)
  clang-14 libclang-rt-14-dev  # the protocol and store fuzzers (libFuzzer)
  iproute2  # the network partition test: two agents in network namespaces
  gdb  # a stalled native rank's backtrace (docs/stalls.md)
  python3-torch python3-numpy  # the PyTorch reference test, own-program jobs and bench/
  python3-zmq python3-protobuf  # the lockstep Python package reports with them
  python3-dev  # its progress record's writes in C (python/native/record.c)
  qt6-base-dev qt6-charts-dev qt6-svg-dev libqt6opengl6-dev libgl-dev  # the desktop app, PDF reports
  poppler-utils python3-jsonschema  # the report tests read PDFs back and check JSON against its schema
  dpkg-dev file help2man desktop-file-utils  # the Debian packages: shlibdeps, man pages, their test
  slurm-wlm munge prometheus curl  # real Slurm and Prometheus servers for the cluster tests (tests/cluster)
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
  # Paths under the checkout hash as relative ones, so that another clone on this machine (CI's,
  # a second work tree) reuses what ccache already compiled instead of building everything again.
  export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=true
  if [ ! -f "$BUILD/build.ninja" ]; then
    say "configuring $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  fi
  say "building with $JOBS jobs"
  cmake --build "$BUILD" -j "$JOBS"
}

have_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }

has_display() { [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ]; }

# The local agent of `run` (and `screenshot`), stopped with any job it still runs when the script
# ends. Its state and the clients' keys live in build/run.
BIN=$BUILD/bin
RUN=$BUILD/run
CONFIG=$RUN/config
AGENT_PID=
CTL=("$BIN/lockstepctl" --config-dir "$CONFIG")

start_local_agent() {
  local state=$RUN/agent address=127.0.0.1:${LOCKSTEP_RUN_PORT:-17700}
  mkdir -p "$state" "$CONFIG"
  chmod 700 "$state" "$CONFIG"
  # Keys: the agent's, the app's and lockstepctl's (created once); both clients authorized on the
  # agent, the agent's key pinned for both (they share known_agents).
  local agent_key
  agent_key=$("$BIN/lockstep-agent" --state-dir "$state" --print-key)
  "${CTL[@]}" keygen >/dev/null
  # Jobs run as the user each key names (docs/security.md): you, and root only if you are root.
  local options="user=$(id -un)"
  [ "$(id -u)" = 0 ] && options="$options allow-root"
  local keys=("$("$BIN/lockstep" --config-dir "$CONFIG" --print-key)" "$(cat "$CONFIG/client.pub")") key
  # Keys added by hand stay; this script's own are written again (an older line may lack user=).
  touch "$state/authorized_keys"
  grep -vF -e "${keys[0]}" -e "${keys[1]}" "$state/authorized_keys" >"$state/authorized_keys.new" || true
  for key in "${keys[@]}"; do echo "$options $key local client (lockstep.sh run)"; done >>"$state/authorized_keys.new"
  mv "$state/authorized_keys.new" "$state/authorized_keys"
  chmod 600 "$state/authorized_keys"  # the agent refuses a key file others may write
  "${CTL[@]}" trust "$address" "$agent_key" >/dev/null
  # Each job gets a private /tmp, where this build's trainer would not be: not for a build in /tmp.
  local flags=()
  case "$BUILD" in /tmp/* | /dev/shm/*) flags=(--job-private-tmp no) ;; esac

  say "starting an agent on $address (state and logs: $state)"
  "$BIN/lockstep-agent" --state-dir "$state" --listen "tcp://$address" "${flags[@]}" >"$RUN/agent.out" 2>>"$RUN/agent.err" &
  AGENT_PID=$!
  trap stop_local_agent EXIT
  trap 'exit 130' INT TERM
  local tries=0
  until "${CTL[@]}" --timeout-s 1 nodes >/dev/null 2>&1; do
    if ! kill -0 "$AGENT_PID" 2>/dev/null || [ $((tries += 1)) -gt 30 ]; then
      say "the agent did not start; its log ($RUN/agent.err) ends with:"
      tail -n 5 "$RUN/agent.err" >&2
      say "if the port is taken, choose another: LOCKSTEP_RUN_PORT=17701 ./lockstep.sh run"
      exit 1
    fi
    sleep 0.5
  done
}

stop_local_agent() {
  [ -n "$AGENT_PID" ] || return 0
  local job
  for job in $("${CTL[@]}" status 2>/dev/null | awk '$2 == "running" || $2 == "starting" { print $1 }'); do
    say "stopping job $job"
    "${CTL[@]}" stop "$job" >/dev/null || true
  done
  kill "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null || true
  AGENT_PID=
}

# A 2-rank CPU job on the local agent: an MLP on synthetic data (extra arguments are more flags).
start_demo_job() {
  "${CTL[@]}" start --ranks 2 --job-id "$1" --layers 784,1024,1024,10 \
    --dataset synthetic:n=65536,dim=784,classes=10,seed=1 --batch-per-rank 64 \
    --optimizer sgd --lr 0.05 --momentum 0.9 "${@:2}"
}

cmd_run() {
  build
  start_local_agent
  if has_display; then
    say "opening the app; New Job (Ctrl+N) starts a CPU job on this machine. Closing the app stops the agent."
    "$BIN/lockstep" --config-dir "$CONFIG" --new-job || true
    return
  fi
  say "no display here (DISPLAY and WAYLAND_DISPLAY are unset), so no app window."
  say "lockstepctl does everything without one; this is a 2-rank CPU job through it:"
  local job="demo-$(date +%Y%m%d-%H%M%S)" rc=0
  start_demo_job "$job" --steps 300
  "${CTL[@]}" watch "$job" || rc=$?
  # watch recorded the job in the history ($LOCKSTEP_HISTORY, else ~/.local/share/lockstep): its report.
  if "${CTL[@]}" report "$job" --out "$RUN/$job.html" >/dev/null; then
    say "the job's KPI report: $RUN/$job.html (also --out FILE.pdf, .json, .csv: ${CTL[*]} report $job --out FILE)"
  fi
  say "past jobs: ${CTL[*]} history; more: ${CTL[*]} --help (this agent runs only while this script does)"
  return "$rc"
}

# The README's screenshot: the app in a real (virtual) X window, watching a running job.
cmd_screenshot() {
  local out=${1:-$ROOT/docs/screenshots/dashboard.png}
  build
  ensure_packages xvfb xauth
  RUN=$BUILD/screenshot CONFIG=$BUILD/screenshot/config  # its own agent and keys: only this job on show
  export LOCKSTEP_HISTORY=$RUN/history.db
  CTL=("$BIN/lockstepctl" --config-dir "$CONFIG")
  rm -rf "$RUN"
  start_local_agent
  start_demo_job "screenshot-$(date +%H%M%S)" --steps 20000 --target-loss 0.05 --price-core-hour 0.048 --currency USD
  mkdir -p "$(dirname "$out")"
  xvfb-run -a -s "-screen 0 ${LOCKSTEP_SCREENSHOT_SCREEN:-1600x1000}x24" "$BIN/lockstep" --config-dir "$CONFIG" \
    --screenshot "$out" --screenshot-after-ms "${LOCKSTEP_SCREENSHOT_AFTER_MS:-30000}"
  say "saved $out"
}

# The Debian packages: lockstep (app, lockstepctl) and lockstep-agent (agent, trainer, systemd unit).
cmd_package() {
  build
  (cd "$BUILD" && cpack -G DEB -B "$BUILD/packages")
  say "packages: $(cd "$BUILD/packages" && ls ./*.deb | sed 's|^\./||' | tr '\n' ' ')(in $BUILD/packages)"
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
  run) shift; cmd_run ;;
  screenshot) shift; cmd_screenshot "$@" ;;
  test) shift; cmd_test "$@" ;;
  build) shift; build ;;
  package) shift; cmd_package ;;
  *)
    echo "usage: ./lockstep.sh run | test | build | package | screenshot [FILE.png]" >&2
    exit 2
    ;;
esac
