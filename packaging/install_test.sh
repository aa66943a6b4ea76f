#!/usr/bin/env bash
# Install test of the Debian packages (issue 8): what a user does on a fresh Debian 12, in a root
# made here.
#
#   packaging/install_test.sh [DIR]     DIR holds lockstep_*.deb and lockstep-agent_*.deb;
#                                       without it, ./lockstep.sh package builds them first
#
# 1. debootstraps a minimal Debian 12 (bookworm) from the Debian mirror this machine uses;
# 2. installs both packages with apt (--no-install-recommends: Depends alone must be enough);
# 3. checks what postinst did: root's state directory and key pair, the unit enabled;
# 4. starts the agent with its unit's ExecStart=, CapabilityBoundingSet=, LimitNICE= and UMask=, as
#    root, in a network namespace of its own (its loopback port cannot clash with this machine's);
# 5. as a user alice: makes lockstepctl's and the app's keys, authorizes them in
#    /etc/lockstep/authorized_keys as alice's (user=alice), pins the agent's key, and runs
#    `lockstepctl nodes`; then a 2-rank CPU job, which must run as alice (its ranks must not
#    complain about SCHED_IDLE), its PDF report, and the app, offscreen, taking a screenshot;
# 6. stops the agent and purges both packages.
#
# Needs root (debootstrap, chroot, mounts, namespaces) and the Debian mirror; 1 to 2 minutes,
# most of it apt. LOCKSTEP_INSTALL_TEST_KEEP=1 keeps the root (build/install-test/root) to look at.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
BUILD=${LOCKSTEP_BUILD_DIR:-$REPO/build}
WORK=${LOCKSTEP_INSTALL_TEST_DIR:-$BUILD/install-test}
SUITE=bookworm

say() { printf '\033[1minstall test:\033[0m %s\n' "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

# ---------------------------------------------------------------------------------------------
# Inside the agent's network namespace (this script runs itself there): step 4 and 5.
if [ "${1:-}" = --inside-netns ]; then
  root=$2
  ip link set lo up
  unit=$root/lib/systemd/system/lockstep-agent.service
  setting() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }
  exec_start=$(setting ExecStart) caps=$(setting CapabilityBoundingSet)
  nice=$(setting LimitNICE) umask=$(setting UMask)
  [ -n "$exec_start" ] && [ -n "$caps" ] && [ -n "$nice" ] || fail "the unit lacks ExecStart=, CapabilityBoundingSet= or LimitNICE="
  [ -z "$(setting User)" ] || fail "the unit sets User=: the agent runs as root to run jobs as their users"
  user=root
  listen=$(sed -n 's/^listen *= *//p' "$root/etc/lockstep/agent.conf")
  address=${listen#tcp://}

  # As systemd would: limits set by root, then the user, no new privileges, a clean environment.
  # Raising a hard limit takes CAP_SYS_RESOURCE, which some containers do not give even to root.
  limits=(prlimit --nice="$nice:$nice" --)
  if ! prlimit --nice="$nice:$nice" true 2>/dev/null; then
    say "note: this machine cannot raise RLIMIT_NICE (no CAP_SYS_RESOURCE): LimitNICE=$nice is not applied"
    say "      and the ranks are expected to say that they cannot return from SCHED_IDLE"
    limits=()
  fi
  say "starting the agent as the unit does: as root with $caps, LimitNICE=$nice UMask=${umask:-0022} $exec_start"
  bounding=$(echo "$caps" | tr 'A-Z' 'a-z' | sed 's/cap_/+/g; s/ /,/g')
  chroot "$root" "${limits[@]}" \
    setpriv --bounding-set=-all,"$bounding" --no-new-privs -- \
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    sh -c "umask ${umask:-0022}; exec $exec_start" >"$WORK/agent.out" 2>"$WORK/agent.err" &
  agent=$!
  trap 'kill $agent 2>/dev/null || true' EXIT

  as_alice() {
    chroot "$root" setpriv --reuid=alice --regid=alice --init-groups -- \
      env -i HOME=/home/alice PATH=/usr/bin:/bin LANG=C.UTF-8 "$@"
  }
  as_alice lockstepctl keygen >/dev/null
  client_key=$(cat "$root/home/alice/.config/lockstep/client.pub")
  app_key=$(as_alice lockstep --print-key)
  # The node's admin authorizes the workstation's keys (README, "Installing from packages").
  printf 'user=alice %s alice@workstation lockstepctl\nuser=alice %s alice@workstation app\n' "$client_key" "$app_key" \
    >>"$root/etc/lockstep/authorized_keys"
  agent_key=$(cat "$root/var/lib/lockstep-agent/agent.pub")
  as_alice lockstepctl trust "$address" "$agent_key" >/dev/null

  tries=0
  until as_alice lockstepctl --timeout-s 1 nodes >/dev/null 2>&1; do
    kill -0 "$agent" 2>/dev/null || { cat "$WORK/agent.err" >&2; fail "the agent exited"; }
    [ $((tries += 1)) -le 30 ] || { cat "$WORK/agent.err" >&2; fail "lockstepctl nodes never succeeded"; }
    sleep 0.5
  done
  say "lockstepctl nodes:"
  as_alice lockstepctl nodes >&2 || fail "lockstepctl nodes"
  [ "$(awk '/^Uid:/ { print $2 }' "/proc/$agent/status")" = "$(chroot "$root" id -u "$user")" ] \
    || fail "the agent does not run as $user"
  if [ ${#limits[@]} -gt 0 ]; then
    [ "$(awk '/^Max nice priority/ { print $4 }' "/proc/$agent/limits")" = "$nice" ] \
      || fail "the agent's RLIMIT_NICE is not $nice"
  fi

  say "a 2-rank CPU job through the agent"
  as_alice lockstepctl start --wait --ranks 2 --job-id install-test --layers 64,128,4 \
    --dataset synthetic:n=4096,dim=64,classes=4,seed=1 --batch-per-rank 32 --steps 40 --lr 0.05 \
    >"$WORK/job.out" 2>&1 || { cat "$WORK/job.out" >&2; fail "the job did not finish"; }
  # Rank 0 says so when its compute thread could not come back from SCHED_IDLE.
  stuck=no
  as_alice lockstepctl logs install-test --rank 0 | grep -q "may not return from SCHED_IDLE" && stuck=yes
  if [ ${#limits[@]} -gt 0 ] && [ $stuck = yes ]; then
    fail "the ranks cannot leave SCHED_IDLE under the unit's limits (LimitNICE=$nice)"
  elif [ ${#limits[@]} -eq 0 ] && [ $stuck = no ]; then
    fail "rank 0 did not say it cannot leave SCHED_IDLE without LimitNICE: is the check still there?"
  fi
  as_alice lockstepctl status install-test | grep -q "^runs as alice$" || fail "the job did not run as alice"
  as_alice lockstepctl report install-test --out /home/alice/install-test.pdf >/dev/null
  [ "$(head -c 4 "$root/home/alice/install-test.pdf")" = "%PDF" ] || fail "no PDF report"
  say "job finished; its PDF report: $(stat -c %s "$root/home/alice/install-test.pdf") bytes"

  say "the app, offscreen, connected to the agent"
  as_alice env QT_QPA_PLATFORM=offscreen timeout 60 lockstep --screenshot /home/alice/app.png \
    --screenshot-after-ms 3000 >"$WORK/app.out" 2>&1 || { cat "$WORK/app.out" >&2; fail "the app did not run"; }
  [ "$(head -c 4 "$root/home/alice/app.png" | tail -c 3)" = "PNG" ] || fail "the app saved no screenshot"
  cp "$root/home/alice/app.png" "$WORK/app.png"

  kill -TERM "$agent"
  rc=0
  wait "$agent" || rc=$?
  trap - EXIT
  [ "$rc" = 0 ] || { cat "$WORK/agent.err" >&2; fail "the agent exited $rc on SIGTERM"; }
  exit 0
fi

# ---------------------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || fail "run as root (debootstrap, chroot and mounts need it)"
started=$(date +%s)

# The packages.
if [ $# -ge 1 ]; then
  debs=$(cd "$1" && pwd)
else
  "$REPO/lockstep.sh" package
  debs=$BUILD/packages
fi
version=$(cd "$REPO" && sed -n 's/^ *VERSION \([0-9.]*\)$/\1/p' CMakeLists.txt | head -n 1)
arch=$(dpkg --print-architecture)
desktop_deb=$debs/lockstep_${version}-1_${arch}.deb
node_deb=$debs/lockstep-agent_${version}-1_${arch}.deb
[ -f "$desktop_deb" ] && [ -f "$node_deb" ] || fail "no $desktop_deb and $node_deb"

# The mirror this machine's apt uses (deb822 or one-line sources), else Debian's.
mirror_of() {  # $1: a suite suffix ("" or "-security"), prints the URI of the first Debian source with it
  local suite=$SUITE$1
  cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v suite="$suite" '
    /^URIs:/ { uri = $2 } /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) { print uri; exit } }'
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk -v suite="$suite" '
    $1 == "deb" { for (i = 2; i <= NF; i++) if ($i == suite && $(i-1) ~ /^[a-z]+:/) { print $(i-1); exit } }'
  return 0
}
MIRROR=$(mirror_of "" | head -n 1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=$(mirror_of -security | head -n 1)
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}

command -v debootstrap >/dev/null || {
  say "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null
}

root=$WORK/root
cleanup() {
  local mount
  for mount in $(awk -v r="$root" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r); do
    umount -l "$mount" 2>/dev/null || true
  done
  if [ -z "${LOCKSTEP_INSTALL_TEST_KEEP:-}" ]; then rm -rf "$root"; fi
}
trap cleanup EXIT
cleanup
mkdir -p "$WORK"
rm -f "$WORK"/*.out "$WORK"/*.err "$WORK/app.png"

say "debootstrap $SUITE (minbase) from $MIRROR"
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$WORK/debootstrap.out" 2>&1 \
  || { tail -n 20 "$WORK/debootstrap.out" >&2; fail "debootstrap"; }
cat >"$root/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY $SUITE-security main
EOF
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mount -t proc proc "$root/proc"
mount -t sysfs -o ro sysfs "$root/sys"
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }

say "apt-get install ./$(basename "$desktop_deb") ./$(basename "$node_deb")"
mkdir -p "$root/tmp/debs"
cp "$desktop_deb" "$node_deb" "$root/tmp/debs/"
in_root apt-get update -q >"$WORK/apt.out" 2>&1 || { cat "$WORK/apt.out" >&2; fail "apt-get update"; }
in_root apt-get install -y -q --no-install-recommends "/tmp/debs/$(basename "$desktop_deb")" \
  "/tmp/debs/$(basename "$node_deb")" >>"$WORK/apt.out" 2>&1 || { tail -n 30 "$WORK/apt.out" >&2; fail "apt-get install"; }
grep '^lockstep-agent:' "$WORK/apt.out" >&2 || true

say "checking what the packages set up"
for package in lockstep lockstep-agent; do
  [ "$(in_root dpkg-query -W -f='${Status}' "$package")" = "install ok installed" ] || fail "$package is not installed"
done
in_root dpkg-query -W -f='${Conffiles}\n' lockstep-agent | grep -q ' /etc/lockstep/authorized_keys ' \
  || fail "authorized_keys is not a conffile"
[ "$(in_root stat -c '%U %a' /var/lib/lockstep-agent)" = "root 700" ] || fail "state directory: $(in_root stat -c '%U %a' /var/lib/lockstep-agent)"
[ "$(in_root stat -c '%U %a' /var/lib/lockstep-agent/agent.key)" = "root 600" ] || fail "no agent key pair made"
grep -qF "$(cat "$root/var/lib/lockstep-agent/agent.pub")" "$WORK/apt.out" || fail "postinst did not print the node's key"
[ -L "$root/etc/systemd/system/multi-user.target.wants/lockstep-agent.service" ] || fail "the unit is not enabled"
check_program() {
  in_root "$1" --version >/dev/null || fail "$1 --version"
  in_root "$1" --help >/dev/null || fail "$1 --help"
  [ -f "$root/usr/share/man/man1/$1.1.gz" ] || say "note: no man page for $1 (built without help2man)"
}
for program in lockstep lockstepctl lockstep-agent; do check_program "$program"; done

# A trainer linked with libraries from outside Debian (CUDA's, from /usr/local/cuda) names them in
# the package description; an admin installs them. Lend this machine's copies, read-only.
missing=$(in_root ldd /usr/bin/lockstep-trainer | awk '/not found/ { print $1 }')
if [ -n "$missing" ]; then
  say "lockstep-trainer needs libraries no Debian package provides: ${missing//$'\n'/ }"
  dpkg-deb -f "$node_deb" Description | grep -q "$(echo "$missing" | head -n 1)" \
    || fail "the package description does not name them"
  for lib in $missing; do
    path=$(ldd "$BUILD/bin/lockstep-trainer" | awk -v l="$lib" '$1 == l { print $3 }')
    [ -n "$path" ] || fail "$lib is not on this machine either"
    dir=$(dirname "$path")
    if ! mountpoint -q "$root$dir"; then
      mkdir -p "$root$dir"
      mount --bind -o ro "$dir" "$root$dir"
      echo "$dir" >>"$root/etc/ld.so.conf.d/lockstep-install-test.conf"
    fi
  done
  in_root ldconfig
  say "lent $(sort -u "$root/etc/ld.so.conf.d/lockstep-install-test.conf" | xargs) from this machine, as an admin would install them"
fi
check_program lockstep-trainer

in_root useradd --create-home --shell /bin/sh alice
unshare --net -- "$0" --inside-netns "$root"

say "purging both packages"
in_root apt-get purge -y -q lockstep lockstep-agent >>"$WORK/apt.out" 2>&1 || { tail -n 20 "$WORK/apt.out" >&2; fail "apt-get purge"; }
for gone in /usr/bin/lockstep-agent /usr/bin/lockstep /etc/lockstep /var/lib/lockstep-agent; do
  [ ! -e "$root$gone" ] || fail "$gone is still there after purge"
done

say "passed in $(($(date +%s) - started)) s (the app's screenshot: $WORK/app.png)"
