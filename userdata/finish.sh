#!/usr/bin/env bash
# trainstack finish: the one way a run ends on a machine.
#   finish.sh COMPLETE|CANCELLED|FAILED|TIMED_OUT [REASON] [ATTEMPTS]
# COMPLETE and CANCELLED are written by the trainer; FAILED and TIMED_OUT are written here
# (JSON: outcome, reason, instance, time, step, attempts) unless the run already has an
# end marker. Then: a `finish` event in this machine's own event object, this machine's
# logs to <run>/logs/<instance>/, the stack's group scaled to zero (idempotent: any node
# may do it) and the machine shut down. Each step is tried even when an earlier one
# failed: a machine that stays up is the costliest outcome.
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
  json outcome="$outcome" "$MARKER_REASON=$reason" instance="$(instance_id)" "$TIME=$(now_iso)" \
    "$MARKER_STEP:=${step:--1}" "$MARKER_ATTEMPTS:=${attempts:-0}" | retry 5 store_put "$RUN_URI/$outcome"
  log "wrote $outcome: $reason"
}

upload_logs() {
  local dest
  dest="$RUN_URI/$LOGS_PREFIX$(instance_id)/"
  if command -v journalctl >/dev/null; then
    journalctl -b --no-pager -o short-iso -u trainstack-trainer.service -u trainstack-watcher.service \
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
  # One finish at a time, even if two paths reach it.
  exec 9>"$RUNTIME_DIR/finish.lock"
  flock 9
  log "finishing: $outcome${reason:+ ($reason)}"
  if [[ "$outcome" == "$FAILED" || "$outcome" == "$TIMED_OUT" ]]; then
    marker "$outcome" "$reason" "$attempts" || log "could not write the $outcome marker"
  fi
  event "$MACHINE_FINISH" outcome="$outcome" "$MARKER_REASON=$reason" || log "could not record the finish event"
  upload_logs || log "could not upload the logs"
  if retry 5 scale_to_zero; then
    log "group $TRAINSTACK_GROUP scaled to zero"
  else
    log "could not scale $TRAINSTACK_GROUP to zero; shutting down regardless"
  fi
  shutdown -h now
}

main "$@"
