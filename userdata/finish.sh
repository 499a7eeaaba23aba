#!/usr/bin/env bash
# trainstack finish: the one way a run ends on a machine.
#   finish.sh COMPLETE|FAILED|TIMED_OUT [REASON] [ATTEMPTS]
# Writes the FAILED / TIMED_OUT marker (JSON) unless the run already has an end marker,
# uploads this machine's logs to <run>/logs/<instance>/, scales the stack's group to
# zero (idempotent: any node may do it) and shuts the machine down. Each step is tried
# even when an earlier one failed: a machine that stays up is the costliest outcome.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "${TRAINSTACK_LIB:-$(dirname "$0")/lib.sh}"

marker() {
  local outcome="$1" reason="$2" attempts="$3" entries step
  entries="$(retry 3 run_entries)" || entries=""
  if grep -qxE 'COMPLETE|FAILED|TIMED_OUT' <<<"$entries"; then
    log "run already has its end marker: $(grep -xE 'COMPLETE|FAILED|TIMED_OUT' <<<"$entries" | tr '\n' ' ')"
    return 0
  fi
  step="$(store_cat "$RUN_URI/progress.json" 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(int(d.get("step", d.get("global_step", -1))))' \
      2>/dev/null)" || step=-1
  json outcome="$outcome" reason="$reason" instance="$(instance_id)" time="$(now_iso)" \
    final_step:="${step:--1}" attempts:="${attempts:-0}" | retry 5 store_put "$RUN_URI/$outcome"
  log "wrote $outcome: $reason"
}

upload_logs() {
  local dest
  dest="$RUN_URI/logs/$(instance_id)/"
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
  local outcome="${1:?usage: finish.sh COMPLETE|FAILED|TIMED_OUT [REASON] [ATTEMPTS]}"
  local reason="${2:-}" attempts="${3:-0}"
  case "$outcome" in COMPLETE | FAILED | TIMED_OUT) ;; *) die "unknown outcome $outcome" ;; esac
  load_env
  # One finish at a time, even if two paths reach it.
  exec 9>"$RUNTIME_DIR/finish.lock"
  flock 9
  log "finishing: $outcome${reason:+ ($reason)}"
  if [[ "$outcome" != COMPLETE ]]; then
    marker "$outcome" "$reason" "$attempts" || log "could not write the $outcome marker"
  fi
  upload_logs || log "could not upload the logs"
  if retry 5 scale_to_zero; then
    log "group $TRAINSTACK_GROUP scaled to zero"
  else
    log "could not scale $TRAINSTACK_GROUP to zero; shutting down regardless"
  fi
  shutdown -h now
}

main "$@"
