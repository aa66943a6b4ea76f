# shellcheck shell=bash
# Shared by the cluster fixtures (sourced, not run): finding a fixture's own processes and stopping
# them, every wait bounded. The sourcing script sets FIXTURE (its name, for messages) and
# STOP_TIMEOUT (seconds between SIGTERM and SIGKILL).

# wait_for SECONDS CMD...: poll CMD every 0.5 s until it succeeds; fail after SECONDS.
wait_for() {
    local end=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || return 1
        sleep 0.5
    done
}

# pid_from FILE NEEDLE: the pid in FILE, only if that process is still ours (its command line
# contains NEEDLE): a stale pid file never names someone else's process.
pid_from() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] && grep -qsF "$2" "/proc/$pid/cmdline" && echo "$pid"
}

# kill_pids PID...: SIGTERM, wait up to STOP_TIMEOUT, then SIGKILL.
kill_pids() {
    [[ $# -gt 0 ]] || return 0
    kill -TERM "$@" 2>/dev/null || true
    local end=$((SECONDS + STOP_TIMEOUT)) p alive
    while :; do
        alive=()
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
        [[ ${#alive[@]} -gt 0 ]] || return 0
        if ((SECONDS >= end)); then
            echo "$FIXTURE: SIGKILL ${alive[*]}" >&2
            kill -KILL "${alive[@]}" 2>/dev/null || true
            sleep 0.5
            return 0
        fi
        sleep 0.2
    done
}
