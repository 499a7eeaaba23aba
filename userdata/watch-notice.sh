#!/usr/bin/env bash
# trainstack notice watcher: polls the instance metadata for the cloud's warning that it
# is taking the machine back, and gives the trainer the warning's time to checkpoint.
#   AWS: IMDSv2 spot/instance-action (404 until a notice, 2 minutes ahead) and the
#        rebalance recommendation (an early hint: recorded, training goes on).
#   GCE: instance/preempted (TRUE about 30 s ahead) and instance/maintenance-event
#        (TERMINATE_ON_HOST_MAINTENANCE: GPU machines cannot migrate live).
# On a notice: a pending marker the supervisor reads, `docker stop --time GRACE` (SIGTERM,
# SIGKILL after the grace), and a spot_notice event in this machine's own event object
# (machine-events/<machine>.jsonl; the run's events.jsonl is the trainer's alone).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "${TRAINSTACK_LIB:-$(dirname "$0")/lib.sh}"

# Returns 0 when the cloud has announced a notice, with its kind and detail in NOTICE_KIND and
# NOTICE_DETAIL. A poll reads the metadata with md_read, in this shell: curl is its only process.
notice() {
  local body
  case "$TRAINSTACK_CLOUD" in
    aws)
      if md_read body spot/instance-action; then NOTICE_KIND=instance-action NOTICE_DETAIL="$body"; return 0; fi
      ;;
    gcp)
      md_read body preempted || body=""
      if [[ "$body" == TRUE ]]; then NOTICE_KIND=preempted NOTICE_DETAIL=TRUE; return 0; fi
      md_read body maintenance-event || body=""
      if [[ "$body" == TERMINATE_ON_HOST_MAINTENANCE ]]; then NOTICE_KIND=maintenance-event NOTICE_DETAIL="$body"; return 0; fi
      ;;
  esac
  return 1
}

# The AWS rebalance recommendation comes before any interruption and often without
# one: stopping on it would leave a paid machine idle, so it is only recorded.
rebalance() {
  local body
  [[ "$TRAINSTACK_CLOUD" == aws && ! -e "$RUNTIME_DIR/rebalance-seen" ]] || return 0
  md_read body events/recommendations/rebalance || return 0
  touch "$RUNTIME_DIR/rebalance-seen"
  log "rebalance recommendation: $body"
  event "$REBALANCE" cloud="$TRAINSTACK_CLOUD" detail="$body"
}

handle() {
  local kind="$1" detail="$2" start=$SECONDS
  log "spot notice ($kind): $detail; stopping the trainer with ${GRACE_S}s grace"
  printf '%s %s\n' "$kind" "$detail" >"$NOTICE_FILE"
  docker stop --time "$GRACE_S" "$CONTAINER" >/dev/null 2>&1 || log "no running trainer to stop"
  log "trainer stopped after $((SECONDS - start))s"
  event "$SPOT_NOTICE" cloud="$TRAINSTACK_CLOUD" kind="$kind" detail="$detail" grace_s:="$GRACE_S" \
    stop_s:="$((SECONDS - start))"
  touch "$RUNTIME_DIR/notice-handled"
}

main() {
  load_env
  POLL_S="${TRAINSTACK_POLL_S:-5}"
  log "watching for spot notices every ${POLL_S}s ($TRAINSTACK_CLOUD, $METADATA_URL)"
  while true; do
    if [[ ! -e "$RUNTIME_DIR/notice-handled" ]] && notice; then
      handle "$NOTICE_KIND" "$NOTICE_DETAIL"
    fi
    rebalance
    # The store's identity token, where the store is another cloud's: renewed here while the
    # machine lives (a stat per poll; a fetch every half hour), so the trainer's never ages out.
    federation_token || true
    sleep "$POLL_S"
  done
}

main "$@"
