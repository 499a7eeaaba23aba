# shellcheck shell=bash
# trainstack federation to GCS: an AWS machine whose run folder is in GCS (a GCP-home stack's AWS
# placement) reaches it with its instance role through workload identity federation, never with a
# key. Sourced by lib.sh's load_env, installed only on such machines (federation-aws.sh is the other way).
# The variables below are used by the scripts that source lib.sh.
# shellcheck disable=SC2034

# google-auth's credential configuration is kept here, for gcloud and the trainer's GCS client; the
# container sees the folder at the same path (FEDERATION_CONTAINER_ARGS).
FEDERATION_DIR="$RUNTIME_DIR/federation"
FEDERATION_DIR_IN_CONTAINER="/run/trainstack/federation"
GOOGLE_CREDENTIALS="google-credentials.json"

# federation_env: load_env's part for GCS from AWS: the pool provider trusting the machine's role
# (TRAINSTACK_GCP_AUDIENCE) and the service account its sessions impersonate, from which it writes
# google-auth's `external_account` configuration, as `gcloud iam workload-identity-pools
# create-cred-config --aws --enable-imdsv2` writes it. It holds no secret: the library reads the
# role's keys from IMDSv2 (lib.sh's metadata endpoint), signs STS GetCallerIdentity with them and
# trades that for the account's token, which it renews by itself (lib.sh's federation_token stays a
# no-op). gcloud reads the file as its auth/credential_file_override property, the client libraries as
# Application Default Credentials. Written once per boot (/run is lost at shutdown), root only, in
# one rename. TRAINSTACK_GOOGLE_STS_URL and TRAINSTACK_GOOGLE_IAM_CREDENTIALS_URL move Google's endpoints.
federation_env() {
  local key project file="$FEDERATION_DIR/$GOOGLE_CREDENTIALS" imds="$METADATA_URL/latest"
  for key in TRAINSTACK_GCP_AUDIENCE TRAINSTACK_GCP_SERVICE_ACCOUNT; do
    [[ -n "${!key:-}" ]] || die "$key is empty in $ENV_FILE"
  done
  project="${TRAINSTACK_GCP_AUDIENCE#//iam.googleapis.com/projects/}"
  project="${project%%/*}"
  [[ "$project" =~ ^[0-9]+$ && "$TRAINSTACK_GCP_AUDIENCE" == */workloadIdentityPools/?*/providers/?* ]] ||
    die "TRAINSTACK_GCP_AUDIENCE is not a workload identity pool's provider: '$TRAINSTACK_GCP_AUDIENCE'"
  if [[ ! -s "$file" ]] && ! (umask 077 && mkdir -p "$FEDERATION_DIR" &&
    src="$(json environment_id=aws1 "region_url=$imds/meta-data/placement/availability-zone" \
      "url=$imds/meta-data/iam/security-credentials" "imdsv2_session_token_url=$imds/api/token" \
      "regional_cred_verification_url=https://sts.{region}.amazonaws.com?Action=GetCallerIdentity&Version=2011-06-15")" &&
    json type=external_account "audience=$TRAINSTACK_GCP_AUDIENCE" \
      subject_token_type=urn:ietf:params:aws:token-type:aws4_request \
      "token_url=${TRAINSTACK_GOOGLE_STS_URL:-https://sts.googleapis.com/v1/token}" \
      "service_account_impersonation_url=${TRAINSTACK_GOOGLE_IAM_CREDENTIALS_URL:-https://iamcredentials.googleapis.com/v1}/projects/-/serviceAccounts/$TRAINSTACK_GCP_SERVICE_ACCOUNT:generateAccessToken" \
      "credential_source:=$src" >"$file.$$" && mv -f "$file.$$" "$file"); then
    rm -f "$file.$$"
    die "cannot write $file"
  fi
  export CLOUDSDK_AUTH_CREDENTIAL_FILE_OVERRIDE="$file" GOOGLE_APPLICATION_CREDENTIALS="$file"
  # The trainer's storage.Client() refuses to start without a project, and federated credentials find
  # theirs only where the account may read the pool's project (Resource Manager): the pool's project
  # number stands in (objects' calls do not use it).
  FEDERATION_CONTAINER_ARGS=(-v "$FEDERATION_DIR:$FEDERATION_DIR_IN_CONTAINER:ro"
    -e "GOOGLE_APPLICATION_CREDENTIALS=$FEDERATION_DIR_IN_CONTAINER/$GOOGLE_CREDENTIALS"
    -e "GOOGLE_CLOUD_PROJECT=${GOOGLE_CLOUD_PROJECT:-$project}")
}
