#!/usr/bin/env bash
# trainstack finish: the one way a run ends on a machine.
#   finish.sh COMPLETE|CANCELLED|FAILED|TIMED_OUT [REASON] [ATTEMPTS]
# COMPLETE and CANCELLED are written by the trainer; FAILED and TIMED_OUT are written here
# (JSON: outcome, reason, instance, time, step, attempts) unless the run already has an
# end marker. Then: a `finish` event in this machine's own event object, this machine's
# logs to <run>/logs/<instance>/, the stack's group scaled to zero (idempotent: any node
# may do it; a failing call is retried for a bound, see scale_down) and the machine shut
# down. Each step is tried even when an earlier one failed: a machine that stays up is the
# costliest outcome.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "${TRAINSTACK_LIB:-$(dirname "$0")/lib.sh}"

marker() {
  local outcome="$1" reason="$2" attempts="$3" existing step
  existing="$(end_marker)" || existing=""
  if [[ -n "$existing" ]]; then
    log "run already has its end marker: $existing"
    return 0
  fi
  step="$(store_cat "$RUN_URI/$PROGRESS_KEY" 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(int(d.get("step", -1)))' 2>/dev/null)" || step=-1
  MARKER_BODY="$(json outcome="$outcome" "$MARKER_REASON=$reason" instance="$(instance_id)" "$TIME=$(now_iso)" \
    "$MARKER_STEP:=${step:--1}" "$MARKER_ATTEMPTS:=${attempts:-0}")"
  # Each try writes the body again: a retried pipe would write an empty marker.
  retry 5 put_marker "$RUN_URI/$outcome"
  log "wrote $outcome: $reason"
}

put_marker() { printf '%s\n' "$MARKER_BODY" | store_put "$1"; }

upload_logs() {
  local dest
  dest="$RUN_URI/$LOGS_PREFIX$(instance_id)/"
  if command -v journalctl >/dev/null; then
    journalctl -b --no-pager -o short-iso -u "$TRAINER_UNIT" -u "$WATCHER_UNIT" \
      >"$LOG_DIR/journal.log" 2>&1 || true
  fi
  if [[ -r "$ROOT/var/log/cloud-init-output.log" ]]; then
    cp "$ROOT/var/log/cloud-init-output.log" "$LOG_DIR/" || true
  fi
  retry 3 store_cp_dir "$LOG_DIR" "$dest"
}

main() {
  local usage="usage: finish.sh ${END_MARKERS[*]} [REASON] [ATTEMPTS]"
  local outcome="${1:?$usage}" reason="${2:-}" attempts="${3:-0}"
  is_end_marker "$outcome" || die "unknown outcome $outcome; $usage"
  load_env
  SCALE_WAIT_S="${TRAINSTACK_SCALE_WAIT_S:-600}"
  # One finish at a time, even if two paths reach it.
  exec 9>"$RUNTIME_DIR/finish.lock"
  flock 9
  log "finishing: $outcome${reason:+ ($reason)}"
  if [[ "$outcome" == "$FAILED" || "$outcome" == "$TIMED_OUT" ]]; then
    marker "$outcome" "$reason" "$attempts" || log "could not write the $outcome marker"
  fi
  event "$MACHINE_FINISH" outcome="$outcome" "$MARKER_REASON=$reason" || log "could not record the finish event"
  upload_logs || log "could not upload the logs"
  scale_down || true
  shutdown -h now
}

# One call to scale the group to zero; its error text, one line, is why it failed.
scale_once() {
  local err="$RUNTIME_DIR/scale.err"
  scale_to_zero 2>"$err" && return 0
  SCALE_WHY="$(head -c 400 "$err" | tr -s '\n' ' ' | sed 's/^ //; s/ $//')"
  RETRY_SAYS="could not scale $TRAINSTACK_GROUP to zero: ${SCALE_WHY:-no error text}"
  return 1
}

# The group to zero. Without it the group replaces this machine when it shuts down, and
# the replacement finds the run ended and comes here again: a relaunch loop that only the
# cloud's runtime cap (scheduled action / Cloud Scheduler job) ends, since no machine can
# keep a group from replacing it (a stopped machine is replaced too). So the machine that
# ended the run keeps trying for SCALE_WAIT_S (throttling, IAM still propagating and
# endpoint blips pass in minutes); a machine launched after an earlier one already failed
# (its scale_failed event) tries for 30 s and goes, its boot being what each turn costs.
scale_down() {
  local earlier wait_s=$SCALE_WAIT_S
  earlier="$(store_cat_all "$RUN_URI/${MACHINE_EVENTS_PREFIX%/}" | grep -c "\"$EVENT\": \"$MACHINE_SCALE_FAILED\"")" || earlier=0
  if ((earlier > 0)); then
    wait_s=30
    log "$earlier earlier machine(s) of this run could not scale the group: trying for ${wait_s}s"
  fi
  SCALE_WHY=""
  if ! retry_for "$wait_s" scale_once; then
    log "could not scale $TRAINSTACK_GROUP to zero in ${wait_s}s: ${SCALE_WHY:-no error text}; shutting down"
    event "$MACHINE_SCALE_FAILED" "$MARKER_REASON=$SCALE_WHY" "earlier:=$earlier" || true
    return 1
  fi
  log "group $TRAINSTACK_GROUP scaled to zero"
}

main "$@"
