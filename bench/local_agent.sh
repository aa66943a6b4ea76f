# Sourced by bench scripts: an agent on loopback with its state in $WORK/agent, and `ctl`, a
# lockstepctl paired with it. Needs BUILD and WORK; sets AGENT_PID; AGENT_ARGS (an array), if set,
# are more of the agent's flags. Its ranks may share cores (--cpu-overcommit yes): a bench machine
# of 2 cores stands in for nodes of many (docs/fences.md).
#   start_local_agent PORT NAME
ctl() { "$BUILD/bin/lockstepctl" --config-dir "$WORK/config" --no-history "$@"; }
start_local_agent() {
  "$BUILD/bin/lockstep-agent" --listen "tcp://127.0.0.1:$1" --state-dir "$WORK/agent" --name "$2" \
    --cpu-overcommit yes "${AGENT_ARGS[@]}" >"$WORK/agent.log" 2>&1 &
  AGENT_PID=$!
  for _ in $(seq 100); do [ -f "$WORK/agent/agent.pub" ] && break; sleep 0.1; done
  local key
  key=$(ctl keygen | tail -1)
  # Jobs run as the user the key names (docs/security.md): this one, and root only if it is root.
  echo "user=$(id -un)$([ "$(id -u)" = 0 ] && echo " allow-root") $key $2" >"$WORK/agent/authorized_keys"
  chmod 644 "$WORK/agent/authorized_keys"
  ctl trust "127.0.0.1:$1" "$(cat "$WORK/agent/agent.pub")" >/dev/null
}
