"""The training machine's own names: where the boot scripts keep their logs and state, the
systemd units they run as, and the ports the trainer and Jupyter listen on.

One definition, as ``runfolder/layout.py`` is for the run folder. The user data
(``components/userdata.py``), the group's firewall (``components/common.py``) and ``ops``
(``ops/remote.py``: logs, the Jupyter tunnel) import these; the scripts in ``userdata/``
cannot, so ``userdata/lib.sh`` holds a copy of each, which
``tests/userdata/test_machine_names.py`` compares with this module (and checks that no
script spells one by hand). Standard library only.
"""

from __future__ import annotations

# -- folders (lib.sh: each under $TRAINSTACK_ROOT, so the scripts run in a sandbox) --
ETC_DIR = "/etc/trainstack"
ENV_FILE = f"{ETC_DIR}/env"
STATE_DIR = "/var/lib/trainstack"
RUNTIME_DIR = "/run/trainstack"
LOG_DIR = "/var/log/trainstack"
OPT_DIR = "/opt/trainstack"
BIN_DIR = f"{OPT_DIR}/bin"
# Every script's log file (and the trainer's, in the same folder).
LOG_GLOB = f"{LOG_DIR}/*.log"

# -- systemd units (journalctl -u takes them with or without .service) --
TRAINER_UNIT = "trainstack-trainer.service"
WATCHER_UNIT = "trainstack-watcher.service"
JUPYTER_UNIT = "trainstack-jupyter.service"
# The trainer's container, named after its unit.
CONTAINER = "trainstack-trainer"

# -- Jupyter (access.jupyter: true; userdata/jupyter.sh) --
# It listens on 127.0.0.1 only; `ops tunnel --jupyter` forwards to it over SSH.
JUPYTER_PORT = 8888
# A 0600 file of the SSH login user, made anew at each boot (/run); read over SSH by ops.
JUPYTER_TOKEN_FILE = f"{RUNTIME_DIR}/jupyter/token"  # noqa: S105 (a path, not a secret)

# -- several machines --
# The TensorFlow workers' gRPC port (TF_CONFIG; TRAINSTACK_WORKER_PORT moves it), and the
# range the group's firewall opens between its own machines.
WORKER_PORT = 2222
WORKER_PORTS = (2222, 2231)
