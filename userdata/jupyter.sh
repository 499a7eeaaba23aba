#!/usr/bin/env bash
# trainstack jupyter (access.jupyter): pinned JupyterLab in the run's image on 127.0.0.1:8888
# only, no GPU. The token is made here into one 0600 file of the SSH login user (read by
# `ops tunnel --jupyter`), mounted read-only for Jupyter; never in user data, logs or argv.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "${TRAINSTACK_LIB:-$(dirname "$0")/lib.sh}"

PIN="jupyterlab==4.6.6"
TOKEN="$JUPYTER_TOKEN_FILE" # a new one each boot (/run)
DIR="${TOKEN%/*}"

load_env
USER_="${TRAINSTACK_SSH_USER:-ubuntu}"
mkdir -p "$DIR" && chmod 0711 "$DIR"
if [[ ! -s "$TOKEN" ]]; then
  (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$TOKEN.new" && mv "$TOKEN.new" "$TOKEN")
fi
chown "$USER_" "$TOKEN" || log "no user $USER_: the Jupyter token stays root's"
chmod 0600 "$TOKEN"
log "Jupyter token in $TOKEN (0600, $USER_)"

# The trainer unit's bootstrap brings the image.
until [[ -e "$RUNTIME_DIR/image.ready" && -e "$STATE_DIR/paths" ]]; do sleep "${TRAINSTACK_POLL_S:-5}"; done
# shellcheck source=/dev/null
. "$STATE_DIR/paths"
PKGS="$OPT_DIR/jupyter/$(printf '%s %s' "$PIN" "$TRAINSTACK_IMAGE" | sha256sum | cut -c1-16)"
if [[ ! -d "$PKGS" ]]; then
  log "installing $PIN into $PKGS"
  mkdir -p "$OPT_DIR/jupyter"
  tmp="$(mktemp -d "$OPT_DIR/jupyter/.install.XXXXXX")"
  # shellcheck disable=SC2016 # -c: the image's versions stay
  retry 3 docker run --rm --network host -v "$tmp:/opt/trainstack/pip" -e "PIN=$PIN" "$TRAINSTACK_IMAGE" \
    sh -c 'python -m pip freeze --all >/tmp/image.txt && python -m pip install -q --no-cache-dir
      --disable-pip-version-check --target /opt/trainstack/pip -c /tmp/image.txt "$PIN"' || die "pip could not install $PIN"
  mv "$tmp" "$PKGS"
fi
mkdir -p "$STATE_DIR/notebooks"
docker rm -f trainstack-jupyter >/dev/null 2>&1 || true
log "starting JupyterLab on 127.0.0.1:$JUPYTER_PORT"
exec docker run --rm --name trainstack-jupyter --network host -v "$TOKEN:/run/secrets/jupyter-token:ro" \
  -e JUPYTER_TOKEN_FILE=/run/secrets/jupyter-token -v "$PKGS:/opt/trainstack/jupyter:ro" \
  -v "$STATE_DIR/notebooks:/notebooks" -w /notebooks ${CODE_DIR:+-v "$CODE_DIR:/opt/trainstack/code:ro"} \
  -e PYTHONPATH=/opt/trainstack/jupyter:/opt/trainstack/code "$TRAINSTACK_IMAGE" python -m jupyterlab \
  --ip=127.0.0.1 --port="$JUPYTER_PORT" --no-browser --allow-root --ServerApp.port_retries=0
