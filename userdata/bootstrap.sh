#!/usr/bin/env bash
# trainstack bootstrap: makes the machine ready to run the trainer container. GPU and
# driver check, Docker and the NVIDIA container toolkit, the cloud CLI, local NVMe for
# data staging, the trainer code and its pip packages, registry login and image pull.
# Idempotent: each step leaves a marker or a finished directory, so a second boot of
# the same disk redoes nothing. Writes what the supervisor needs to $STATE_DIR/paths.
# A machine that cannot train (no GPU, bad code archive) fails with a reason in
# $RUNTIME_DIR/failure-reason, which the supervisor turns into the run's FAILED marker.
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

apt_install() {
  DEBIAN_FRONTEND=noninteractive retry 3 apt-get install -y -q --no-install-recommends "$@"
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
    retry 3 apt-get update -q
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
  retry 3 apt-get update -q
  apt_install docker.io
  systemctl enable --now docker
}

cloud_cli() {
  case "$TRAINSTACK_CLOUD" in
    aws) command -v aws >/dev/null || { log "installing the AWS CLI"; retry 3 snap install aws-cli --classic; } ;;
    gcp) command -v gcloud >/dev/null || { log "installing the gcloud CLI"; retry 3 snap install google-cloud-cli --classic; } ;;
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
    retry 3 apt-get update -q -o Dir::Etc::sourcelist=sources.list.d/nvidia-container-toolkit.list \
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
# when the machine stops, which is fine for a cache. Without one, the root disk serves.
data_dir() {
  local dev="" candidate mnt="$ROOT/mnt/trainstack-data"
  for candidate in "${TRAINSTACK_DEV_DIR:-/dev/disk/by-id}"/{nvme-Amazon_EC2_NVMe_Instance_Storage_*,google-local-nvme-ssd-*,google-local-ssd-*}; do
    if [[ -e "$candidate" ]]; then dev="$candidate"; break; fi
  done
  if [[ -z "$dev" ]]; then
    DATA_DIR="$STATE_DIR/data"
  else
    if ! mountpoint -q "$mnt"; then
      blkid "$dev" >/dev/null 2>&1 || mkfs.ext4 -F -q -L trainstack-data "$dev"
      mkdir -p "$mnt"
      mount -o noatime,discard "$dev" "$mnt"
    fi
    DATA_DIR="$mnt"
  fi
  mkdir -p "$DATA_DIR"
  log "data staging on $DATA_DIR${dev:+ ($dev)}"
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
    retry 5 store_cp "$TRAINSTACK_CODE_URI" "$tmp/code.tar.gz" || fail "cannot fetch $TRAINSTACK_CODE_URI"
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

# trainer/requirements.txt installed once per (requirements, image) into a host cache that
# the container mounts. Constrained to the image's own versions so TF's numpy stays.
packages() {
  local req="$CODE_DIR/trainer/requirements.txt" key tmp
  [[ -f "$req" ]] || return 0
  key="$( (cat "$req"; printf '%s' "$TRAINSTACK_IMAGE") | sha256sum | cut -c1-16)"
  PIP_DIR="$OPT_DIR/pip/$key"
  [[ -d "$PIP_DIR" ]] && return 0
  mkdir -p "$OPT_DIR/pip"
  tmp="$(mktemp -d "$OPT_DIR/pip/.install.XXXXXX")"
  image
  log "installing trainer requirements into $PIP_DIR"
  retry 3 docker run --rm --network host -v "$CODE_DIR:/opt/trainstack/code:ro" -v "$tmp:/opt/trainstack/pip" \
    "$TRAINSTACK_IMAGE" sh -c 'python -m pip freeze --all >/tmp/image.txt &&
      python -m pip install -q --no-cache-dir --disable-pip-version-check --target /opt/trainstack/pip
      -c /tmp/image.txt -r /opt/trainstack/code/trainer/requirements.txt' ||
    fail "pip could not install trainer/requirements.txt into $TRAINSTACK_IMAGE"
  mv "$tmp" "$PIP_DIR"
}

image() {
  [[ -e "$RUNTIME_DIR/image.ready" ]] && return 0
  if docker image inspect "$TRAINSTACK_IMAGE" >/dev/null 2>&1; then
    log "image $TRAINSTACK_IMAGE already on disk"
  else
    retry 3 registry_login || fail "cannot log in to the registry of $TRAINSTACK_IMAGE"
    retry 5 docker pull -q "$TRAINSTACK_IMAGE" || fail "cannot pull $TRAINSTACK_IMAGE"
  fi
  touch "$RUNTIME_DIR/image.ready"
}

main() {
  load_env
  NVIDIA_REPO_URL="${TRAINSTACK_NVIDIA_REPO_URL:-https://nvidia.github.io/libnvidia-container}"
  # The toolkit release pinned for machines that do not bring one (plain Ubuntu).
  CTK_VERSION="${TRAINSTACK_NVIDIA_CTK_VERSION:-1.17.8-1}"
  DRIVER_BRANCH="${TRAINSTACK_NVIDIA_DRIVER:-570-server}"
  rm -f "$RUNTIME_DIR/failure-reason"
  local start=$SECONDS
  step gpu gpu
  step docker docker_engine
  step cli cloud_cli
  step toolkit toolkit
  step data data_dir
  step image image
  step code code
  printf 'DATA_DIR=%q\nCODE_DIR=%q\nPIP_DIR=%q\n' "$DATA_DIR" "$CODE_DIR" "$PIP_DIR" >"$STATE_DIR/paths"
  log "bootstrap done in $((SECONDS - start))s"
}

main "$@"
