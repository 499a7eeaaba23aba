"""The environment variables trainstack's processes hand one another: every `TRAINSTACK_*` name, defined once.

Three hand-offs use them:

- **the trainer's options**: every flag `--some-option` of `python -m trainer` can also be given as
  `TRAINSTACK_SOME_OPTION` (`option_env`; `trainer/config.py` derives each option's variable with it). The
  options that another process sets by name are listed in `OPTIONS`, and a test checks each against the
  trainer's parser;
- **the machine's env file** (`components/userdata.py` writes it; the boot scripts in `userdata/` source
  it, and the trainer's container gets it with `--env-file`): the machine's own keys below, and the trainer's
  options the stack sets;
- **script mode**: what the trainer tells the user's command (`trainer/script.py` sets them, `trainer/fit.py`
  reads them inside the user's script).

Standard library only, as the rest of `runfolder/`: the Pulumi program, the trainer, the controller and a
user's script import it. The boot scripts cannot: `tests/userdata/test_env_names.py` checks each name they
read against this table, and that no Python module outside it spells one by hand.
"""

from __future__ import annotations

PREFIX = "TRAINSTACK_"


def option_env(option: str) -> str:
    """The variable of the trainer's option `option` (a `TrainConfig` field or a flag): `batch_size` and
    `--batch-size` are `TRAINSTACK_BATCH_SIZE`."""
    return PREFIX + option.lstrip("-").replace("-", "_").upper()


# -- the trainer's options that other processes set or read by name (each is a flag of `python -m trainer`) --

RUN_URI = option_env("run_uri")
MODEL = option_env("model")
CODE_DIR = option_env("code_dir")
SYNTHETIC = option_env("synthetic")
DATA_URI = option_env("data_uri")
VALIDATION_DATA_URI = option_env("validation_data_uri")
EVAL_EVERY_STEPS = option_env("eval_every_steps")
KEEP_BEST = option_env("keep_best")
STEPS = option_env("steps")
BATCH_SIZE = option_env("batch_size")
CHECKPOINT_EVERY_STEPS = option_env("checkpoint_every_steps")
CHECKPOINT_EVERY_SECONDS = option_env("checkpoint_every_seconds")
KEEP_CHECKPOINTS = option_env("keep_checkpoints")
SEED = option_env("seed")
DATA_DIR = option_env("data_dir")
WORK_DIR = option_env("work_dir")
GPUS_PER_NODE = option_env("gpus_per_node")
STARTUP_TIMEOUT = option_env("startup_timeout")
PRICE_PER_HOUR = option_env("price_per_hour")
PRICE_NOTE = option_env("price_note")
PLACEMENT = option_env("placement")
STOP_GRACE_S = option_env("stop_grace_s")
VERBOSE = option_env("verbose")
OPTIONS = (RUN_URI, MODEL, CODE_DIR, SYNTHETIC, DATA_URI, VALIDATION_DATA_URI, EVAL_EVERY_STEPS, KEEP_BEST, STEPS,
           BATCH_SIZE, CHECKPOINT_EVERY_STEPS, CHECKPOINT_EVERY_SECONDS, KEEP_CHECKPOINTS, SEED, DATA_DIR, WORK_DIR,
           GPUS_PER_NODE, STARTUP_TIMEOUT, PRICE_PER_HOUR, PRICE_NOTE, PLACEMENT, STOP_GRACE_S, VERBOSE)

# -- read by the trainer beside its options --

# More flags, shell-quoted, parsed as if given on the command line (the stack's run.extraArgs).
EXTRA_ARGS = PREFIX + "EXTRA_ARGS"
# Script mode's command as a JSON list of strings (the stack's run.command); never passed on to the command.
COMMAND = PREFIX + "COMMAND"
# This machine's name in the run's lease (the boot sets the instance's id; else the host name).
MACHINE_ID = PREFIX + "MACHINE_ID"
# Under SageMaker: where the job's /opt/ml is (trainer/sagemaker_entry.py; the tests lay one out in a folder).
OPT_ML = PREFIX + "OPT_ML"

# -- the machine's env file: the machine's own keys (the boot scripts read them) --

CLOUD = PREFIX + "CLOUD"  # aws | gcp
REGION = PREFIX + "REGION"  # region of the stack
GROUP = PREFIX + "GROUP"  # the Auto Scaling group / managed instance group name
IMAGE = PREFIX + "IMAGE"  # pinned image reference (by digest when known)
CODE_URI = PREFIX + "CODE_URI"  # trainer archive in the bucket ("" when baked into the image)
BOOT_URI = PREFIX + "BOOT_URI"  # the boot scripts' archive in the bucket (components/code.py)
MAX_RUNTIME_S = PREFIX + "MAX_RUNTIME_S"  # the run's deadline, counted from the first boot
NODES = PREFIX + "NODES"  # machines in the group
NOTICE_GRACE_S = PREFIX + "NOTICE_GRACE_S"  # seconds the trainer gets after a spot notice before SIGKILL
POLL_S = PREFIX + "POLL_S"  # notice watcher's polling interval
MAX_FAILURES = PREFIX + "MAX_FAILURES"  # trainer failures in a row before the run is FAILED
JUPYTER = PREFIX + "JUPYTER"  # "1": the stack installs the Jupyter unit (access.jupyter)
# A run folder in the other cloud's store: that cloud, and how the machine reaches it by federation.
STORE_CLOUD = PREFIX + "STORE_CLOUD"
TOKEN_AUDIENCE = PREFIX + "TOKEN_AUDIENCE"  # the audience of the Google ID token an S3 store's role trusts
IMAGE_PUBLIC_KEY = PREFIX + "IMAGE_PUBLIC_KEY"  # base64 DER of the key that signs the image ("": not signed)
GCP_AUDIENCE = PREFIX + "GCP_AUDIENCE"  # the workload identity pool provider a GCS store trusts
GCP_SERVICE_ACCOUNT = PREFIX + "GCP_SERVICE_ACCOUNT"  # the service account it impersonates

# Keys every machine's env file holds (components/userdata.py refuses a document without one).
BOOT_KEYS = (CLOUD, REGION, RUN_URI, GROUP, IMAGE, CODE_URI, BOOT_URI, MAX_RUNTIME_S, NODES, GPUS_PER_NODE,
             NOTICE_GRACE_S, POLL_S, MAX_FAILURES)
# The env file's keys the boot scripts read (the rest are the trainer's, or decide what is rendered).
SCRIPT_KEYS = (CLOUD, REGION, RUN_URI, GROUP, IMAGE, CODE_URI, BOOT_URI, MAX_RUNTIME_S, NODES, NOTICE_GRACE_S,
               POLL_S, MAX_FAILURES, STORE_CLOUD, TOKEN_AUDIENCE, GCP_AUDIENCE, GCP_SERVICE_ACCOUNT, IMAGE_PUBLIC_KEY)

# -- script mode: what the trainer tells the user's command (besides RUN_URI, KEEP_CHECKPOINTS, SEED and
# CHECKPOINT_EVERY_SECONDS, as the trainer resolved them) --

CHECKPOINT_DIR = PREFIX + "CHECKPOINT_DIR"  # the command's local checkpoint folder
TENSORBOARD_DIR = PREFIX + "TENSORBOARD_DIR"  # uploaded to the run's tensorboard/
MODEL_DIR = PREFIX + "MODEL_DIR"  # becomes the run's model/ when the command exits 0
OUTPUT_DIR = PREFIX + "OUTPUT_DIR"  # kept in the run's outputs/
MESSAGES_FILE = PREFIX + "MESSAGES_FILE"  # the callback's messages to the trainer (progress, checkpoints)
ATTEMPT = PREFIX + "ATTEMPT"  # the attempt's number

# -- a Kubernetes pod's own (scheduler kubernetes: the Job sets them, the downward API fills the pod's;
# trainer/pod.py reads them) --

POD_NAMESPACE = PREFIX + "POD_NAMESPACE"  # the pod's namespace (downward API)
NODE_NAME = PREFIX + "NODE_NAME"  # the node the pod runs on (downward API)
WORKERS = PREFIX + "WORKERS"  # every worker's host:port, by the Job's completion index, comma-separated

# -- the controller's configuration (controller/config.py; the stack sets it on the function) --

PLACEMENTS = PREFIX + "PLACEMENTS"

# -- the boot scripts' own settings: each has its default in the script that reads it; the stack never sets
# them, the tests' sandboxes do (faster waits, a fake metadata server, a folder standing for /) --

MACHINE_SETTINGS = frozenset(PREFIX + name for name in (
    "APT_LOCK_WAIT_S", "BOOTSTRAP_BACKOFF_S", "BOOTSTRAP_WAIT_S", "CLI_WAIT_S", "CLUSTER_POLL_S", "DEV_DIR",
    "DLAMI_NVME", "END_STALL_S", "ENV_FILE", "FINISH_WAIT_S", "GOOGLE_IAM_CREDENTIALS_URL", "GOOGLE_STS_URL",
    "LEASE_HELD_S", "LEASE_RETRY_S", "LIB", "MAX_IDLE_GENERATIONS", "METADATA_URL", "NOTICE_WAIT_S", "NVIDIA_CTK_VERSION",
    "NVIDIA_DRIVER", "NVIDIA_REPO_URL", "PCI_DIR", "PEER_WAIT_S", "PIP_CACHE_WAIT_S", "RENDEZVOUS_TTL_S",
    "RESTART_BACKOFF_S", "RETRY_BASE_S", "ROOT", "SCALE_WAIT_S", "SEAL_TRIES", "SSH_USER", "STALL_POLL_S",
    "STALL_S", "START_STALL_S", "STORE_WAIT_S", "TOKEN_REFRESH_S", "WORKER_PORT",
))
