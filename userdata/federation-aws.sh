# shellcheck shell=bash
# trainstack federation to S3: a GCP machine whose run folder is in S3 (an AWS-home stack's GCP
# placement) reaches it with its service account's Google identity, never with a key. Sourced
# by lib.sh's load_env, installed only on such machines (federation-gcp.sh is the other way).
# The variables below are used by the scripts that source lib.sh.
# shellcheck disable=SC2034

# A machine on GCP whose run folder is in S3 keeps its Google ID token here, for the `aws` CLI and boto3
# (AWS_WEB_IDENTITY_TOKEN_FILE); the container sees the folder at the same path (FEDERATION_CONTAINER_ARGS).
FEDERATION_DIR="$RUNTIME_DIR/federation"
FEDERATION_DIR_IN_CONTAINER="/run/trainstack/federation"
WEB_IDENTITY_TOKEN="aws-token"

# federation_env: load_env's part for S3 from GCP: the role, the audience, and
# the token file the aws CLI and boto3 read (AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN; they
# read the file again whenever they renew the session).
federation_env() {
  local key
  for key in AWS_ROLE_ARN TRAINSTACK_TOKEN_AUDIENCE; do
    [[ -n "${!key:-}" ]] || die "$key is empty in $ENV_FILE (a gcp machine reaching S3 needs it)"
  done
  export AWS_WEB_IDENTITY_TOKEN_FILE="$FEDERATION_DIR/$WEB_IDENTITY_TOKEN"
  FEDERATION_CONTAINER_ARGS=(-v "$FEDERATION_DIR:$FEDERATION_DIR_IN_CONTAINER:ro"
    -e "AWS_WEB_IDENTITY_TOKEN_FILE=$FEDERATION_DIR_IN_CONTAINER/$WEB_IDENTITY_TOKEN")
  TOKEN_REFRESH_S="${TRAINSTACK_TOKEN_REFRESH_S:-1800}"
}

# federation_token: on a GCP machine whose store is S3, a Google ID token of the machine's
# service account for TRAINSTACK_TOKEN_AUDIENCE in AWS_WEB_IDENTITY_TOKEN_FILE, the one AWS
# role (AWS_ROLE_ARN) trusts. Google's ID tokens last an hour: the file is renewed once it is
# TOKEN_REFRESH_S old (30 minutes), by every store call and by the notice watcher's polls, so
# it is fresh whenever the CLI or the trainer's boto3 renews its session from it. Each fetch is
# bounded (5 s, 3 tries); the new token replaces the file in one rename (a reader sees the old
# token or the new one). A failed renewal keeps a token that still has life in it (tried again a
# minute later, not by every call meanwhile); 1 when there is none (the store call then fails as a network failure would, and is retried). Elsewhere a no-op.
federation_token() {
  [[ "$STORE_CLOUD" != "$TRAINSTACK_CLOUD" ]] || return 0
  local file="$AWS_WEB_IDENTITY_TOKEN_FILE" age=999999
  [[ ! -s "$file" ]] || age=$((EPOCHSECONDS - $(stat -c %Y "$file")))
  ((age >= TOKEN_REFRESH_S)) || return 0
  # A renewal that failed within the last minute is not tried again by every store call
  # (each try costs up to 21 s) while the token still has life.
  if ((age < 3300)) && [[ -e "$file.failed" ]] && ((EPOCHSECONDS - $(stat -c %Y "$file.failed") < 60)); then
    return 0
  fi
  mkdir -p "$FEDERATION_DIR"
  if retry 3 identity_token "$file.$BASHPID"; then
    mv -f "$file.$BASHPID" "$file"
    rm -f "$file.failed"
    return 0
  fi
  rm -f "$file.$BASHPID"
  if ((age < 3300)); then
    log "could not renew the identity token (${age}s old): keeping it, trying again in a minute"
    touch "$file.failed"
    return 0
  fi
  log "no identity token for $AWS_ROLE_ARN: the metadata server does not answer"
  return 1
}

# identity_token FILE: the metadata server's ID token for the audience, into FILE (root only).
identity_token() {
  local code
  code="$( (umask 077 && curl -s -m 5 -G -o "$1" -w '%{http_code}' -H "Metadata-Flavor: Google" \
    --data-urlencode "audience=$TRAINSTACK_TOKEN_AUDIENCE" --data-urlencode "format=full" \
    "$METADATA_URL/computeMetadata/v1/instance/service-accounts/default/identity"))" || code=000
  [[ "$code" == 200 && -s "$1" ]]
}
