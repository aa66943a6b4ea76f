#!/usr/bin/env bash
# Real one-node Slurm cluster for integration tests (CTest label "slurm").
#
#   slurm_fixture.sh start DIR   # start munged + slurmctld + slurmd, all state under DIR
#   slurm_fixture.sh env   DIR   # print the exports a client needs (eval "$(... env DIR)")
#   slurm_fixture.sh stop  DIR   # cancel jobs, stop every daemon, leave nothing running
#
# Needs root and Debian 12's packages:  apt-get install -y --no-install-recommends slurm-wlm munge
# Exit status 77 (CTest SKIP_RETURN_CODE) when those are missing or we are not root.
#
# Nothing under /etc is read or written: every daemon gets its paths on the command line or in
# DIR/slurm.conf.  Slurm looks for its other config files (plugstack.conf, cgroup.conf, ...) next to
# slurm.conf, and the auth/munge plugin finds munged through AuthInfo=socket=DIR/munge.sock, so
# clients only need SLURM_CONF.  (The munge/unmunge CLI has no env var: pass --socket=DIR/munge.sock.)
#
# Findings (Slurm 22.05.8, no slurmdbd so no sacct): a finished job's state stays visible in
# "scontrol show job ID" (JobState=COMPLETED/CANCELLED/FAILED/TIMEOUT, Reason=, ExitCode=) for
# MinJobAge=300 s.  Time limits are whole minutes: --time=0:10 or 00:00:10 become TimeLimit=00:01:00,
# --time=0 is UNLIMITED.  slurmctld checks limits every 30 s, so --time=1 ends as JobState=TIMEOUT
# Reason=TimeLimit after 60-90 s (OverTimeLimit=0).  Faster: "scontrol update JobId=ID EndTime=now"
# on a running job -> TIMEOUT at the next 30 s check (seen after 10-17 s).
set -euo pipefail

START_TIMEOUT=${SLURM_FIXTURE_TIMEOUT:-30}   # seconds for each wait in "start"
STOP_TIMEOUT=10                              # seconds between SIGTERM and SIGKILL
FIXTURE=slurm_fixture
# shellcheck source=fixture_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/fixture_lib.sh"

die() { echo "slurm_fixture: $*" >&2; exit 1; }
usage() { echo "usage: $0 start|stop|env DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
cmd=$1
mkdir -p "$2"
DIR=$(cd "$2" && pwd)            # absolute: it ends up in slurm.conf and in daemon command lines
CONF=$DIR/slurm.conf
MARK="LOCKSTEP_SLURM_FIXTURE=$DIR"   # set in every daemon's environment (inherited by slurmstepd)

# Pids of processes carrying our marker in their environment (daemons and their slurmstepds).
marked_pids() {
    local p
    for p in /proc/[0-9]*; do
        [[ ${p#/proc/} != "$$" && ${p#/proc/} != "$BASHPID" ]] || continue
        grep -qszxF "$MARK" "$p/environ" && echo "${p#/proc/}"
    done
    return 0
}

logs() {
    local f
    for f in "$DIR"/log/*; do
        [[ -f $f ]] && { echo "----- tail $f"; tail -n 25 "$f"; }
    done >&2
}

# Failed start: show the daemons' log tails, stop what did start (logs stay in DIR), exit 1.
fail() { logs; do_stop >/dev/null 2>&1 || true; die "$*"; }

do_stop() {
    export SLURM_CONF=$CONF
    # Cancel jobs first so slurmd can tear down their steps cleanly (bounded).
    if [[ -f $DIR/run/slurmctld.pid ]] && pid_from "$DIR/run/slurmctld.pid" "$DIR" >/dev/null; then
        local jobs
        jobs=$(timeout 5 squeue -h -o %i 2>/dev/null) || jobs=
        # shellcheck disable=SC2086 # one job id per word
        [[ -z $jobs ]] || timeout 5 scancel --full $jobs >/dev/null 2>&1 || true
        # shellcheck disable=SC2016 # expanded by the inner bash
        wait_for 10 bash -c '[[ -z $(timeout 5 squeue -h -t R,CG,PD -o %i) ]]' || true
    fi
    # Order: slurmd + slurmctld + leftover slurmstepds first, munged last (the others use it while
    # shutting down).
    local munged pids=() p
    munged=$(pid_from "$DIR/run/munged.pid" "$DIR") || munged=
    for p in $(pid_from "$DIR/run/slurmd.pid" "$DIR") $(pid_from "$DIR/run/slurmctld.pid" "$DIR") $(marked_pids); do
        [[ $p == "$munged" ]] || pids+=("$p")
    done
    kill_pids "${pids[@]}"
    mapfile -t pids < <(marked_pids)
    kill_pids ${munged:+"$munged"} "${pids[@]}"
    rm -f "$DIR"/run/*.pid "$DIR/munge.sock" "$DIR/munge.sock.lock"
    [[ -z $(marked_pids) ]] || die "processes still running: $(marked_pids)"
}

do_start() {
    [[ $EUID -eq 0 ]] || { echo "slurm_fixture: SKIP: needs root" >&2; exit 77; }
    local b
    for b in munged mungekey munge unmunge slurmctld slurmd sinfo srun scontrol; do
        command -v "$b" >/dev/null || {
            echo "slurm_fixture: SKIP: $b missing (apt-get install -y --no-install-recommends slurm-wlm munge)" >&2
            exit 77
        }
    done
    do_stop                                   # stale daemons from an earlier run in DIR
    rm -rf "$DIR"/{state,spool,log,run} "$CONF" "$DIR/plugstack.conf"
    mkdir -p "$DIR"/{state,spool,log,run}
    # munged insists that every directory above its socket is o+x, and that the key/log dirs are
    # not group/other-writable: 0755.
    chmod 0755 "$DIR"
    local t0=$SECONDS
    export LOCKSTEP_SLURM_FIXTURE=$DIR SLURM_CONF=$CONF   # = $MARK

    # --- munge: own key, socket, pid, log and seed file, all under DIR.
    mungekey --create --force --keyfile="$DIR/munge.key"
    munged --socket="$DIR/munge.sock" --key-file="$DIR/munge.key" --pid-file="$DIR/run/munged.pid" \
        --log-file="$DIR/log/munged.log" --seed-file="$DIR/run/munged.seed" ||
        fail "munged failed to start"
    wait_for "$START_TIMEOUT" bash -c "munge -n --socket='$DIR/munge.sock' | unmunge --socket='$DIR/munge.sock'" ||
        fail "munged does not answer on $DIR/munge.sock"

    # --- slurm.conf: ports chosen free now (tests may run next to a system Slurm or each other).
    local node ctld_port slurmd_port nodeline
    node=$(hostname -s)
    read -r ctld_port slurmd_port < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in ss))')
    # "NodeName=vm CPUs=2 Boards=1 ... RealMemory=N" (first line; the second is UpTime=).
    nodeline=$(slurmd -C | head -n 1)
    [[ $nodeline == NodeName=* ]] || fail "unexpected 'slurmd -C' output: $nodeline"
    : >"$DIR/plugstack.conf"
    cat >"$CONF" <<EOF
# Generated by $(basename "$0") for a throw-away test cluster.
ClusterName=lockstep-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.sock
PlugStackConfig=$DIR/plugstack.conf
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
# Finished jobs stay visible to "scontrol show job" for MinJobAge seconds (there is no slurmdbd/sacct).
MinJobAge=300
KillWait=5
OverTimeLimit=0
InactiveLimit=0
Waittime=0
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=30
$nodeline NodeHostname=$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

    # --- daemons (both fork into the background and write their pid files).
    slurmctld -f "$CONF" || fail "slurmctld failed to start"
    slurmd -f "$CONF" -N "$node" || fail "slurmd failed to start"
    wait_for "$START_TIMEOUT" bash -c "[[ \$(sinfo -h -n '$node' -o %T) == idle ]]" ||
        { sinfo -N -l >&2 || true; fail "node $node not idle after ${START_TIMEOUT}s"; }
    local out
    out=$(timeout "$START_TIMEOUT" srun -n2 --overcommit -t 1 hostname 2>"$DIR/log/srun-check.err") ||
        fail "'srun -n2 hostname' failed"
    [[ $(wc -l <<<"$out") -eq 2 ]] || { echo "$out" >&2; fail "'srun -n2 hostname' printed no 2 lines"; }
    echo "slurm_fixture: cluster up in $((SECONDS - t0))s (node $node, slurmctld port $ctld_port);" \
        "eval \"\$($0 env $DIR)\"" >&2
}

case $cmd in
start) do_start ;;
stop) do_stop ;;
env) echo "export SLURM_CONF=$CONF" ;;
*) usage ;;
esac
