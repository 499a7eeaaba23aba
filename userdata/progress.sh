# shellcheck shell=bash
# trainstack progress watch, sourced by supervise.sh from the boot archive: whether the running
# trainer makes progress, and what the machine does when it has made none for longer than a bound
# (a hung collective, a bad GPU, a start that never reaches its first step). docs/boot.md says why.
#
# The signal is the run's progress.json, which the trainer's chief rewrites every
# --progress-every-seconds (10 s) while it trains and after each evaluation and committed
# checkpoint: the heartbeat the placement controller reads too. A change of its text is progress.
# The watch runs only while the trainer's container runs (never during the boot, the image pull,
# bootstrap or the rendezvous, which have their own bounds), in three phases:
#   starting   from the container's start to this attempt's first change of progress.json (the
#              lease, the peers, the checkpoint's restore, data staging up to the first step):
#              TRAINSTACK_START_STALL_S (3600 s) with neither a change nor the bytes of the
#              trainer's folders on the data disk moving (staging and a restore write there). Not in script mode: a command
#              that never uses fit.callbacks() writes no progress at all.
#   training   TRAINSTACK_STALL_S (1800 s) without a change (an evaluation pass or a synchronous
#              checkpoint upload must fit in it).
#   finishing  from the step that reaches the run's total: the final evaluation, commit, the best
#              checkpoint's read and the model's export: TRAINSTACK_END_STALL_S (7200 s) with
#              neither a change nor the disk moving (the export writes there). Not in script mode
#              either: what a command does after its last epoch is its own.
# A read of progress.json the store does not answer is no verdict: the bound starts again.
# On a stall the trainer is stopped (its notice grace, then SIGKILL), the machine records a
# `stalled` event and shuts down: the group, which keeps its size, brings a fresh machine, as it
# does for a spot machine taken back. TRAINSTACK_MAX_FAILURES stalls in a row (one per machine, or
# per generation with several machines: they stall together) without a newer committed checkpoint
# end the run FAILED instead, so a machine type that keeps hanging does not bill until the deadline.

# The stall's reason while the trainer is being stopped for it (in /run: one boot's).
STALLED_FILE="$RUNTIME_DIR/stalled"
# progress_doc's text for "not read yet".
UNREAD="-"

# progress_doc: progress.json's text, on one line; nothing when the run has none yet. Fails when
# the store does not answer.
progress_doc() {
  local doc entries
  if doc="$(STORE_TIMEOUT=60 store_cat "$RUN_URI/$PROGRESS_KEY" 2>/dev/null)"; then
    printf '%s\n' "$doc" | tr -d '\n'
    return 0
  fi
  # Absent, or no answer: the listing tells them apart.
  entries="$(run_entries)" || return 1
  ! grep -qxF "$PROGRESS_KEY" <<<"$entries"
}

# progress_step DOC: "step total" from a progress.json text ("0 0" when it has none).
progress_step() {
  python3 -c '
import json, sys
try:
    doc = json.loads(sys.argv[1])
    step, total = int(doc.get("step") or 0), int(doc.get("total") or 0)
except (ValueError, TypeError, AttributeError):
    step = total = 0
print(step, total)
' "$1"
}

# disk_used: the bytes of the trainer's own folders on the data disk (the container's /data/stage and
# /data/work: staging, a checkpoint's restore, the export). Not the file system's use: on the root
# volume the machine's own logs would move it.
disk_used() {
  local dir="${DATA_DIR:-$STATE_DIR/data}"
  { du -sb "$dir/stage" "$dir/work" 2>/dev/null || true; } | awk '{ n += $1 } END { print n + 0 }'
}

# A pause the trainer's end (TERM from run_container) cuts short.
progress_pause() {
  sleep "$1" &
  wait $!
}

progress_init() {
  P_PHASE=starting P_SINCE=$EPOCHSECONDS P_LAST="$UNREAD" P_USED="$(disk_used)" P_STEP=""
  P_START_S="${TRAINSTACK_START_STALL_S:-3600}" P_STALL_S="${TRAINSTACK_STALL_S:-1800}"
  P_END_S="${TRAINSTACK_END_STALL_S:-7200}"
  if [[ -n "${TRAINSTACK_COMMAND:-}" ]]; then P_START_S=0 P_END_S=0; fi
  P_LAST="$(progress_doc)" || P_LAST="$UNREAD"
}

# progress_poll: one look at the trainer's progress. 0: nothing to do; 1: stalled (P_REASON says how).
progress_poll() {
  local doc used bound total
  if ! doc="$(progress_doc)"; then
    P_SINCE=$EPOCHSECONDS
    log "progress.json: the store does not answer; the progress bound starts again"
    return 0
  elif [[ "$P_LAST" == "$UNREAD" ]]; then
    P_LAST="$doc" # the store's first answer: what this attempt's progress will change
  elif [[ "$doc" != "$P_LAST" ]]; then
    P_LAST="$doc" P_SINCE=$EPOCHSECONDS
    read -r P_STEP total < <(progress_step "$doc")
    if [[ "$P_PHASE" == starting ]]; then
      P_PHASE=training
      log "the trainer makes progress (step $P_STEP): it may go ${P_STALL_S}s without"
    fi
    if [[ "$P_PHASE" == training ]] && ((total > 0 && P_STEP >= total)); then
      P_PHASE=finishing
      log "the trainer reached its last step ($P_STEP): it may export for ${P_END_S}s without progress or disk writes"
    fi
  fi
  case "$P_PHASE" in
    training) bound=$P_STALL_S ;;
    starting) bound=$P_START_S ;;
    finishing) bound=$P_END_S ;;
  esac
  if [[ "$P_PHASE" != training ]]; then
    # Staging, a restore and an export write to the data disk: bytes landing are progress too.
    used="$(disk_used)"
    if [[ "$used" != "$P_USED" ]]; then P_USED="$used" P_SINCE=$EPOCHSECONDS; fi
    ((bound > 0)) || return 0
  fi
  ((EPOCHSECONDS - P_SINCE >= bound)) || return 0
  case "$P_PHASE" in
    training) P_REASON="the trainer made no progress for $((EPOCHSECONDS - P_SINCE))s after step $P_STEP" ;;
    starting) P_REASON="the trainer showed no progress for $((EPOCHSECONDS - P_SINCE))s after it started (no progress.json of its own, nothing written to the data disk)" ;;
    finishing) P_REASON="the trainer made no progress for $((EPOCHSECONDS - P_SINCE))s after its last step ($P_STEP: the final evaluation, commit or export), nothing written to the data disk" ;;
  esac
  return 1
}

# progress_watch: beside the trainer's container (run_container, in the background), one poll every
# TRAINSTACK_STALL_POLL_S (60 s); on a stall, writes its reason to STALLED_FILE and stops the container.
progress_watch() {
  set +e
  local poll="${TRAINSTACK_STALL_POLL_S:-60}"
  trap 'kill $! 2>/dev/null; exit 0' TERM
  rm -f "$STALLED_FILE"
  progress_init
  while true; do
    progress_pause "$poll"
    progress_poll || break
  done
  log "$P_REASON: stopping the trainer"
  printf '%s\n' "$P_REASON" >"$STALLED_FILE"
  docker stop --time "$GRACE_S" "$CONTAINER" >/dev/null 2>&1 || true
}

# stalled_count KEY COMMITTED: how many stalls (distinct keys, KEY among them) the run's machines
# recorded since its newest committed checkpoint COMMITTED.
stalled_count() {
  store_cat_all "$RUN_URI/${MACHINE_EVENTS_PREFIX%/}" | python3 -c '
import json, sys
key, committed, name = sys.argv[1:4]
keys = {key}
for line in sys.stdin:
    try:
        ev = json.loads(line)
    except ValueError:
        continue
    if isinstance(ev, dict) and ev.get(sys.argv[4]) == name and str(ev.get("committed")) == committed:
        keys.add(str(ev.get("key")))
print(len(keys))
' "$1" "$2" "$MACHINE_STALLED" "$EVENT"
}

# replace_stalled: after the trainer was stopped for a stall. Records it, then ends the run FAILED
# when it is the MAX_FAILURES-th in a row without a newer checkpoint; otherwise uploads this
# machine's logs and shuts down, and the group brings a fresh machine.
replace_stalled() {
  local reason committed key=instance stalls
  reason="$(cat "$STALLED_FILE")"
  committed="$(newest_committed)"
  # Several machines stall together (a collective waits for every worker): one stall a generation.
  if ((${TRAINSTACK_NODES:-1} > 1)); then key="generation-$(cat "$LAST_GENERATION_FILE" 2>/dev/null)"; else key="$(instance_id)"; fi
  event "$MACHINE_STALLED" "$MARKER_REASON=$reason" committed:="$committed" key="$key" ||
    log "could not record the stalled event"
  stalls="$(stalled_count "$key" "$committed")" || stalls=1
  if ((stalls >= MAX_FAILURES)); then
    finish "$FAILED" "$reason; $stalls machines in a row made no progress (newest checkpoint: step $committed)" "$stalls"
  fi
  log "$reason ($stalls/$MAX_FAILURES in a row): shutting down so that the group brings a fresh machine"
  if command -v journalctl >/dev/null; then
    journalctl -b --no-pager -o short-iso -u "$TRAINER_UNIT" >"$LOG_DIR/journal.log" 2>&1 || true
  fi
  retry 3 store_cp_dir "$LOG_DIR" "$RUN_URI/$LOGS_PREFIX$(instance_id)/" || log "could not upload the logs"
  trap - EXIT
  shutdown -h now
  exit 0
}
