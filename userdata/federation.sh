# shellcheck shell=bash
# trainstack federation: a machine whose run folder is in the other cloud's store reaches it with
# its own cloud's identity, never with a key: a GCP machine reaches S3 (an AWS-home stack's GCP
# placement) with its service account's Google ID token, an AWS machine reaches GCS (a GCP-home
# stack's AWS placement) with its instance role. Sourced by lib.sh, installed only on such machines.
# The variables below are used by the scripts that source lib.sh.
# shellcheck disable=SC2034

# A machine on GCP whose run folder is in S3 keeps its Google ID token here, for the `aws` CLI and boto3
# (AWS_WEB_IDENTITY_TOKEN_FILE); one on AWS whose run folder is in GCS keeps google-auth's credential
# configuration here, for gcloud and the trainer's GCS client. The container sees the folder at the
# same path (FEDERATION_CONTAINER_ARGS, the trainer's docker run arguments for it).
FEDERATION_DIR="$RUNTIME_DIR/federation"
FEDERATION_DIR_IN_CONTAINER="/run/trainstack/federation"
WEB_IDENTITY_TOKEN="aws-token"
GOOGLE_CREDENTIALS="google-credentials.json"

# federation_env: load_env's part for a store on the other cloud. S3 from GCP: the role, the audience,
# and the token file the aws CLI and boto3 read (AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN; they
# read the file again whenever they renew the session). GCS from AWS: the pool provider, the service
# account and the credential configuration gcloud and google-auth read (google_credentials).
federation_env() {
  local key
  case "$STORE_CLOUD" in
    aws)
      [[ "$TRAINSTACK_CLOUD" == gcp ]] || die "TRAINSTACK_STORE_CLOUD aws needs a gcp machine"
      for key in AWS_ROLE_ARN TRAINSTACK_TOKEN_AUDIENCE; do
        [[ -n "${!key:-}" ]] || die "$key is empty in $ENV_FILE (a gcp machine reaching S3 needs it)"
      done
      export AWS_WEB_IDENTITY_TOKEN_FILE="$FEDERATION_DIR/$WEB_IDENTITY_TOKEN"
      FEDERATION_CONTAINER_ARGS=(-v "$FEDERATION_DIR:$FEDERATION_DIR_IN_CONTAINER:ro"
        -e "AWS_WEB_IDENTITY_TOKEN_FILE=$FEDERATION_DIR_IN_CONTAINER/$WEB_IDENTITY_TOKEN")
      TOKEN_REFRESH_S="${TRAINSTACK_TOKEN_REFRESH_S:-1800}"
      ;;
    gcp)
      for key in TRAINSTACK_GCP_AUDIENCE TRAINSTACK_GCP_SERVICE_ACCOUNT; do
        [[ -n "${!key:-}" ]] || die "$key is empty in $ENV_FILE (an aws machine reaching GCS needs it)"
      done
      [[ "$TRAINSTACK_GCP_AUDIENCE" =~ ^//iam\.googleapis\.com/projects/([0-9]+)/locations/global/workloadIdentityPools/[^/]+/providers/[^/]+$ ]] ||
        die "TRAINSTACK_GCP_AUDIENCE '$TRAINSTACK_GCP_AUDIENCE' is not //iam.googleapis.com/projects/NUMBER/locations/global/workloadIdentityPools/POOL/providers/ID"
      local project="${BASH_REMATCH[1]}"
      [[ "$TRAINSTACK_GCP_SERVICE_ACCOUNT" == ?*@?* ]] ||
        die "TRAINSTACK_GCP_SERVICE_ACCOUNT '$TRAINSTACK_GCP_SERVICE_ACCOUNT' is not a service account's email"
      google_credentials || die "cannot write the Google credential configuration in $FEDERATION_DIR"
      # gcloud's auth/credential_file_override property, and Application Default Credentials for
      # the client libraries: both take a workload identity federation configuration.
      export CLOUDSDK_AUTH_CREDENTIAL_FILE_OVERRIDE="$FEDERATION_DIR/$GOOGLE_CREDENTIALS"
      export GOOGLE_APPLICATION_CREDENTIALS="$CLOUDSDK_AUTH_CREDENTIAL_FILE_OVERRIDE"
      # The trainer's storage.Client() refuses to start without a project, and federated credentials
      # find theirs only where the account may read the pool's project (Resource Manager): the
      # pool's project number stands in (objects' calls do not use it).
      FEDERATION_CONTAINER_ARGS=(-v "$FEDERATION_DIR:$FEDERATION_DIR_IN_CONTAINER:ro"
        -e "GOOGLE_APPLICATION_CREDENTIALS=$FEDERATION_DIR_IN_CONTAINER/$GOOGLE_CREDENTIALS"
        -e "GOOGLE_CLOUD_PROJECT=${GOOGLE_CLOUD_PROJECT:-$project}")
      ;;
    *) die "TRAINSTACK_STORE_CLOUD must be aws (on a gcp machine), gcp (on an aws machine) or $TRAINSTACK_CLOUD, not '$STORE_CLOUD'" ;;
  esac
}

# google_credentials: google-auth's `external_account` configuration for the pool provider
# (TRAINSTACK_GCP_AUDIENCE) trusting this machine's role, impersonating TRAINSTACK_GCP_SERVICE_ACCOUNT:
# what `gcloud iam workload-identity-pools create-cred-config --aws --enable-imdsv2` writes. It holds
# no secret: the library reads the role's keys from IMDSv2 (the same metadata endpoint as the rest
# of lib.sh), signs STS GetCallerIdentity with them, trades that for a Google token and renews it
# by itself. Written once per boot (/run is lost at shutdown), root only, in one rename.
# TRAINSTACK_GOOGLE_STS_URL and TRAINSTACK_GOOGLE_IAM_CREDENTIALS_URL move Google's endpoints.
google_credentials() {
  local file="$FEDERATION_DIR/$GOOGLE_CREDENTIALS" sts iam imds="$METADATA_URL/latest" src tmp
  [[ ! -s "$file" ]] || return 0
  tmp="$file.$BASHPID"
  sts="${TRAINSTACK_GOOGLE_STS_URL:-https://sts.googleapis.com/v1/token}"
  iam="${TRAINSTACK_GOOGLE_IAM_CREDENTIALS_URL:-https://iamcredentials.googleapis.com/v1}"
  if ! (umask 077 && mkdir -p "$FEDERATION_DIR") ||
    ! src="$(json environment_id=aws1 "region_url=$imds/meta-data/placement/availability-zone" \
      "url=$imds/meta-data/iam/security-credentials" "imdsv2_session_token_url=$imds/api/token" \
      "regional_cred_verification_url=https://sts.{region}.amazonaws.com?Action=GetCallerIdentity&Version=2011-06-15")" ||
    ! (umask 077 && json type=external_account "audience=$TRAINSTACK_GCP_AUDIENCE" \
      subject_token_type=urn:ietf:params:aws:token-type:aws4_request "token_url=$sts" \
      "service_account_impersonation_url=$iam/projects/-/serviceAccounts/$TRAINSTACK_GCP_SERVICE_ACCOUNT:generateAccessToken" \
      "credential_source:=$src" >"$tmp"); then
    rm -f "$tmp"
    return 1
  fi
  mv -f "$tmp" "$file"
}

# federation_token: on a GCP machine whose store is S3, a Google ID token of the machine's
# service account for TRAINSTACK_TOKEN_AUDIENCE in AWS_WEB_IDENTITY_TOKEN_FILE, the one AWS
# role (AWS_ROLE_ARN) trusts. Google's ID tokens last an hour: the file is renewed once it is
# TOKEN_REFRESH_S old (30 minutes), by every store call and by the notice watcher's polls, so
# it is fresh whenever the CLI or the trainer's boto3 renews its session from it. Each fetch is
# bounded (5 s, 3 tries); the new token replaces the file in one rename (a reader sees the old
# token or the new one). A failed renewal keeps a token that still has life in it (tried again a
# minute later, not by every call meanwhile); 1 when there is none (the store call then fails as a network failure would, and is retried). Elsewhere a no-op: an AWS machine's Google
# credentials (google_credentials) are renewed by google-auth and gcloud themselves.
federation_token() {
  [[ "$STORE_CLOUD" == aws && "$TRAINSTACK_CLOUD" == gcp ]] || return 0
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
