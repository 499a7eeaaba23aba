# shellcheck shell=bash
# trainstack common library, sourced by the boot scripts: paths, logging, retries, the
# run folder in the bucket, instance metadata and the few calls where AWS and GCP differ.
# Every path and endpoint can be moved by the environment so the scripts run unchanged
# in a sandbox: TRAINSTACK_ROOT prefixes /etc, /var, /opt and /run.
# Bash 5 or later (EPOCHSECONDS: the time without a process, in loops that poll for hours).
# The variables below are used by the scripts that source this file.
# shellcheck disable=SC2034

ROOT="${TRAINSTACK_ROOT:-}"
ENV_FILE="${TRAINSTACK_ENV_FILE:-$ROOT/etc/trainstack/env}"
STATE_DIR="$ROOT/var/lib/trainstack"
RUNTIME_DIR="$ROOT/run/trainstack"
LOG_DIR="$ROOT/var/log/trainstack"
OPT_DIR="$ROOT/opt/trainstack"
BIN_DIR="$OPT_DIR/bin"
CONTAINER="trainstack-trainer"
# components/machine.py is the one definition of these and the folders above;
# tests/userdata/test_machine_names.py compares them and checks no script spells one by hand.
TRAINER_UNIT="trainstack-trainer.service"
WATCHER_UNIT="trainstack-watcher.service"
JUPYTER_PORT=8888
JUPYTER_TOKEN_FILE="$RUNTIME_DIR/jupyter/token"
WORKER_PORT_DEFAULT=2222
NOTICE_FILE="$RUNTIME_DIR/notice-pending"

# ---- the run folder's names ----
# runfolder/layout.py is their one definition; the scripts cannot import it, so
# tests/userdata/test_layout_names.py sources this file and compares every value below
# with it, and checks that no script spells a run-folder name by hand.
CACHE_PREFIX="cache/"
PIP_CACHE_DIR="pip"
EVENTS_KEY="events.jsonl"
PROGRESS_KEY="progress.json"
CHECKPOINTS_PREFIX="checkpoints/"
CHECKPOINT_DIR="ckpt"
COMMITTED="COMMITTED"
DEADLINE_KEY="deadline"
LOGS_PREFIX="logs/"
MACHINE_EVENTS_PREFIX="machine-events/"
STOP_KEY="STOP"
RENDEZVOUS_PREFIX="rendezvous/"
COMPLETE="COMPLETE"
FAILED="FAILED"
TIMED_OUT="TIMED_OUT"
CANCELLED="CANCELLED"
END_MARKERS=("$COMPLETE" "$FAILED" "$TIMED_OUT" "$CANCELLED")
MARKER_STEP="step"
MARKER_ATTEMPTS="attempts"
MARKER_REASON="reason"
EVENT="event"
TIME="time"
FAILED_EVENT="failed"
SPOT_NOTICE="spot_notice"
REBALANCE="rebalance"
MACHINE_FINISH="finish"
MACHINE_SCALE_FAILED="scale_failed"
MACHINE_STALLED="stalled"
WAITING_FOR_MACHINES="waiting_for_machines"
# The trainer's exit codes (runfolder/exits.py).
EXIT_OK=0
EXIT_FAILED=1
EXIT_NO_CLUSTER=75
EXIT_PEER_LOST=76
EXIT_LEASE_HELD=77
EXIT_UNUSABLE=78
EXIT_PREEMPTED=143

log() {
  local line
  line="$(date -u +%Y-%m-%dT%H:%M:%SZ) ${0##*/}[$$]: $*"
  printf '%s\n' "$line" >&2
  printf '%s\n' "$line" >>"$LOG_DIR/trainstack.log" 2>/dev/null || true
}

die() {
  log "error: $*"
  exit 1
}

# Reads the non-secret env file written by cloud-init and sets the defaults that
# depend on the cloud (metadata endpoint, notice grace period). The machine's cloud
# (TRAINSTACK_CLOUD: metadata, group, notices) and the store's (TRAINSTACK_STORE_CLOUD, the
# bucket of the run folder; the machine's own by default) may differ: a GCE machine of an
# AWS-home stack reaches S3 with its Google identity (federation_token).
load_env() {
  mkdir -p "$STATE_DIR" "$RUNTIME_DIR" "$LOG_DIR"
  [[ -r "$ENV_FILE" ]] || die "env file $ENV_FILE is missing"
  set -a
  # shellcheck source=/dev/null
  . "$ENV_FILE"
  set +a
  local key
  for key in TRAINSTACK_CLOUD TRAINSTACK_REGION TRAINSTACK_RUN_URI TRAINSTACK_GROUP TRAINSTACK_IMAGE; do
    [[ -n "${!key:-}" ]] || die "$key is empty in $ENV_FILE"
  done
  RUN_URI="${TRAINSTACK_RUN_URI%/}"
  case "$TRAINSTACK_CLOUD" in
    aws) METADATA_URL="${TRAINSTACK_METADATA_URL:-http://169.254.169.254}"; DEFAULT_GRACE=100 ;;
    gcp) METADATA_URL="${TRAINSTACK_METADATA_URL:-http://metadata.google.internal}"; DEFAULT_GRACE=25 ;;
    *) die "TRAINSTACK_CLOUD must be aws or gcp, not '$TRAINSTACK_CLOUD'" ;;
  esac
  GRACE_S="${TRAINSTACK_NOTICE_GRACE_S:-$DEFAULT_GRACE}"
  STORE_CLOUD="${TRAINSTACK_STORE_CLOUD:-$TRAINSTACK_CLOUD}"
  [[ "$STORE_CLOUD" == "$TRAINSTACK_CLOUD" ]] || federation_env
  # A CLI installed from snap lives in /snap/bin, which systemd's PATH for units lacks.
  [[ ":$PATH:" == *:/snap/bin:* ]] || PATH="$PATH:/snap/bin"
}

# cloud_cli: the CLIs of the machine's cloud (its group) and of the store's (the bucket), from
# snap when the image has none (AWS's own aws-cli snap is CLI v2; Ubuntu images on GCE carry
# snapd). Every call to the bucket and the group goes through them, the run folder's first
# read included.
cloud_cli() {
  cli_of "$TRAINSTACK_CLOUD" || return 1
  [[ "$STORE_CLOUD" == "$TRAINSTACK_CLOUD" ]] || cli_of "$STORE_CLOUD"
}

cli_of() {
  local cli=aws snap=aws-cli
  [[ "$1" == aws ]] || { cli=gcloud; snap=google-cloud-cli; }
  command -v "$cli" >/dev/null && return 0
  log "no $cli on this image: installing $snap from snap"
  retry 3 snap install "$snap" --classic && command -v "$cli" >/dev/null
}

# retry_for SECONDS CMD...: runs CMD until it succeeds, for at most SECONDS, the pause doubling
# from TRAINSTACK_RETRY_BASE_S (2 s) up to a minute. CMD may set RETRY_SAYS to say its failure.
retry_for() { _retry "$1" 0 "${@:2}"; }
# retry ATTEMPTS CMD...: the same, for at most ATTEMPTS runs of CMD.
retry() { _retry 0 "$1" "${@:2}"; }
_retry() {
  local seconds="$1" attempts="$2" i=1 pause="${TRAINSTACK_RETRY_BASE_S:-2}" stop_at bound="${1}s" of=""
  shift 2
  stop_at=$((EPOCHSECONDS + seconds))
  if ((attempts)); then bound="$attempts attempts" of="/$attempts"; fi
  RETRY_SAYS=""
  until "$@"; do
    if ((attempts ? i >= attempts : EPOCHSECONDS + pause > stop_at)); then
      log "gave up after $bound: ${*:1:2}"
      return 1
    fi
    log "${RETRY_SAYS:-attempt $i$of failed: ${*:1:2}}; retrying in ${pause}s"
    sleep "$pause"
    i=$((i + 1)) RETRY_SAYS=""
    pause=$((pause * 2 > 60 ? 60 : pause * 2))
  done
}

# json KEY=STRING KEY:=RAW_JSON ...: one JSON object on one line, safely quoted.
json() {
  python3 -c '
import json, sys
out = {}
for arg in sys.argv[1:]:
    key, sep, value = arg.partition(":=")
    if sep:
        out[key] = json.loads(value)
    else:
        key, _, value = arg.partition("=")
        out[key] = value
print(json.dumps(out))
' "$@"
}

# Milliseconds, as the trainer writes them: `ops status` orders both sources by time.
now_iso() { date -u +%Y-%m-%dT%H:%M:%S.%3NZ; }

# ---- the store's credentials across clouds ----

# A machine whose run folder is in the other cloud's store has federation-<that cloud>.sh beside this
# file (components/userdata.py installs it there only: the user data has no room for both ways).
# load_env's first federation_env sources it, which defines the real federation_env (and, for S3,
# federation_token) in place of these, and runs it.
federation_token() { :; }
federation_env() {
  local lib="${BASH_SOURCE[0]%/*}/federation-$STORE_CLOUD.sh"
  [[ -r "$lib" ]] || die "TRAINSTACK_STORE_CLOUD $STORE_CLOUD: this machine has no ${lib##*/}"
  # shellcheck source-path=SCRIPTDIR source=federation-aws.sh disable=SC1091
  . "$lib"
  federation_env
}

# ---- object storage: the only calls that name a cloud's CLI ----

# STORE_TIMEOUT (seconds, when set) bounds each copy: the CLIs' own timeouts bound each read,
# not a transfer that trickles on.
store_cp() {
  local bound=()
  [[ -z "${STORE_TIMEOUT:-}" ]] || bound=(timeout "$STORE_TIMEOUT")
  federation_token || return 1
  case "$STORE_CLOUD" in
    aws) "${bound[@]}" aws s3 cp --only-show-errors "$@" ;;
    gcp) "${bound[@]}" gcloud storage cp --quiet "$@" ;;
  esac
}

store_cp_dir() {
  federation_token || return 1
  case "$STORE_CLOUD" in
    aws) aws s3 cp --only-show-errors --recursive "$1" "$2" ;;
    gcp) gcloud storage cp --quiet --recursive "$1/*" "$2" ;;
  esac
}

store_cat() { store_cp "$1" -; }

# store_put URI: writes stdin to URI as one object (complete or absent, never partial).
store_put() { store_cp - "$1"; }

# store_ls PREFIX/: names directly under PREFIX (ending in /), one a line, relative to it
# ("COMPLETE", "checkpoints/"). An empty or missing prefix prints nothing; an unreachable
# bucket fails.
store_ls() {
  local out err rc=0 prefix="$1"
  err="$(mktemp)"
  federation_token || { rm -f "$err"; return 1; }
  case "$STORE_CLOUD" in
    aws) out="$(aws s3 ls "$prefix" 2>"$err")" || rc=$? ;;
    gcp) out="$(gcloud storage ls "$prefix" 2>"$err")" || rc=$? ;;
  esac
  if ((rc != 0)) && [[ -s "$err" ]] && ! grep -q "matched no objects" "$err"; then
    log "listing $prefix failed: $(head -c 300 "$err")"
    rm -f "$err"
    return 1
  fi
  rm -f "$err"
  [[ -n "$out" ]] || return 0
  printf '%s\n' "$out" | awk '{print $NF}' | sed -e "s#^$prefix##"
}

# run_entries: names at the top of the run folder, one a line ("COMPLETE", "checkpoints/").
run_entries() { store_ls "$RUN_URI/"; }

# store_cat_all PREFIX: the contents of every object under PREFIX (at any depth), one after
# the other (each ends its lines with a newline, as json() writes them); nothing when there
# is none.
store_cat_all() {
  local dir
  federation_token || return 0
  case "$STORE_CLOUD" in
    aws)
      dir="$(mktemp -d)"
      aws s3 cp --only-show-errors --recursive "$1/" "$dir" 2>/dev/null || true
      find "$dir" -type f -exec awk 1 {} + 2>/dev/null || true
      rm -rf "$dir"
      ;;
    gcp) gcloud storage cat "$1/**" 2>/dev/null || true ;;
  esac
}

# store_create URI: writes stdin to URI only when no object is there (S3 If-None-Match: *,
# GCS if-generation-match=0), atomically: of several machines creating one name at once,
# one succeeds. 0: created; 1: the object exists (or another create of it is under way);
# 2: any other error (logged, and kept in STORE_ERROR for the caller's reason).
store_create() {
  local tmp err rc=0 bucket key
  tmp="$(mktemp)"
  err="$(mktemp)"
  cat >"$tmp"
  federation_token 2>"$err" || { echo "no identity token for the store" >>"$err"; rc=2; }
  ((rc != 0)) || case "$STORE_CLOUD" in
    aws)
      bucket="${1#s3://}"
      key="${bucket#*/}"
      bucket="${bucket%%/*}"
      aws s3api put-object --bucket "$bucket" --key "$key" --body "$tmp" --if-none-match '*' \
        >/dev/null 2>"$err" || rc=$?
      ;;
    gcp) gcloud storage cp --quiet --if-generation-match=0 "$tmp" "$1" 2>"$err" || rc=$? ;;
  esac
  rm -f "$tmp"
  if ((rc != 0)); then
    # S3: 412 PreconditionFailed (it exists), 409 ConditionalRequestConflict (another
    # create is under way); GCS: 412 "pre-conditions you specified did not hold".
    if grep -qE "PreconditionFailed|ConditionalRequestConflict|412|did not hold" "$err"; then
      rc=1
    else
      STORE_ERROR="$(tr -s '\n' ' ' <"$err" | head -c 300)"
      log "creating $1 failed: $STORE_ERROR"
      rc=2
    fi
  fi
  rm -f "$err"
  return "$rc"
}

# end_marker_in ENTRIES: prints the end marker (one of END_MARKERS) among a run folder
# listing (run_entries' output), nothing when there is none.
end_marker_in() {
  local marker
  for marker in "${END_MARKERS[@]}"; do
    if grep -qxF "$marker" <<<"$1"; then
      printf '%s\n' "$marker"
      return 0
    fi
  done
}

# end_marker: prints the run's end marker when it has one, nothing when it has not
# ended; fails when the run folder cannot be read.
end_marker() {
  local entries
  entries="$(retry 5 run_entries)" || return 1
  end_marker_in "$entries"
}

# newest_committed: the step of the run's newest committed checkpoint
# (checkpoints/ckpt-<step>/COMMITTED); -1 when there is none or the bucket does not answer.
newest_committed() {
  local out="" step
  federation_token || true
  case "$STORE_CLOUD" in
    aws) out="$(aws s3 ls --recursive "$RUN_URI/$CHECKPOINTS_PREFIX" 2>/dev/null)" || true ;;
    gcp) out="$(gcloud storage ls "$RUN_URI/$CHECKPOINTS_PREFIX**" 2>/dev/null)" || true ;;
  esac
  step="$(sed -nE "s#.*/${CHECKPOINT_DIR}-([0-9]+)/${COMMITTED}\$#\1#p" <<<"$out" | sort -n | tail -n 1)"
  printf '%s\n' "${step:--1}"
}

# is_end_marker NAME: true when NAME is one of END_MARKERS.
is_end_marker() {
  local marker
  for marker in "${END_MARKERS[@]}"; do [[ "$1" != "$marker" ]] || return 0; done
  return 1
}

# machine_events_uri: this machine's own event object, machine-events/<machine>.jsonl.
machine_events_uri() { printf '%s/%s%s.jsonl\n' "$RUN_URI" "$MACHINE_EVENTS_PREFIX" "$(instance_id)"; }

# event NAME KEY=VALUE...: records one of this machine's events. The run's events.jsonl
# has one writer, the trainer; each machine has its own object instead (machine-events/
# <machine>.jsonl), which only that machine writes. Several scripts on one machine write
# events (the watcher, the supervisor, finish), so the line is appended to a local copy
# under a lock and the whole copy is uploaded while the lock is held: an older copy can
# never overwrite a newer one. A machine recreated under the same name (a GCE managed
# group keeps names) starts its copy from the object its earlier self left.
event() {
  local line file="$STATE_DIR/own-events.jsonl" uri
  uri="$(machine_events_uri)"
  (
    flock -w 120 8 || log "waited 120s for the event lock; writing anyway"
    # Stamped under the lock, so the file is in time order.
    line="$(json "$EVENT=$1" "$TIME=$(now_iso)" instance="$(instance_id)" "${@:2}")"
    if [[ ! -e "$file" ]]; then
      store_cat "$uri" >"$file.tmp" 2>/dev/null || : >"$file.tmp"
      if [[ -s "$file.tmp" && -n "$(tail -c 1 "$file.tmp")" ]]; then printf '\n' >>"$file.tmp"; fi
      mv "$file.tmp" "$file"
    fi
    printf '%s\n' "$line" >>"$file"
    retry 3 store_cp "$file" "$uri" || log "could not upload event (kept on disk for the next one): $line"
  ) 8>>"$file.lock"
}

# ---- instance metadata ----

# IMDSv2 session token, kept (root-only) in /run for its 6-hour life minus a margin, so
# the watcher's polls do not ask for a new one every time. The file holds the second it was
# fetched and the token, so a poll reads both with the shell's own `read` (the watcher polls
# every few seconds for the machine's whole life: no process a poll but curl's).
# Sets IMDS_TOKEN (empty when the service does not give one).
imds_token() {
  local file="$RUNTIME_DIR/imds-token" tmp="$RUNTIME_DIR/imds-token.$BASHPID" at="" token=""
  [[ ! -s "$file" ]] || read -r at token <"$file" || true
  if [[ -z "$token" || ! "$at" =~ ^[0-9]+$ ]] || ((EPOCHSECONDS - at > 21000)); then
    at=$EPOCHSECONDS
    if token="$(curl -sf -m 2 -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 21600" \
      "$METADATA_URL/latest/api/token")" && [[ -n "$token" ]]; then
      # Each caller writes its own temporary file: the watcher and the supervisor start together.
      { (umask 077 && printf '%s %s\n' "$at" "$token" >"$tmp") && mv -f "$tmp" "$file"; } || rm -f "$tmp"
    else
      token=""
    fi
  fi
  IMDS_TOKEN="$token"
}

# md_read VAR PATH: the value into VAR and 0; 1 when the path is absent (404); 2 on errors.
# One process a read (curl): the status comes on a line of its own after the body.
md_read() {
  local _md_out _md_code _md_header _md_url
  case "$TRAINSTACK_CLOUD" in
    aws)
      imds_token
      _md_header="X-aws-ec2-metadata-token: $IMDS_TOKEN"
      _md_url="$METADATA_URL/latest/meta-data/$2"
      ;;
    gcp)
      _md_header="Metadata-Flavor: Google"
      _md_url="$METADATA_URL/computeMetadata/v1/instance/$2"
      ;;
  esac
  _md_out="$(curl -s -m 2 -w '\n%{http_code}' -H "$_md_header" "$_md_url")" || _md_out=$'\n000'
  _md_code="${_md_out##*$'\n'}"
  printf -v "$1" '%s' "${_md_out%$'\n'*}"
  case "$_md_code" in
    200) return 0 ;;
    404) return 1 ;;
    # A token that expired early answers 401: the next call fetches a new one.
    401) [[ "$TRAINSTACK_CLOUD" != aws ]] || rm -f "$RUNTIME_DIR/imds-token"; return 2 ;;
    *) return 2 ;;
  esac
}

# md_get PATH: prints the value and returns 0; 1 when the path is absent (404); 2 on errors.
md_get() {
  local value
  md_read value "$1" || return
  printf '%s' "$value"
}

# The instance id (AWS) or name (GCE): the name of this machine's logs and event object.
# Cached once read; if the metadata service does not answer, the host name stands in
# for this call only (not cached, so a later call gets the real one).
instance_id() {
  local cache="$RUNTIME_DIR/instance-id" tmp="$RUNTIME_DIR/instance-id.$$" item
  if [[ ! -s "$cache" ]]; then
    case "$TRAINSTACK_CLOUD" in aws) item=instance-id ;; gcp) item=name ;; esac
    # Several scripts may ask at once: each writes its own temporary file.
    if retry 3 md_get "$item" >"$tmp" && [[ -s "$tmp" ]]; then
      mv "$tmp" "$cache"
    else
      rm -f "$tmp"
      hostname
      return 0
    fi
  fi
  cat "$cache"
}

# ---- the group and the registry ----

# Sets this stack's group to zero machines. Idempotent: whichever node sees the end calls it.
scale_to_zero() {
  case "$TRAINSTACK_CLOUD" in
    aws) aws autoscaling update-auto-scaling-group --region "$TRAINSTACK_REGION" \
      --auto-scaling-group-name "$TRAINSTACK_GROUP" --min-size 0 --max-size 0 --desired-capacity 0 ;;
    gcp) gcloud compute instance-groups managed resize "$TRAINSTACK_GROUP" --size 0 \
      --region "$TRAINSTACK_REGION" --quiet ;;
  esac
}

# Logs docker in to the image's registry with the machine's identity when it is the
# cloud's own registry (ECR / Artifact Registry); public images need no login. An ECR
# token is for one region's registry: the region the image's host names
# (ACCOUNT.dkr.ecr.REGION.amazonaws.com), which need not be the machine's own.
registry_login() {
  local host="${TRAINSTACK_IMAGE%%/*}" region
  case "$host" in
    *.dkr.ecr.*.amazonaws.com)
      region="${host#*.dkr.ecr.}"
      region="${region%.amazonaws.com}"
      aws ecr get-login-password --region "$region" |
        docker login --username AWS --password-stdin "$host" ;;
    *-docker.pkg.dev)
      gcloud auth print-access-token |
        docker login --username oauth2accesstoken --password-stdin "https://$host" ;;
    *) return 0 ;;
  esac
}

# What runs after the run folder's first read (bootstrap.sh, rendezvous.sh) is not in the user
# data, which EC2 caps at 16 KiB: it is the stack's boot archive in the bucket
# (boot-<sha256[:16]>.tar.gz, TRAINSTACK_BOOT_URI), unpacked beside the other scripts once per
# disk. 1 when the store does not give it or the disk does not take it (a passing reason: tried
# again), 1 with failure-reason written when its bytes are not what its name says (a verdict).
# BOOT_FILES: components/code.py's BOOT_SCRIPTS, each of which the archive must hold.
BOOT_FILES=(bootstrap.sh rendezvous.sh progress.sh)

boot_scripts() {
  local uri="${TRAINSTACK_BOOT_URI:-}" name hash tmp sum f rc=0 reason=""
  name="${uri##*/}"
  rm -f "$RUNTIME_DIR/failure-reason"
  # A fetch cut short by a power-off leaves its folder behind.
  rm -rf "$BIN_DIR"/.fetch.*
  hash="${name#boot-}"
  hash="${hash%.tar.gz}"
  if [[ ! "$hash" =~ ^[0-9a-f]{16,64}$ || "$name" != "boot-$hash.tar.gz" ]]; then
    reason="TRAINSTACK_BOOT_URI '$uri': expected boot-<sha256 hex>.tar.gz"
  elif [[ "$(cat "$BIN_DIR/.boot-scripts" 2>/dev/null)" != "$hash" || ! -x "$BIN_DIR/bootstrap.sh" || ! -f "$BIN_DIR/rendezvous.sh" ]]; then
    # set -e does not hold here (this runs as supervise.sh's `until` condition): every step is checked.
    tmp="$(mktemp -d "$BIN_DIR/.fetch.XXXXXX")" || { log "cannot make a folder in $BIN_DIR"; return 1; }
    if ! retry 5 store_cp "$uri" "$tmp/boot.tar.gz"; then
      log "cannot fetch $uri"
      rc=1
    elif sum="$(sha256sum "$tmp/boot.tar.gz" | cut -d' ' -f1)" && [[ "$sum" != "$hash"* ]]; then
      reason="$name: its sha256 is $sum, not the $hash its name says"
    elif ! mkdir "$tmp/tree" || ! tar -xzf "$tmp/boot.tar.gz" -C "$tmp/tree" --no-same-owner; then
      log "cannot unpack $name into $tmp"
      rc=1
    else
      for f in "${BOOT_FILES[@]}"; do
        [[ -f "$tmp/tree/$f" && ! -L "$tmp/tree/$f" ]] || reason="${reason:-$name holds no $f}"
      done
      [[ -n "$reason" || -x "$tmp/tree/bootstrap.sh" ]] || reason="$name: bootstrap.sh is not executable"
      if [[ -z "$reason" ]]; then
        if mv -f "$tmp/tree"/* "$BIN_DIR/" && echo "$hash" >"$tmp/marker" && mv -f "$tmp/marker" "$BIN_DIR/.boot-scripts"; then
          log "boot scripts $hash installed"
        else
          log "cannot install the boot scripts into $BIN_DIR"
          rc=1
        fi
      fi
    fi
    rm -rf "$tmp"
  fi
  [[ -z "$reason" ]] || { printf '%s\n' "$reason" >"$RUNTIME_DIR/failure-reason"; log "$reason"; rc=1; }
  return "$rc"
}

