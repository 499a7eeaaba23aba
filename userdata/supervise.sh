#!/usr/bin/env bash
# trainstack supervisor: the trainer unit's main process, started on every boot.
# Decides what this boot does from the run folder (finished? past its deadline?), runs
# bootstrap, then the trainer container until the run ends: exit 0 finishes the run,
# exit 143 after a spot notice waits for the cloud to take the machine, anything else
# restarts with backoff until TRAINSTACK_MAX_FAILURES failures in a row mark it FAILED.
# Every ending goes through finish.sh, which scales the group to zero and shuts down.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "${TRAINSTACK_LIB:-$(dirname "$0")/lib.sh}"

CONTAINER_ENV="$RUNTIME_DIR/container.env"

finish() {
  exec "$BIN_DIR/finish.sh" "$@"
}

# Every normal path ends in `exec finish.sh` or waits for the cloud; leaving this script
# any other way (an error under `set -e`) ends the run as FAILED rather than looping
# forever. SIGTERM is the machine shutting down: no verdict then.
on_exit() {
  trap - EXIT
  finish FAILED "the supervisor stopped unexpectedly (exit $1); see logs"
}

# The run's end markers are checked first, before any setup: a finished run costs only
# this listing.
check_run_folder() {
  local entries
  entries="$(retry 5 run_entries)" || finish FAILED "cannot read the run folder $RUN_URI"
  grep -qx COMPLETE <<<"$entries" && { log "run is COMPLETE"; finish COMPLETE; }
  grep -qx FAILED <<<"$entries" && { log "run is marked FAILED"; finish FAILED; }
  grep -qx TIMED_OUT <<<"$entries" && { log "run is marked TIMED_OUT"; finish TIMED_OUT; }
  if grep -qx deadline <<<"$entries"; then
    DEADLINE="$(retry 5 store_cat "$RUN_URI/deadline" | tr -dc 0-9)"
  else
    # First boot of the run: the deadline counts from now and is written once.
    DEADLINE=$(($(date +%s) + ${TRAINSTACK_MAX_RUNTIME_S:-86400}))
    printf '%s\n' "$DEADLINE" | retry 5 store_put "$RUN_URI/deadline"
    log "first boot of the run: deadline $(date -u -d "@$DEADLINE" +%Y-%m-%dT%H:%M:%SZ)"
  fi
  [[ -n "$DEADLINE" ]] || finish FAILED "the run's deadline file is empty"
  (($(date +%s) < DEADLINE)) || { log "deadline passed"; finish TIMED_OUT "the run's deadline passed"; }
}

# docker --env-file takes values literally (no shell quotes): written from the env file's
# own keys after the shell has read them.
write_container_env() {
  local key
  : >"$CONTAINER_ENV"
  while IFS= read -r key; do
    printf '%s=%s\n' "$key" "${!key}" >>"$CONTAINER_ENV"
  done < <(sed -n 's/^\([A-Z_][A-Z0-9_]*\)=.*/\1/p' "$ENV_FILE")
  printf 'TRAINSTACK_DATA_DIR=/data/stage\nTRAINSTACK_WORK_DIR=/data/work\n' >>"$CONTAINER_ENV"
}

# With several machines, TensorFlow's MultiWorkerMirroredStrategy needs TF_CONFIG: every
# worker's address in one order (sorted private IPs) and this machine's index in it. The
# group is read before each start, since a replaced machine has a new address.
tf_config() {
  local nodes="${TRAINSTACK_NODES:-1}" waited=0 ips me index
  ((nodes > 1)) || return 0
  me="$(private_ip)" || { log "cannot read this machine's private address"; return 1; }
  while true; do
    ips="$(group_ips)" || ips=""
    if [[ "$(grep -c . <<<"$ips")" -eq "$nodes" ]] && grep -qx "$me" <<<"$ips"; then break; fi
    if ((waited >= CLUSTER_WAIT_S)); then
      log "the group has $(grep -c . <<<"$ips") of $nodes machines running after ${waited}s"
      return 1
    fi
    sleep "$CLUSTER_POLL_S"
    waited=$((waited + CLUSTER_POLL_S))
  done
  index="$(grep -nx "$me" <<<"$ips" | cut -d: -f1)"
  python3 -c '
import json, sys
port, index, ips = sys.argv[1], int(sys.argv[2]), sys.stdin.read().split()
workers = [f"{ip}:{port}" for ip in ips]
print("TF_CONFIG=" + json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}},
                                separators=(",", ":")))
'  "$WORKER_PORT" "$((index - 1))" <<<"$ips" >>"$CONTAINER_ENV"
  log "worker $((index - 1)) of $nodes: $(tr '\n' ' ' <<<"$ips")"
}

# Runs the container in the foreground with a watchdog that stops it at the deadline.
run_container() {
  local remaining=$1 args pid watchdog rc=0
  args=(run --rm --name "$CONTAINER" --gpus all --network host --ipc host
    --stop-timeout "$GRACE_S" --env-file "$CONTAINER_ENV" -v "$DATA_DIR:/data")
  if [[ -n "$CODE_DIR" ]]; then
    args+=(-v "$CODE_DIR:/opt/trainstack/code:ro" -w /opt/trainstack/code)
    if [[ -n "$PIP_DIR" ]]; then
      args+=(-v "$PIP_DIR:/opt/trainstack/pip:ro" -e PYTHONPATH=/opt/trainstack/code:/opt/trainstack/pip)
    else
      args+=(-e PYTHONPATH=/opt/trainstack/code)
    fi
  fi
  docker rm -f "$CONTAINER" >/dev/null 2>&1 || true
  docker "${args[@]}" "$TRAINSTACK_IMAGE" python -m trainer &
  pid=$!
  (
    set +e
    sleep "$remaining" &
    trap 'kill $! 2>/dev/null; exit 0' TERM
    wait $!
    touch "$RUNTIME_DIR/deadline-hit"
    docker stop --time "$GRACE_S" "$CONTAINER" >/dev/null 2>&1 || true
  ) &
  watchdog=$!
  wait "$pid" || rc=$?
  kill "$watchdog" 2>/dev/null || true
  wait "$watchdog" 2>/dev/null || true
  return "$rc"
}

wait_for_cloud() {
  log "stopped for a spot notice: waiting for the cloud to take the machine back"
  sleep "$NOTICE_WAIT_S"
  log "still here ${NOTICE_WAIT_S}s after the notice: resuming training"
  rm -f "$NOTICE_FILE" "$RUNTIME_DIR/notice-handled"
}

main() {
  load_env
  trap 'on_exit $?' EXIT
  trap 'trap - EXIT; exit 143' TERM INT
  MAX_FAILURES="${TRAINSTACK_MAX_FAILURES:-3}"
  BACKOFF_S="${TRAINSTACK_RESTART_BACKOFF_S:-15}"
  # How long to wait, after stopping for a notice, for the cloud to take the machine back;
  # a notice that does not end the machine (GCE live maintenance) resumes training after it.
  NOTICE_WAIT_S="${TRAINSTACK_NOTICE_WAIT_S:-900}"
  # Several machines: how long a start waits for the whole group, and the workers' port.
  CLUSTER_WAIT_S="${TRAINSTACK_CLUSTER_WAIT_S:-900}"
  CLUSTER_POLL_S="${TRAINSTACK_CLUSTER_POLL_S:-10}"
  WORKER_PORT="${TRAINSTACK_WORKER_PORT:-2222}"
  log "boot: run $RUN_URI, group $TRAINSTACK_GROUP, image $TRAINSTACK_IMAGE"
  rm -f "$RUNTIME_DIR/deadline-hit"
  check_run_folder
  if ! "$BIN_DIR/bootstrap.sh"; then
    finish FAILED "$(cat "$RUNTIME_DIR/failure-reason" 2>/dev/null || echo "bootstrap failed; see logs")"
  fi
  # shellcheck source=/dev/null
  . "$STATE_DIR/paths"
  local failures rc remaining
  failures="$(cat "$STATE_DIR/failures" 2>/dev/null || echo 0)"
  while true; do
    [[ ! -e "$NOTICE_FILE" ]] || wait_for_cloud
    remaining=$((DEADLINE - $(date +%s)))
    ((remaining > 0)) || finish TIMED_OUT "the run's deadline passed"
    log "starting the trainer (failures in a row: $failures)"
    rc=0
    write_container_env
    if tf_config; then
      run_container "$remaining" || rc=$?
    else
      rc=75
    fi
    log "trainer exited with $rc"
    [[ ! -e "$RUNTIME_DIR/deadline-hit" ]] || finish TIMED_OUT "the run's deadline passed during training"
    if ((rc == 0)); then
      retry 5 run_entries | grep -qx COMPLETE && finish COMPLETE
      rc=70
      log "trainer exited 0 but the run has no COMPLETE marker"
    elif ((rc == 143)) && [[ -e "$NOTICE_FILE" ]]; then
      failures=0
      echo 0 >"$STATE_DIR/failures"
      continue
    fi
    failures=$((failures + 1))
    echo "$failures" >"$STATE_DIR/failures"
    ((failures < MAX_FAILURES)) ||
      finish FAILED "the trainer failed $failures times in a row (last exit $rc)" "$failures"
    log "restarting in $((BACKOFF_S * failures))s"
    sleep $((BACKOFF_S * failures))
  done
}

main "$@"
