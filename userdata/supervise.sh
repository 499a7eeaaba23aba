#!/usr/bin/env bash
# trainstack supervisor: the trainer unit's main process, started on every boot.
# Decides what this boot does from the run folder (ended? past its deadline?), runs
# bootstrap (retried until the deadline when it fails for a passing reason), then the
# trainer container until the run ends: an end marker (COMPLETE or CANCELLED from the
# trainer, FAILED / TIMED_OUT from any machine) finishes the run, exit 143 after a spot
# notice waits for the cloud to take the machine, exit 78 (this machine can never run
# this run) is FAILED at once, exit 77 (another machine's trainer holds the run's lease) is
# tried again with backoff for a bounded time, waiting for the other machines
# (rendezvous.sh, bounded) or stopping with them after a peer's notice is no failure (75/76
# without progress are counted apart), anything else restarts with backoff until
# TRAINSTACK_MAX_FAILURES failures in a row without progress mark it FAILED (a driver upgraded
# under the machine reboots it once instead). Every ending goes through finish.sh, which
# scales the group to zero and shuts down, but a stall (progress.sh) replaces the machine instead.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "${TRAINSTACK_LIB:-$(dirname "$0")/lib.sh}"

CONTAINER_ENV="$RUNTIME_DIR/container.env"
# The supervisor's own code for an attempt that ended without a marker (EXIT_NO_CLUSTER,
# shared with the trainer, is in lib.sh).
EXIT_NO_MARKER=70
# ...and for a start that could not read this machine's own address.
EXIT_NO_ADDRESS=71

finish() {
  exec "$BIN_DIR/finish.sh" "$@"
}

# Every normal path ends in `exec finish.sh` or waits for the cloud; leaving this script
# any other way (an error under `set -e`) ends the run as FAILED rather than looping
# forever. SIGTERM is the machine shutting down: no verdict then.
on_exit() {
  # A subshell (the deadline's watchdog, killed as its trainer ends) can run this trap too, with
  # its own exit status: only the supervisor itself may end the run.
  [[ $BASHPID == "${SUPERVISOR_PID:-}" ]] || exit "$1"
  trap - EXIT
  finish "$FAILED" "the supervisor stopped unexpectedly (exit $1); see logs"
}

read_deadline() {
  local text
  text="$(store_cat "$RUN_URI/$DEADLINE_KEY")" || return 1
  DEADLINE="$(tr -dc 0-9 <<<"$text")"
}

# Each try writes the value again (a retried pipe would write nothing).
write_deadline() { printf '%s\n' "$DEADLINE" | store_put "$RUN_URI/$DEADLINE_KEY"; }

# The run's end markers are checked first, before any setup: a run that has ended costs
# only this listing. Each read and write is retried (lib.sh's retry_for): a store blip is no
# verdict on the run. A store unreadable for TRAINSTACK_STORE_WAIT_S ends the run: finish
# cannot write FAILED either, but its group to zero keeps replacements from the same wait.
check_run_folder() {
  local entries marker
  STORE_WAIT_S="${TRAINSTACK_STORE_WAIT_S:-600}"
  entries="$(retry_for "$STORE_WAIT_S" run_entries)" ||
    finish "$FAILED" "cannot read the run folder $RUN_URI: no answer for ${STORE_WAIT_S}s (see logs)"
  marker="$(end_marker_in "$entries")"
  if [[ -n "$marker" ]]; then
    log "run is $marker"
    finish "$marker"
  fi
  if grep -qxF "$DEADLINE_KEY" <<<"$entries"; then
    retry_for "$STORE_WAIT_S" read_deadline || finish "$FAILED" "cannot read the run's deadline: no answer for ${STORE_WAIT_S}s (see logs)"
  else
    # First boot of the run: the deadline counts from now and is written once.
    DEADLINE=$((EPOCHSECONDS + ${TRAINSTACK_MAX_RUNTIME_S:-86400}))
    retry_for "$STORE_WAIT_S" write_deadline || finish "$FAILED" "cannot write the run's deadline: no answer for ${STORE_WAIT_S}s (see logs)"
    log "first boot of the run: deadline $(date -u -d "@$DEADLINE" +%Y-%m-%dT%H:%M:%SZ)"
  fi
  [[ -n "$DEADLINE" ]] || finish "$FAILED" "the run's deadline file is empty"
  ((EPOCHSECONDS < DEADLINE)) || { log "deadline passed"; finish "$TIMED_OUT" "the run's deadline passed"; }
}

# Bootstrap until it succeeds. A failure it names in failure-reason (no GPU, a damaged
# code archive) ends the run as FAILED; any other failure (the image's own first-boot
# apt run holding the dpkg lock past bootstrap's wait, a mirror or registry that does not
# answer) is retried with a growing pause, for TRAINSTACK_BOOTSTRAP_WAIT_S (1 h) or until the
# run's deadline, whichever comes first. A try that hangs (a pull that never ends) is cut there.
run_bootstrap() {
  local tries=0 pause until=$((EPOCHSECONDS + ${TRAINSTACK_BOOTSTRAP_WAIT_S:-3600}))
  until boot_scripts && timeout -k 30 "$((until > EPOCHSECONDS ? until - EPOCHSECONDS : 1))" "$BIN_DIR/bootstrap.sh"; do
    if [[ -s "$RUNTIME_DIR/failure-reason" ]]; then
      finish "$FAILED" "$(cat "$RUNTIME_DIR/failure-reason")"
    fi
    tries=$((tries + 1))
    pause=$((BOOTSTRAP_BACKOFF_S * tries))
    ((pause <= 300)) || pause=300
    if ((EPOCHSECONDS + pause >= DEADLINE)); then
      finish "$TIMED_OUT" "the run's deadline passed while setting up the machine (bootstrap failed $tries times; see logs)"
    fi
    # The machine is paid and not training: an outage longer than this is no passing one
    # (a registry the subnet cannot reach, a mirror gone), and waiting on would bill to the deadline.
    if ((EPOCHSECONDS + pause >= until)); then
      finish "$FAILED" "could not set up the machine in ${TRAINSTACK_BOOTSTRAP_WAIT_S:-3600}s (bootstrap failed $tries times for a passing reason; see logs)"
    fi
    log "bootstrap failed for a passing reason ($tries so far); retrying in ${pause}s"
    sleep "$pause"
  done
}

# The reason in the trainer's last `failed` event (it says why the machine cannot run
# the run: the GPUs it sees, the libraries it found). Only the chief writes events.
last_failed_reason() {
  store_cat "$RUN_URI/$EVENTS_KEY" 2>/dev/null | python3 -c '
import json, sys
reason = ""
for line in sys.stdin:
    try:
        ev = json.loads(line)
    except ValueError:
        continue
    if isinstance(ev, dict) and ev.get(sys.argv[1]) == sys.argv[2] and ev.get("reason"):
        reason = str(ev["reason"])
print(reason[:500])
' "$EVENT" "$FAILED_EVENT" || true
}

# With several machines the chief writes the end marker after the last checkpoint and
# the model export, so another worker's trainer can end first. That worker waits for the
# marker (at most TRAINSTACK_FINISH_WAIT_S) and then finishes the same way: ending
# before the chief is no failure. Prints the marker; fails when none came in time.
wait_for_end_marker() {
  local until marker
  until=$((EPOCHSECONDS + FINISH_WAIT_S))
  log "the trainer ended before the run's end marker: waiting for the chief (up to ${FINISH_WAIT_S}s)"
  while ((EPOCHSECONDS < until)); do
    marker="$(end_marker)" || marker=""
    if [[ -n "$marker" ]]; then
      printf '%s\n' "$marker"
      return 0
    fi
    # CLUSTER_POLL_S may be a fraction of a second: sleep takes it, shell arithmetic not.
    sleep "$CLUSTER_POLL_S"
  done
  return 1
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
  # The trainer names this machine in the run's lease (runfolder/lease.py).
  printf 'TRAINSTACK_MACHINE_ID=%s\n' "$(instance_id 2>/dev/null || hostname)" >>"$CONTAINER_ENV"
}

# With several machines, TensorFlow's MultiWorkerMirroredStrategy needs TF_CONFIG: every
# worker's address in one order and this machine's index in it. The order comes from the
# generation's sealed record (rendezvous.sh), never from this machine's own listing.
# Returns 0 with TF_CONFIG written (or nothing to write for one machine); otherwise ends
# the run (an end marker, the deadline) or returns 1 (a notice is pending: the loop waits
# for the cloud) or 2 (no address: counted as this machine's failure).
tf_config() {
  local rc=0
  ((${TRAINSTACK_NODES:-1} > 1)) || return 0
  # The trainer's own bound on forming its cluster (it exits EXIT_NO_CLUSTER after it),
  # so a sealed member that never starts costs minutes, not the run.
  printf 'TRAINSTACK_STARTUP_TIMEOUT=%s\n' "$STARTUP_TIMEOUT_S" >>"$CONTAINER_ENV"
  join_generation || rc=$?
  case "$rc" in
    0) return 0 ;;
    "$JOIN_NOTICE") return 1 ;;
    "$JOIN_ENDED") finish "$END_MARKER" ;;
    "$JOIN_DEADLINE") finish "$TIMED_OUT" "the run's deadline passed while waiting for the other machines" ;;
    "$JOIN_FAILED") finish "$FAILED" "$JOIN_REASON" ;;
    *) return 2 ;;
  esac
}

# Runs the container in the foreground with a watchdog that stops it at the deadline, and the progress watch.
run_container() {
  local remaining=$1 args pid watchdog watch rc=0
  args=(run --rm --name "$CONTAINER" --gpus all --network host --ipc host
    --stop-timeout "$GRACE_S" --env-file "$CONTAINER_ENV" -v "$DATA_DIR:/data")
  if [[ -n "$CODE_DIR" ]]; then
    # The code stays read-only; the container starts in the data disk's work folder, where a script
    # runs in its own writable copy of the code (trainer/script.py), never on the root volume.
    mkdir -p "$DATA_DIR/work"
    args+=(-v "$CODE_DIR:/opt/trainstack/code:ro" -w /data/work)
    if [[ -n "$PIP_DIR" ]]; then
      args+=(-v "$PIP_DIR:/opt/trainstack/pip:ro" -e PYTHONPATH=/opt/trainstack/code:/opt/trainstack/pip)
      # TensorFlow dlopens its CUDA/cuDNN libraries by name: the wheels' lib/ folders
      # (trainer/requirements-gpu.txt) go first, before the image's own older ones.
      local libs="" d
      for d in "$PIP_DIR"/nvidia/*/lib; do
        if [[ -d "$d" ]]; then libs="${libs:+$libs:}/opt/trainstack/pip/${d#"$PIP_DIR"/}"; fi
      done
      [[ -z "$libs" ]] || args+=(-e "LD_LIBRARY_PATH=$libs:/usr/local/nvidia/lib:/usr/local/nvidia/lib64")
    else
      args+=(-e PYTHONPATH=/opt/trainstack/code)
    fi
  fi
  if [[ "$STORE_CLOUD" != "$TRAINSTACK_CLOUD" ]]; then
    # The store's credentials (federation-<store>.sh): the folder, not the file, so a renewal (a new file
    # renamed over the old) reaches the running trainer, and the variable its SDK reads it by.
    # Host networking lets it reach the metadata service (the AWS role's keys) as the host does.
    federation_token || true
    args+=("${FEDERATION_CONTAINER_ARGS[@]}")
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
  progress_watch &
  watch=$!
  wait "$pid" || rc=$?
  # The watch is not waited for: a store call it has under way ends it when it returns.
  kill "$watchdog" "$watch" 2>/dev/null || true
  wait "$watchdog" 2>/dev/null || true
  return "$rc"
}

wait_for_cloud() {
  log "stopped for a spot notice: waiting for the cloud to take the machine back"
  sleep "$NOTICE_WAIT_S"
  log "still here ${NOTICE_WAIT_S}s after the notice: resuming training"
  rm -f "$NOTICE_FILE" "$RUNTIME_DIR/notice-handled"
}

# A driver upgraded under the running machine (its libraries no longer match the loaded
# module) fails every later container until a reboot: not the trainer's failure. Reboot,
# once per machine; a mismatch that outlives it fails bootstrap's driver check (FAILED).
reboot_on_driver_mismatch() {
  local out
  out="$(nvidia-smi -L 2>&1)" && return 0
  grep -qi "version mismatch" <<<"$out" || return 0
  [[ ! -e "$STATE_DIR/driver-rebooted" ]] || finish "$FAILED" "the NVIDIA driver still fails after a reboot: $out"
  touch "$STATE_DIR/driver-rebooted"
  log "NVIDIA driver: $(tr '\n' ' ' <<<"$out"): rebooting once to load the updated driver"
  shutdown -r now || finish "$FAILED" "cannot reboot for the NVIDIA driver's update"
  trap - EXIT
  exit 0
}

# The cloud's CLI comes before the first read of the run folder: an image without one could
# not read the run, write FAILED or scale the group, and would shut down into a replacement
# that does the same. When none can be had within TRAINSTACK_CLI_WAIT_S (snap's store not
# answering), nothing can be told to the run or the group: the machine goes, and what it
# was launched for costs that bound once per launch (the cloud's runtime cap ends launches).
cli_first() {
  local until=$((EPOCHSECONDS + ${TRAINSTACK_CLI_WAIT_S:-300}))
  until cloud_cli; do
    if ((EPOCHSECONDS + 30 > until)); then
      local which="$TRAINSTACK_CLOUD"
      [[ "$STORE_CLOUD" == "$TRAINSTACK_CLOUD" ]] || which="$TRAINSTACK_CLOUD or $STORE_CLOUD"
      log "error: no $which CLI on this image and none could be installed: the run cannot be read, marked or its group scaled; shutting down"
      trap - EXIT
      shutdown -h now
      exit 0
    fi
    sleep 30
  done
}

main() {
  load_env
  SUPERVISOR_PID=$BASHPID
  trap 'on_exit $?' EXIT
  trap 'trap - EXIT; exit 143' TERM INT
  MAX_FAILURES="${TRAINSTACK_MAX_FAILURES:-3}"
  BACKOFF_S="${TRAINSTACK_RESTART_BACKOFF_S:-15}"
  BOOTSTRAP_BACKOFF_S="${TRAINSTACK_BOOTSTRAP_BACKOFF_S:-$BACKOFF_S}"
  # How long to wait, after stopping for a notice, for the cloud to take the machine back;
  # a notice that does not end the machine (GCE live maintenance) resumes training after it.
  NOTICE_WAIT_S="${TRAINSTACK_NOTICE_WAIT_S:-900}"
  # Several machines: how often a machine waiting for the others polls the rendezvous
  # (its heartbeat), after how long without one a member is taken as gone, the workers'
  # port, and how long a started trainer may wait for its cluster to form.
  CLUSTER_POLL_S="${TRAINSTACK_CLUSTER_POLL_S:-10}"
  RENDEZVOUS_TTL_S="${TRAINSTACK_RENDEZVOUS_TTL_S:-60}"
  WORKER_PORT="${TRAINSTACK_WORKER_PORT:-$WORKER_PORT_DEFAULT}"
  STARTUP_TIMEOUT_S="${TRAINSTACK_STARTUP_TIMEOUT:-600}"
  # How long a worker that ended first waits for the chief's end marker (model export).
  FINISH_WAIT_S="${TRAINSTACK_FINISH_WAIT_S:-1800}"
  log "boot: run $RUN_URI, group $TRAINSTACK_GROUP, image $TRAINSTACK_IMAGE"
  rm -f "$RUNTIME_DIR/deadline-hit"
  cli_first
  check_run_folder
  run_bootstrap
  # shellcheck source=/dev/null
  . "$STATE_DIR/paths"
  # From the boot archive (boot_scripts, above): the rendezvous (several machines) and the progress watch.
  # shellcheck source-path=SCRIPTDIR source=rendezvous.sh
  . "$(dirname "${TRAINSTACK_LIB:-$0}")/rendezvous.sh"
  # shellcheck source-path=SCRIPTDIR source=progress.sh
  . "$(dirname "${TRAINSTACK_LIB:-$0}")/progress.sh"
  local failures rc joined remaining marker reason before after pause
  failures="$(cat "$STATE_DIR/failures" 2>/dev/null || echo 0)"
  # Exit 77 tries in a row, since when, the pause unit and the bound.
  local lease_tries=0 lease_since=0 lease_retry_s="${TRAINSTACK_LEASE_RETRY_S:-30}"
  local lease_held_s="${TRAINSTACK_LEASE_HELD_S:-900}"
  # Generations ended 75/76 since the newest checkpoint was idle_step (kept across reboots).
  local idle=0 idle_step="" max_idle="${TRAINSTACK_MAX_IDLE_GENERATIONS:-5}"
  read -r idle idle_step 2>/dev/null <"$STATE_DIR/idle-generations" || true
  while true; do
    [[ ! -e "$NOTICE_FILE" ]] || wait_for_cloud
    remaining=$((DEADLINE - EPOCHSECONDS))
    ((remaining > 0)) || finish "$TIMED_OUT" "the run's deadline passed"
    log "starting the trainer (failures in a row: $failures)"
    before="$(newest_committed)"
    rc=0
    joined=0
    write_container_env
    tf_config || joined=$?
    if ((joined == 1)); then
      continue # a notice is pending: the top of the loop waits for the cloud
    elif ((joined == 2)); then
      rc=$EXIT_NO_ADDRESS
    else
      remaining=$((DEADLINE - EPOCHSECONDS))
      run_container "$remaining" || rc=$?
      log "trainer exited with $rc"
    fi
    [[ ! -e "$RUNTIME_DIR/deadline-hit" ]] || finish "$TIMED_OUT" "the run's deadline passed during training"
    ((rc == EXIT_LEASE_HELD)) || lease_since=0 lease_tries=0
    if ((rc == EXIT_PREEMPTED)) && [[ -e "$NOTICE_FILE" ]]; then
      # The notice's grace is short (GCE: 30 s): nothing more to do until the cloud acts.
      failures=0
      echo 0 >"$STATE_DIR/failures"
      continue
    fi
    # Whatever the exit, a run that has ended is finished here too: the trainer's
    # COMPLETE or CANCELLED (asked to stop), or another machine's FAILED / TIMED_OUT.
    marker="$(end_marker)" || marker=""
    [[ -z "$marker" ]] || finish "$marker"
    [[ ! -s "$STALLED_FILE" ]] || replace_stalled
    ((rc == EXIT_OK || rc == EXIT_PREEMPTED)) || reboot_on_driver_mismatch
    if ((rc == EXIT_OK)); then
      if ((${TRAINSTACK_NODES:-1} > 1)) && marker="$(wait_for_end_marker)"; then
        finish "$marker"
      fi
      rc=$EXIT_NO_MARKER
      log "trainer exited 0 but the run has no end marker"
    elif ((rc == EXIT_UNUSABLE)); then
      # This machine can never run this run (e.g. the GPUs asked for are not seen):
      # retrying would only bill the same failure again.
      reason="$(last_failed_reason)"
      finish "$FAILED" "the trainer cannot run on this machine (exit $rc): ${reason:-see logs}" "$((failures + 1))"
    elif ((rc == EXIT_LEASE_HELD)); then
      # Another machine's trainer holds the run's lease and kept renewing it: it trains
      # this run. One leaving (its notice) lets go within minutes: try again, pausing
      # longer each time. One holding it past TRAINSTACK_LEASE_HELD_S is outside this
      # group (`nodes` machines, this one among them): another stack runs this run. This
      # group stands down: no end marker (it would end that run), group to zero.
      lease_tries=$((lease_tries + 1))
      ((lease_since > 0)) || lease_since=$EPOCHSECONDS
      if ((EPOCHSECONDS - lease_since >= lease_held_s)); then
        finish "$CANCELLED" "another machine held the run's lease for $((EPOCHSECONDS - lease_since))s ($lease_tries tries): it trains this run; this group stands down without an end marker"
      fi
      pause=$((lease_retry_s * lease_tries > 300 ? 300 : lease_retry_s * lease_tries))
      log "another machine holds the run's lease: trying again in ${pause}s"
      sleep "$pause"
      continue
    elif ((rc == EXIT_NO_CLUSTER || rc == EXIT_PEER_LOST)); then
      # The trainer could not form its cluster in time (a sealed member never started)
      # or lost a peer while training: not this machine's failure; everyone moves to the
      # next generation. TRAINSTACK_MAX_IDLE_GENERATIONS of them without a newer checkpoint
      # are a cluster that cannot train (a blocked worker port): that ends the run.
      after="$(newest_committed)"
      idle_step="${idle_step:-$before}"
      if ((after > idle_step)); then idle=0 idle_step=$after; else idle=$((idle + 1)); fi
      echo "$idle $idle_step" >"$STATE_DIR/idle-generations"
      ((idle < max_idle)) ||
        finish "$FAILED" "the cluster formed $idle generations in a row without progress (last exit $rc); check the worker port ($WORKER_PORT) / security group between the machines"
      log "the cluster did not form or lost a peer (exit $rc; $idle/$max_idle idle): joining the next generation"
      continue
    elif ((rc == EXIT_PREEMPTED && ${TRAINSTACK_NODES:-1} > 1)); then
      # Stopped with the others after a peer's notice (the trainers stop together):
      # not this machine's failure; the next generation forms without that peer.
      log "stopped with the other workers after a peer's notice: joining the next generation"
      continue
    fi
    # Failures count in a row only while the run makes no progress: an attempt that
    # committed a newer checkpoint before it failed starts the count again, so a long
    # run is not ended by failures spread over days.
    after="$(newest_committed)"
    if ((after > before)); then
      log "the attempt committed step $after (from $before) before it failed: counting from 1"
      failures=0
    fi
    failures=$((failures + 1))
    echo "$failures" >"$STATE_DIR/failures"
    ((failures < MAX_FAILURES)) ||
      finish "$FAILED" "the trainer failed $failures times in a row (last exit $rc)" "$failures"
    log "restarting in $((BACKOFF_S * failures))s"
    sleep $((BACKOFF_S * failures))
  done
}

main "$@"
