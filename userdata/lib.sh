# shellcheck shell=bash
# trainstack common library, sourced by the boot scripts: paths, logging, retries, the
# run folder in the bucket, instance metadata and the few calls where AWS and GCP differ.
# Every path and endpoint can be moved by the environment so the scripts run unchanged
# in a sandbox: TRAINSTACK_ROOT prefixes /etc, /var, /opt and /run.
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
NOTICE_FILE="$RUNTIME_DIR/notice-pending"

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
# depend on the cloud (metadata endpoint, notice grace period).
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
}

# retry ATTEMPTS CMD...: runs CMD until it succeeds, doubling the pause each time.
retry() {
  local attempts="$1" i=1 pause="${TRAINSTACK_RETRY_BASE_S:-2}"
  shift
  until "$@"; do
    if ((i >= attempts)); then
      log "gave up after $attempts attempts: $1 ${2:-}"
      return 1
    fi
    log "attempt $i/$attempts failed: $1 ${2:-}; retrying in ${pause}s"
    sleep "$pause"
    i=$((i + 1))
    pause=$((pause * 2))
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

now_iso() { date -u +%Y-%m-%dT%H:%M:%SZ; }

# ---- object storage: the only calls that name a cloud's CLI ----

store_cp() {
  case "$TRAINSTACK_CLOUD" in
    aws) aws s3 cp --only-show-errors "$@" ;;
    gcp) gcloud storage cp --quiet "$@" ;;
  esac
}

store_cp_dir() {
  case "$TRAINSTACK_CLOUD" in
    aws) aws s3 cp --only-show-errors --recursive "$1" "$2" ;;
    gcp) gcloud storage cp --quiet --recursive "$1/*" "$2" ;;
  esac
}

store_cat() { store_cp "$1" -; }

# store_put URI: writes stdin to URI as one object (complete or absent, never partial).
store_put() { store_cp - "$1"; }

# run_entries: names at the top of the run folder, one a line ("COMPLETE", "checkpoints/").
# An empty or missing folder prints nothing; an unreachable bucket fails.
run_entries() {
  local out err rc=0
  err="$(mktemp)"
  case "$TRAINSTACK_CLOUD" in
    aws) out="$(aws s3 ls "$RUN_URI/" 2>"$err")" || rc=$? ;;
    gcp) out="$(gcloud storage ls "$RUN_URI/" 2>"$err")" || rc=$? ;;
  esac
  if ((rc != 0)) && [[ -s "$err" ]] && ! grep -q "matched no objects" "$err"; then
    log "listing $RUN_URI failed: $(head -c 300 "$err")"
    rm -f "$err"
    return 1
  fi
  rm -f "$err"
  [[ -n "$out" ]] || return 0
  printf '%s\n' "$out" | awk '{print $NF}' | sed -e "s#^$RUN_URI/##"
}

# event KEY=VALUE...: appends one event to the run's events.jsonl (read, append, write).
event() {
  local tmp line
  tmp="$(mktemp)"
  line="$(json event="$1" time="$(now_iso)" instance="$(instance_id)" "${@:2}")"
  store_cat "$RUN_URI/events.jsonl" >"$tmp" 2>/dev/null || : >"$tmp"
  # A file that does not end in a newline gets one, so our line stays a line.
  if [[ -s "$tmp" && -n "$(tail -c 1 "$tmp")" ]]; then printf '\n' >>"$tmp"; fi
  printf '%s\n' "$line" >>"$tmp"
  retry 3 store_cp "$tmp" "$RUN_URI/events.jsonl" || log "could not append event: $line"
  rm -f "$tmp"
}

# ---- instance metadata ----

# IMDSv2 session token, kept (root-only) in /run for its 6-hour life minus a margin, so
# the watcher's polls do not ask for a new one every time.
imds_token() {
  local file="$RUNTIME_DIR/imds-token"
  if [[ ! -s "$file" ]] || (($(date +%s) - $(stat -c %Y "$file") > 21000)); then
    if (umask 077 && curl -sf -m 2 -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 21600" \
      "$METADATA_URL/latest/api/token" >"$file.tmp"); then
      mv "$file.tmp" "$file"
    else
      rm -f "$file.tmp"
    fi
  fi
  cat "$file" 2>/dev/null || true
}

# md_get PATH: prints the value and returns 0; 1 when the path is absent (404); 2 on errors.
md_get() {
  local out code
  out="$(mktemp)"
  case "$TRAINSTACK_CLOUD" in
    aws)
      code="$(curl -s -m 2 -o "$out" -w '%{http_code}' -H "X-aws-ec2-metadata-token: $(imds_token)" \
        "$METADATA_URL/latest/meta-data/$1")" || code=000
      # A token that expired early answers 401: the next call fetches a new one.
      [[ "$code" != 401 ]] || rm -f "$RUNTIME_DIR/imds-token"
      ;;
    gcp)
      code="$(curl -s -m 2 -o "$out" -w '%{http_code}' -H "Metadata-Flavor: Google" \
        "$METADATA_URL/computeMetadata/v1/instance/$1")" || code=000
      ;;
  esac
  case "$code" in
    200) cat "$out"; rm -f "$out"; return 0 ;;
    404) rm -f "$out"; return 1 ;;
    *) rm -f "$out"; return 2 ;;
  esac
}

instance_id() {
  local cache="$RUNTIME_DIR/instance-id"
  if [[ ! -s "$cache" ]]; then
    case "$TRAINSTACK_CLOUD" in
      aws) md_get instance-id >"$cache.tmp" || hostname >"$cache.tmp" ;;
      gcp) md_get name >"$cache.tmp" || hostname >"$cache.tmp" ;;
    esac
    mv "$cache.tmp" "$cache"
  fi
  cat "$cache"
}

# ---- the group and the registry ----

# This machine's private address, the one its peers reach.
private_ip() {
  case "$TRAINSTACK_CLOUD" in
    aws) md_get local-ipv4 ;;
    gcp) md_get network-interfaces/0/ip ;;
  esac
}

# Private addresses of the group's running machines, one a line.
group_ips() {
  case "$TRAINSTACK_CLOUD" in
    aws) aws ec2 describe-instances --region "$TRAINSTACK_REGION" --output text \
      --filters "Name=tag:aws:autoscaling:groupName,Values=$TRAINSTACK_GROUP" "Name=instance-state-name,Values=running" \
      --query 'Reservations[].Instances[].PrivateIpAddress' ;;
    gcp) gcloud compute instances list --filter="name~^$TRAINSTACK_GROUP-" \
      --format='value(networkInterfaces[0].networkIP)' ;;
  esac | tr -s ' \t' '\n' | sed '/^$/d' | sort -t. -k1,1n -k2,2n -k3,3n -k4,4n
}

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
# cloud's own registry (ECR / Artifact Registry); public images need no login.
registry_login() {
  local host="${TRAINSTACK_IMAGE%%/*}"
  case "$host" in
    *.dkr.ecr.*.amazonaws.com)
      aws ecr get-login-password --region "$TRAINSTACK_REGION" |
        docker login --username AWS --password-stdin "$host" ;;
    *-docker.pkg.dev)
      gcloud auth print-access-token |
        docker login --username oauth2accesstoken --password-stdin "https://$host" ;;
    *) return 0 ;;
  esac
}
