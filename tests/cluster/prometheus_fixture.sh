#!/usr/bin/env bash
# Real Prometheus server for integration tests (CTest label "slurm").
#
#   prometheus_fixture.sh start DIR TARGET   # TARGET = HOST:PORT serving /metrics; scraped every 1 s,
#                                            # or file_sd:PATTERN: the targets Prometheus' file-based
#                                            # service discovery reads from files matching PATTERN
#   prometheus_fixture.sh stop  DIR          # (a TARGET argument is accepted and ignored)
#
# "start" prints the port on stdout and writes it to DIR/port; query with
#   curl "http://127.0.0.1:$(cat DIR/port)/api/v1/query?query=NAME"
# Needs Debian 12's package:  apt-get install -y --no-install-recommends prometheus
# Exit status 77 (CTest SKIP_RETURN_CODE) when the binary or curl is missing.
# Runs as a plain background process (not systemd); nothing under /etc or /var/lib is used.
# PROMETHEUS_FIXTURE_METRICS_PATH overrides the scrape path (default /metrics).
#
# Verified with Debian 12's prometheus 2.42.0+ds: the first scrape lands ~5 s after "ready" (the scrape
# manager applies targets on a 5 s tick), then every 1 s, so poll queries for ~10 s.  It accepts both
# "text/plain; version=0.0.4" (the classic text format) and "application/openmetrics-text;
# version=1.0.0" -- but OpenMetrics bodies MUST end with "# EOF" (else the target goes down with
# "data does not end with # EOF").  Unknown content types are parsed as the classic text format.
set -euo pipefail

START_TIMEOUT=${PROMETHEUS_FIXTURE_TIMEOUT:-30}   # seconds to wait for /-/ready
STOP_TIMEOUT=10                                   # seconds between SIGTERM and SIGKILL
FIXTURE=prometheus_fixture
# shellcheck source=fixture_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/fixture_lib.sh"

die() { echo "prometheus_fixture: $*" >&2; exit 1; }
usage() { echo "usage: $0 start DIR HOST:PORT | stop DIR" >&2; exit 2; }
[[ $# -ge 2 ]] || usage
cmd=$1
mkdir -p "$2"
DIR=$(cd "$2" && pwd)
PIDFILE=$DIR/prometheus.pid

do_stop() {
    local pid
    if pid=$(pid_from "$PIDFILE" "$DIR/prometheus.yml"); then kill_pids "$pid"; fi
    rm -f "$PIDFILE" "$DIR/port"
}

do_start() {
    [[ $# -eq 3 ]] || usage
    local target=$3 b
    for b in prometheus curl python3; do
        command -v "$b" >/dev/null || {
            echo "prometheus_fixture: SKIP: $b missing (apt-get install -y --no-install-recommends prometheus curl)" >&2
            exit 77
        }
    done
    do_stop                                     # stale server from an earlier run in DIR
    rm -rf "$DIR/data"
    local t0=$SECONDS port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    cat >"$DIR/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: lockstep
    metrics_path: ${PROMETHEUS_FIXTURE_METRICS_PATH:-/metrics}
EOF
    if [[ $target == file_sd:* ]]; then
        cat >>"$DIR/prometheus.yml" <<EOF
    file_sd_configs:
      - files: ['${target#file_sd:}']
        refresh_interval: 1s
EOF
    else
        cat >>"$DIR/prometheus.yml" <<EOF
    static_configs:
      - targets: ['$target']
EOF
    fi
    # Background it ourselves (prometheus never daemonizes); setsid keeps it out of our process
    # group so a caller's Ctrl-C / CTest kill of this script does not take it down half-way.
    setsid prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/data" \
        --web.listen-address="127.0.0.1:$port" --log.level=info \
        </dev/null >"$DIR/prometheus.log" 2>&1 &
    echo $! >"$PIDFILE"
    local end=$((SECONDS + START_TIMEOUT))
    until curl -fsS -o /dev/null "http://127.0.0.1:$port/-/ready" 2>/dev/null; do
        if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null || ((SECONDS >= end)); then
            tail -n 30 "$DIR/prometheus.log" >&2
            do_stop
            die "prometheus not ready on 127.0.0.1:$port after $((SECONDS - t0))s (log above)"
        fi
        sleep 0.2
    done
    echo "$port" >"$DIR/port"
    echo "prometheus_fixture: ready in $((SECONDS - t0))s on http://127.0.0.1:$port scraping $target" >&2
    echo "$port"
}

case $cmd in
start) do_start "$@" ;;
stop) do_stop ;;
*) usage ;;
esac
