#!/usr/bin/env bash
# trainstack stop-trainer: the trainer unit's ExecStop. When the machine shuts down for
# any reason, the container gets SIGTERM and the notice grace period to checkpoint.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "${TRAINSTACK_LIB:-$(dirname "$0")/lib.sh}"

load_env
docker stop --time "$GRACE_S" "$CONTAINER" >/dev/null 2>&1 || true
