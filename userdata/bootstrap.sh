#!/usr/bin/env bash
# trainstack bootstrap: makes the machine ready to run the trainer container. GPU and
# driver check, Docker and the NVIDIA container toolkit, the cloud CLI, local NVMe for
# data staging, the trainer code and its pip packages, registry login and image pull.
# Idempotent: each step leaves a marker or a finished directory, so a second boot of
# the same disk redoes nothing. Writes what the supervisor needs to $STATE_DIR/paths.
# A machine that can never train (no GPU, bad code archive) fails with a reason in
# $RUNTIME_DIR/failure-reason, which the supervisor turns into the run's FAILED marker;
# any other failure (apt, a mirror, the registry) exits without one, and the supervisor
# runs bootstrap again later. A problem with the local data disk is never a failure:
# the root disk serves instead.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "${TRAINSTACK_LIB:-$(dirname "$0")/lib.sh}"

NVIDIA_KEYRING="$ROOT/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
DOCKER_DAEMON_JSON="$ROOT/etc/docker/daemon.json"

fail() {
  printf '%s\n' "$*" >"$RUNTIME_DIR/failure-reason"
  die "$*"
}

# step NAME FUNCTION: runs one step and logs its seconds (docs/boot.md quotes them).
step() {
  local start=$SECONDS
  "$2"
  log "step $1 done in $((SECONDS - start))s"
}

has_nvidia_device() {
  grep -qs 0x10de "${TRAINSTACK_PCI_DIR:-/sys/bus/pci/devices}"/*/vendor
}

# On a first boot the image's own apt-daily / unattended-upgrades often hold the dpkg
# lock for minutes: apt waits for it (DPkg::Lock::Timeout) instead of failing at once.
apt_get() {
  DEBIAN_FRONTEND=noninteractive apt-get -o "DPkg::Lock::Timeout=$APT_LOCK_WAIT_S" "$@"
}

apt_update() { retry 3 apt_get update -q "$@"; }

apt_install() {
  retry 3 apt_get install -y -q --no-install-recommends "$@"
}

# The GPU-ready images bring the driver; a plain image with an NVIDIA device gets the
# pinned server driver branch. No device, or a driver that does not answer: fail fast.
gpu() {
  if nvidia-smi -L >"$RUNTIME_DIR/gpus" 2>&1; then
    log "GPUs: $(tr '\n' ';' <"$RUNTIME_DIR/gpus")"
    return 0
  fi
  if ! has_nvidia_device; then
    fail "no NVIDIA GPU on this machine ($(head -c 200 "$RUNTIME_DIR/gpus" | tr '\n' ' ')); pick a GPU instance type"
  fi
  if [[ ! -e "$STATE_DIR/driver.done" ]]; then
    log "NVIDIA device without a working driver: installing nvidia-driver-$DRIVER_BRANCH"
    apt_update
    apt_install "nvidia-headless-$DRIVER_BRANCH" "nvidia-utils-$DRIVER_BRANCH"
    modprobe nvidia || true
    touch "$STATE_DIR/driver.done"
  fi
  nvidia-smi -L >"$RUNTIME_DIR/gpus" 2>&1 ||
    fail "the NVIDIA driver does not answer: $(head -c 300 "$RUNTIME_DIR/gpus" | tr '\n' ' ')"
}

docker_engine() {
  command -v docker >/dev/null && return 0
  log "installing Docker (docker.io)"
  apt_update
  apt_install docker.io
  systemctl enable --now docker
}

# The CLI must do what the scripts ask of it: several machines seal their rendezvous with a
# create-if-absent write (S3 If-None-Match, from August 2024; GCS if-generation-match), which
# an older CLI refuses as an unknown option, and the cluster would never form. Asked of the
# CLI's own model (a skeleton, or the help text), no call made.
cli_check() {
  local model
  cloud_cli || die "no cloud CLI"
  ((${TRAINSTACK_NODES:-1} > 1)) || return 0
  case "$STORE_CLOUD" in
    aws) model="$(aws s3api put-object --generate-cli-skeleton 2>&1)" || true
      grep -q '"IfNoneMatch"' <<<"$model" ||
      fail "the AWS CLI on this image ($(aws --version 2>&1 | head -c 80)) has no put-object --if-none-match, which several machines need: use an image whose AWS CLI is from after August 2024" ;;
    gcp) model="$(gcloud storage cp --help 2>&1)" || true
      grep -q -- --if-generation-match <<<"$model" ||
      fail "the gcloud CLI on this image ($(gcloud --version 2>&1 | head -n 1)) has no storage cp --if-generation-match, which several machines need: use a newer gcloud" ;;
  esac
}

# The toolkit lets `docker run --gpus all` reach the GPUs. Deep learning images have it;
# elsewhere it comes from NVIDIA's signed apt repository at the pinned version.
toolkit() {
  [[ -e "$STATE_DIR/toolkit.done" ]] && return 0
  if command -v nvidia-ctk >/dev/null; then
    log "nvidia-container-toolkit present: $(nvidia-ctk --version 2>&1 | head -n 1)"
  else
    log "installing nvidia-container-toolkit $CTK_VERSION"
    mkdir -p "$(dirname "$NVIDIA_KEYRING")" "$ROOT/etc/apt/sources.list.d"
    curl -fsSL --retry 3 "$NVIDIA_REPO_URL/gpgkey" | gpg --batch --yes --dearmor -o "$NVIDIA_KEYRING"
    curl -fsSL --retry 3 "$NVIDIA_REPO_URL/stable/deb/nvidia-container-toolkit.list" |
      sed "s#^deb http#deb [signed-by=${NVIDIA_KEYRING#"$ROOT"}] http#" \
        >"$ROOT/etc/apt/sources.list.d/nvidia-container-toolkit.list"
    # Refresh only NVIDIA's list: the full index costs tens of seconds.
    apt_update -o Dir::Etc::sourcelist=sources.list.d/nvidia-container-toolkit.list \
      -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0
    apt_install "nvidia-container-toolkit=$CTK_VERSION" "nvidia-container-toolkit-base=$CTK_VERSION" \
      "libnvidia-container-tools=$CTK_VERSION" "libnvidia-container1=$CTK_VERSION"
  fi
  if ! grep -qs '"nvidia"' "$DOCKER_DAEMON_JSON"; then
    nvidia-ctk runtime configure --runtime=docker --config="$DOCKER_DAEMON_JSON"
    systemctl restart docker
  fi
  touch "$STATE_DIR/toolkit.done"
}

# Instance store / local SSD is the fastest disk for staging data; its contents vanish
# when the machine stops, which is fine for a cache. AWS's Deep Learning AMIs mount their
# instance-store disks themselves at /opt/dlami/nvme (several as one volume): that is
# used when mounted. Otherwise a local NVMe device is formatted and mounted only when it
# holds no file system or is ours from an earlier boot (label trainstack-data) and is not
# mounted: a RAID or LVM member, or anyone else's disk, is left alone. Any problem here
# falls back to the root disk; it never fails the boot.
data_dir() {
  local dlami="$ROOT${TRAINSTACK_DLAMI_NVME:-/opt/dlami/nvme}" mnt="$ROOT/mnt/trainstack-data" dev
  DATA_DIR="$STATE_DIR/data"
  PIP_BASE="$OPT_DIR/pip"
  if mountpoint -q "$dlami"; then
    if mkdir -p "$dlami/trainstack" 2>/dev/null; then
      DATA_DIR="$dlami/trainstack"
      log "data staging on $DATA_DIR (the image's instance-store volume)"
    else
      log "cannot write to $dlami; data staging on the root disk"
    fi
  elif dev="$(local_disk)" && [[ -n "$dev" ]]; then
    if mount_local_disk "$dev" "$mnt"; then
      DATA_DIR="$mnt"
      log "data staging on $DATA_DIR ($dev)"
    else
      log "could not use $dev; data staging on the root disk"
    fi
  fi
  mkdir -p "$DATA_DIR"
  if [[ "$DATA_DIR" == "$STATE_DIR/data" ]]; then
    log "data staging on the root disk ($DATA_DIR)"
  else
    # The trainer's packages (~5 GB installed) too: written at the local disk's speed, not the
    # root volume's (gp3: 125 MiB/s, shared with the image pull); a disk lost with the machine
    # costs a reinstall from the bucket's cache.
    PIP_BASE="$DATA_DIR/pip"
  fi
}

# Prints the first local instance-store / local-SSD device that is ours to use.
local_disk() {
  local candidate label
  for candidate in "${TRAINSTACK_DEV_DIR:-/dev/disk/by-id}"/{nvme-Amazon_EC2_NVMe_Instance_Storage_*,google-local-nvme-ssd-*,google-local-ssd-*}; do
    [[ -e "$candidate" ]] || continue
    if findmnt -rn --source "$candidate" >/dev/null 2>&1; then
      log "$candidate is mounted already: not ours"
      continue
    fi
    if blkid "$candidate" >/dev/null 2>&1; then
      label="$(blkid -o value -s LABEL "$candidate" 2>/dev/null)" || label=""
      if [[ "$label" != trainstack-data ]]; then
        log "$candidate holds $(blkid -o value -s TYPE "$candidate" 2>/dev/null || echo "a signature"): not ours"
        continue
      fi
    fi
    printf '%s\n' "$candidate"
    return 0
  done
}

# mount_local_disk DEVICE MOUNTPOINT: formats DEVICE if it is blank and mounts it.
mount_local_disk() {
  local dev="$1" mnt="$2"
  mountpoint -q "$mnt" && return 0
  if ! blkid "$dev" >/dev/null 2>&1; then
    mkfs.ext4 -F -q -L trainstack-data "$dev" || return 1
  fi
  mkdir -p "$mnt" && mount -o noatime,discard "$dev" "$mnt"
}

# The code archive is named after its sha256 (trainer-<hex>.tar.gz); a mismatch means a
# damaged or foreign archive and the machine refuses it.
code() {
  CODE_DIR="" PIP_DIR=""
  [[ -n "${TRAINSTACK_CODE_URI:-}" ]] || { log "no code archive: the image brings the trainer"; return 0; }
  local name="${TRAINSTACK_CODE_URI##*/}" hash tmp sum
  hash="${name#trainer-}"
  hash="${hash%.tar.gz}"
  [[ "$hash" =~ ^[0-9a-f]{12,64}$ ]] || fail "TRAINSTACK_CODE_URI $name: expected trainer-<sha256 hex>.tar.gz"
  CODE_DIR="$OPT_DIR/code/$hash"
  if [[ ! -f "$CODE_DIR/trainer/__main__.py" ]]; then
    mkdir -p "$OPT_DIR/code"
    tmp="$(mktemp -d "$OPT_DIR/code/.fetch.XXXXXX")"
    # Not fetched (network, permissions being granted): bootstrap is run again later.
    retry 5 store_cp "$TRAINSTACK_CODE_URI" "$tmp/code.tar.gz" || die "cannot fetch $TRAINSTACK_CODE_URI"
    sum="$(sha256sum "$tmp/code.tar.gz" | cut -d' ' -f1)"
    [[ "$sum" == "$hash"* ]] || fail "$name: its sha256 is $sum, not the $hash its name says"
    mkdir "$tmp/tree"
    tar -xzf "$tmp/code.tar.gz" -C "$tmp/tree" --no-same-owner
    [[ -f "$tmp/tree/trainer/__main__.py" ]] || fail "$name holds no trainer/__main__.py"
    rm -rf "$CODE_DIR"
    mv "$tmp/tree" "$CODE_DIR"
    rm -rf "$tmp"
    log "trainer code $hash unpacked"
  fi
  packages
}

# trainer/requirements.txt, the CUDA/cuDNN wheels TensorFlow needs (trainer/requirements-gpu.txt:
# the stock TF image's own cuDNN is too old for its TF), and the user's usercode/requirements.txt
# (run.code) when there is one, installed once per (requirements, image) into a host cache that
# the container mounts. Constrained to the image's own versions so TF's numpy stays.
packages() {
  local req="$CODE_DIR/trainer/requirements.txt" gpu_req="$CODE_DIR/trainer/requirements-gpu.txt"
  local user_req="$CODE_DIR/usercode/requirements.txt" key tmp more=""
  [[ -f "$req" ]] || return 0
  [[ ! -f "$gpu_req" ]] || more="-r /opt/trainstack/code/trainer/requirements-gpu.txt"
  [[ ! -f "$user_req" ]] || more="${more:+$more }-r /opt/trainstack/code/usercode/requirements.txt"
  key="$( (cat "$req"; [[ ! -f "$gpu_req" ]] || cat "$gpu_req"; [[ ! -f "$user_req" ]] || cat "$user_req"
    cat "$CODE_DIR/trainer/requirements-keras2.txt" 2>/dev/null; printf '%s' "$TRAINSTACK_IMAGE") | sha256sum | cut -c1-16)"
  PIP_DIR="$PIP_BASE/$key"
  # The code archive's trainer/pip_cache.sh replaces these; an archive without it (a trainer
  # folder of one's own) has no cache: the package index as before.
  pip_cache_get() { return 1; }
  pip_cache_put() { return 1; }
  # shellcheck source=/dev/null
  [[ ! -f "$CODE_DIR/trainer/pip_cache.sh" ]] || . "$CODE_DIR/trainer/pip_cache.sh"
  if [[ -d "$PIP_DIR" ]]; then
    cache_packages "$key"
    return 0
  fi
  mkdir -p "$PIP_BASE"
  # An install cut short by a power-off leaves its folder (gigabytes of wheels) behind.
  rm -rf "$PIP_BASE"/.install.*
  tmp="$(mktemp -d "$PIP_BASE/.install.XXXXXX")"
  # Another machine installed the same key already: its archive in the bucket, same region,
  # instead of ~3 GB from the package index. Anything wrong with it: the index, as before.
  if pip_cache_get "$key" "$tmp"; then
    mv "$tmp" "$PIP_DIR"
    touch "$PIP_DIR.cached"
    return 0
  fi
  mkdir -p "$tmp"
  image_wait
  log "installing the trainer's requirements (${more:-trainer only}) into $PIP_DIR"
  if retry 3 pip_install "$tmp" "$more"; then
    mv "$tmp" "$PIP_DIR"
    cache_packages "$key"
    return 0
  fi
  rm -rf "$tmp"
  # A verdict on the requirements (no such version, a conflict, a build that fails) fails
  # the run. pip offline says "No matching distribution" too, after its connection
  # warnings: any sign of the network (or no verdict at all) is retried by the supervisor.
  if ! grep -qiE "retrying \(retry|connection(error| broken| reset| refused| aborted)|timeout|timed out|name resolution|not known|unreachable|HTTP error 5|IncompleteRead|ProxyError|SSLError|do not match the hashes" "$PIP_LOG" &&
    grep -qE "ResolutionImpossible|No matching distribution|conflicting dependencies|Invalid requirement|subprocess-exited-with-error" "$PIP_LOG"; then
    fail "pip refused the requirements (${more:+trainer, CUDA wheels and run.code}) in $TRAINSTACK_IMAGE: $(grep -m 2 '^ERROR' "$PIP_LOG" | tr '\n' ' ' | head -c 300)"
  fi
  die "pip could not install the requirements (retried later): $(grep -m 1 -iE 'error' "$PIP_LOG" | head -c 300)"
}

# pip_install DIR MORE: the requirements installed in the image into DIR; pip's output is
# kept in $PIP_LOG (and shown) for the verdict above.
pip_install() {
  local rc=0
  find "$1" -mindepth 1 -delete # what an earlier try left
  # shellcheck disable=SC2016 # $MORE_REQUIREMENTS expands inside the container's shell
  docker run --rm --network host -v "$CODE_DIR:/opt/trainstack/code:ro" -v "$1:/opt/trainstack/pip" \
    -e "MORE_REQUIREMENTS=$2" "$TRAINSTACK_IMAGE" sh -c 'python -m pip freeze --all >/tmp/image.txt &&
      python -m pip install -q --no-cache-dir --disable-pip-version-check --target /opt/trainstack/pip
      -c /tmp/image.txt -r /opt/trainstack/code/trainer/requirements.txt $MORE_REQUIREMENTS && K=/opt/trainstack/code/trainer/requirements-keras2.txt &&
      { [ ! -f $K ] || python -m pip install -q --no-cache-dir --no-deps --target /opt/trainstack/pip -r $K; }' >"$PIP_LOG" 2>&1 || rc=$?
  tail -n 20 "$PIP_LOG" >&2
  return "$rc"
}

# cache_packages KEY: the first machine to install KEY archives it to the bucket for the others,
# in the background while its own trainer starts (every step of it bounded: pip_cache_put).
# $PIP_DIR.cached says it is done, so a later boot of this disk lists nothing.
cache_packages() {
  [[ ! -e "$PIP_DIR.cached" ]] || return 0
  (pip_cache_put "$1" "$PIP_DIR" && touch "$PIP_DIR.cached") </dev/null &
}

# The image pull starts in the background before the code step: the code archive and the
# cached packages come from the bucket meanwhile. image_wait waits for it (or pulls itself).
image_start() {
  IMAGE_PID=""
  [[ ! -e "$RUNTIME_DIR/image.ready" ]] || return 0
  image &
  IMAGE_PID=$!
}

image_wait() {
  local rc=0
  if [[ -n "${IMAGE_PID:-}" ]]; then
    wait "$IMAGE_PID" || rc=$?
    IMAGE_PID=""
    ((rc == 0)) || die "the image pull failed (see above)"
  fi
  image
}

image() {
  [[ -e "$RUNTIME_DIR/image.ready" ]] && return 0
  image_pinned
  [[ -z "${TRAINSTACK_IMAGE_PUBLIC_KEY:-}" ]] || image_signed
  if docker image inspect "$TRAINSTACK_IMAGE" >/dev/null 2>&1; then
    log "image $TRAINSTACK_IMAGE already on disk"
  else
    # A registry that does not answer is retried by the supervisor, not a verdict.
    retry 3 registry_login || die "cannot log in to the registry of $TRAINSTACK_IMAGE"
    retry 5 docker pull -q "$TRAINSTACK_IMAGE" || die "cannot pull $TRAINSTACK_IMAGE"
  fi
  image_verify
  touch "$RUNTIME_DIR/image.ready"
}

# A machine never pulls by tag: the env file names the image by the digest `pulumi up` pinned
# (components/registry.py). Anything else is a verdict on the run, not a passing failure.
image_pinned() {
  [[ "$TRAINSTACK_IMAGE" =~ ^[^@]+@sha256:[0-9a-f]{64}$ ]] ||
    fail "the image $TRAINSTACK_IMAGE is not pinned by digest (REPOSITORY@sha256:...): a machine never runs an image by tag"
}

# An image the stack signs (TRAINSTACK_IMAGE_PUBLIC_KEY: the public key, base64 DER, from the user
# data) runs only with a signature over its digest by that key, read from its repository as cosign
# stores it (components/signing.py): the `sha256-<hex>.sig` manifest, whose payload layer names the
# digest and carries the signature in its annotation. It is checked before the pull, so no byte of an
# image that is not the stack's is pulled; image_verify then holds the pull to that digest. No
# signature, another digest or another key is a verdict; a registry that does not answer is retried.
SIG_MEDIA_TYPE="application/vnd.dev.cosign.simplesigning.v1+json"

# registry_auth: the Authorization header the machine's own identity gives the image's registry
# (the same credentials `docker pull` logs in with); nothing for any other registry.
registry_auth() {
  local host="${TRAINSTACK_IMAGE%%/*}" region secret
  case "$host" in
    *.dkr.ecr.*.amazonaws.com)
      region="${host#*.dkr.ecr.}"
      region="${region%.amazonaws.com}"
      secret="$(aws ecr get-login-password --region "$region")" || return 1
      printf 'Authorization: Basic %s' "$(printf 'AWS:%s' "$secret" | base64 -w0)" ;;
    *-docker.pkg.dev)
      secret="$(gcloud auth print-access-token)" || return 1
      printf 'Authorization: Bearer %s' "$secret" ;;
  esac
}

# sig_get URL FILE: the registry's answer to URL in FILE, its HTTP status in FILE.code (000: no
# answer); 1 for what is worth another try (no answer, no credentials yet, 429, 5xx).
# The credential goes to curl in a file of the machine's own (-H @FILE), never on its command line.
sig_get() {
  local code
  echo 000 >"$2.code"
  (umask 077 && registry_auth >"$2.auth") || return 1
  code="$(curl -s -m 30 -o "$2" -w '%{http_code}' -H "Accept: application/vnd.oci.image.manifest.v1+json" \
    -H @"$2.auth" "$1")" || code=000
  rm -f "$2.auth"
  echo "$code" >"$2.code"
  [[ "$code" != 000 && "$code" != 429 && "$code" != 5* ]]
}

image_signed() {
  local repo="${TRAINSTACK_IMAGE%@*}" digest="${TRAINSTACK_IMAGE#*@}" host base dir code layer
  host="${repo%%/*}"
  case "${host%:*}" in
    127.0.0.1 | localhost) base="http://$host/v2/${repo#*/}" ;;
    *) base="https://$host/v2/${repo#*/}" ;;
  esac
  dir="$(mktemp -d "$RUNTIME_DIR/.sig.XXXXXX")"
  retry 3 sig_get "$base/manifests/${digest/:/-}.sig" "$dir/manifest.json" || true
  code="$(cat "$dir/manifest.json.code")"
  [[ "$code" != 404 ]] || fail "the image $TRAINSTACK_IMAGE has no signature (${digest/:/-}.sig): refusing to run it"
  [[ "$code" == 200 ]] || die "cannot read the signature of $TRAINSTACK_IMAGE (HTTP $code)"
  # The payload layer's digest, then its base64 signature (python3: the machines' JSON reader).
  layer="$(python3 -c '
import json, sys
for layer in json.load(open(sys.argv[1])).get("layers", []):
    sig = (layer.get("annotations") or {}).get("dev.cosignproject.cosign/signature")
    if layer.get("mediaType") == sys.argv[2] and sig:
        print(layer["digest"], sig)
        break' "$dir/manifest.json" "$SIG_MEDIA_TYPE" 2>/dev/null)" || layer=""
  [[ "$layer" =~ ^sha256:[0-9a-f]{64}\ [A-Za-z0-9+/=]+$ ]] ||
    fail "the signature manifest of $TRAINSTACK_IMAGE holds no cosign signature: refusing to run it"
  retry 3 sig_get "$base/blobs/${layer%% *}" "$dir/payload.json" || true
  code="$(cat "$dir/payload.json.code")"
  [[ "$code" == 200 ]] || die "cannot read the signature payload of $TRAINSTACK_IMAGE (HTTP $code)"
  [[ "sha256:$(sha256sum "$dir/payload.json" | cut -d' ' -f1)" == "${layer%% *}" ]] ||
    fail "the signature payload of $TRAINSTACK_IMAGE is not the one its manifest names: refusing to run it"
  local said
  said="$(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["critical"]
assert c["type"] == "cosign container image signature"
print(c["image"]["docker-manifest-digest"], c["identity"]["docker-reference"])' "$dir/payload.json" 2>/dev/null)" ||
    fail "the signature payload of $TRAINSTACK_IMAGE is not cosign's simple signing: refusing to run it"
  [[ "$said" == "$digest $repo" ]] ||
    fail "the signature of $TRAINSTACK_IMAGE is of ${said/ / in }, not of $digest in $repo: refusing to run it"
  printf '%s' "${layer#* }" | base64 -d >"$dir/sig.der" 2>/dev/null ||
    fail "the signature of $TRAINSTACK_IMAGE is not base64: refusing to run it"
  { echo "-----BEGIN PUBLIC KEY-----"; printf '%s' "$TRAINSTACK_IMAGE_PUBLIC_KEY" | fold -w 64; echo
    echo "-----END PUBLIC KEY-----"; } >"$dir/key.pem"
  # The key is named by the sha256 of its DER (docs/images.md says how to compute it from the user data).
  openssl dgst -sha256 -verify "$dir/key.pem" -signature "$dir/sig.der" "$dir/payload.json" >/dev/null 2>&1 ||
    fail "the signature of $TRAINSTACK_IMAGE does not verify with the stack's public key (TRAINSTACK_IMAGE_PUBLIC_KEY, sha256 $(printf '%s' "$TRAINSTACK_IMAGE_PUBLIC_KEY" | base64 -d 2>/dev/null | sha256sum | cut -c1-16)): refusing to run it"
  rm -rf "$dir"
  log "image $TRAINSTACK_IMAGE signed by the stack's key"
}

# After the pull, the image on disk must be the one the env file names: docker keeps the
# manifest digests an image was pulled by (RepoDigests). Another digest is a verdict, and the
# image is never run.
image_verify() {
  local digests
  digests=$(docker image inspect --format '{{join .RepoDigests " "}}' "$TRAINSTACK_IMAGE") ||
    die "cannot inspect $TRAINSTACK_IMAGE"
  [[ " $digests " == *" $TRAINSTACK_IMAGE "* ]] ||
    fail "the pulled image is not $TRAINSTACK_IMAGE (its digests: ${digests:-none}): refusing to run it"
  log "image $TRAINSTACK_IMAGE verified by digest"
}

main() {
  load_env
  NVIDIA_REPO_URL="${TRAINSTACK_NVIDIA_REPO_URL:-https://nvidia.github.io/libnvidia-container}"
  # The toolkit release pinned for machines that do not bring one (plain Ubuntu).
  CTK_VERSION="${TRAINSTACK_NVIDIA_CTK_VERSION:-1.17.8-1}"
  DRIVER_BRANCH="${TRAINSTACK_NVIDIA_DRIVER:-570-server}"
  # How long apt waits for another apt (the image's first-boot updates) to let go of dpkg.
  APT_LOCK_WAIT_S="${TRAINSTACK_APT_LOCK_WAIT_S:-600}"
  PIP_LOG="$RUNTIME_DIR/pip.log"
  rm -f "$RUNTIME_DIR/failure-reason"
  local start=$SECONDS
  step gpu gpu
  step docker docker_engine
  step cli cli_check
  step toolkit toolkit
  step data data_dir
  image_start
  step code code
  step image image_wait
  printf 'DATA_DIR=%q\nCODE_DIR=%q\nPIP_DIR=%q\n' "$DATA_DIR" "$CODE_DIR" "$PIP_DIR" >"$STATE_DIR/paths"
  log "bootstrap done in $((SECONDS - start))s"
}

main "$@"
