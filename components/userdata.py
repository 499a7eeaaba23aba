"""Renders the cloud-init user data for a stack's machines from the files in `userdata/`.

The `#cloud-config` document is built as data (a dict dumped with YAML), never as shell
inside YAML strings: the boot scripts are real files in `userdata/`, installed with
`write_files`. Only non-secret values go in: the env file carries what the machine needs
to find its run (bucket URI, region, group name, image reference, limits).
"""

from __future__ import annotations

import base64
import gzip
import json
import shlex
from collections.abc import Mapping

import pulumi
import yaml

from components.machine import BIN_DIR, ENV_FILE, JUPYTER_UNIT, OPT_DIR, TRAINER_UNIT, WATCHER_UNIT
from components.project import USERDATA_DIR
from runfolder import environment

# Where systemd looks for the units an administrator installs.
SYSTEMD_DIR = "/etc/systemd/system"

# Where the user's folder (run.code) is on the machines, inside the code archive or the
# built image: /opt/trainstack/code is the trainer's working folder in the container.
USER_CODE_DIR = f"{OPT_DIR}/code/usercode"
# EC2 refuses user data over 16 KiB (before base64); cloud-init unpacks gzip by itself.
AWS_USER_DATA_LIMIT = 16 * 1024

# Keys every machine's env file holds; components fill them, boot scripts read them.
BOOT_ENV_KEYS = environment.BOOT_KEYS

# Seconds between the notice and SIGKILL: most of AWS's 2-minute and GCE's 30-second
# warning, leaving the rest for the final upload to finish and the machine to go.
NOTICE_GRACE_S = {"aws": 100, "gcp": 25}

# Installed by write_files: (file in userdata/, path on the machine, permissions). What runs after the
# run folder's first read (bootstrap.sh, rendezvous.sh) comes from the bucket instead: components/code.py's
# BOOT_SCRIPTS, installed by lib.sh's boot_scripts.
# The first, the NVIDIA driver's hold: Ubuntu's unattended-upgrades would replace the driver's libraries under
# the loaded kernel module, and every later container fails with "driver/library version mismatch" until a
# reboot. unattended-upgrades reads its configuration only when it starts, and apt's timers may start it as
# soon as the network is up: write_files runs in cloud-init's network stage, ordered before sysinit.target and
# so before timers.target (a drop-in needs no dpkg lock either, which first boots often hold).
APT_HOLD = ("apt-hold-nvidia.conf", "/etc/apt/apt.conf.d/51trainstack-hold-nvidia", "0644")
FILES = (
    APT_HOLD,
    ("lib.sh", f"{BIN_DIR}/lib.sh", "0644"),
    ("supervise.sh", f"{BIN_DIR}/supervise.sh", "0755"),
    ("watch-notice.sh", f"{BIN_DIR}/watch-notice.sh", "0755"),
    ("finish.sh", f"{BIN_DIR}/finish.sh", "0755"),
    ("stop-trainer.sh", f"{BIN_DIR}/stop-trainer.sh", "0755"),
    (TRAINER_UNIT, f"{SYSTEMD_DIR}/{TRAINER_UNIT}", "0644"),
    (WATCHER_UNIT, f"{SYSTEMD_DIR}/{WATCHER_UNIT}", "0644"),
)
UNITS = (WATCHER_UNIT, TRAINER_UNIT)
# Installed only on machines whose run folder is in the other cloud's store (env TRAINSTACK_STORE_CLOUD),
# by that store's cloud: their credentials there (the boot archive is fetched with them, so these cannot
# come from it). Not on the others, and one way only: EC2's user data has no room to spare (16 KiB gzipped).
FEDERATION_FILES = {store: ((f"federation-{store}.sh", f"{BIN_DIR}/federation-{store}.sh", "0644"),)
                    for store in ("aws", "gcp")}
# Installed and enabled only on stacks with access.jupyter: true (env TRAINSTACK_JUPYTER=1).
JUPYTER_FILES = (
    ("jupyter.sh", f"{BIN_DIR}/jupyter.sh", "0755"),
    (JUPYTER_UNIT, f"{SYSTEMD_DIR}/{JUPYTER_UNIT}", "0644"),
)


# Seconds of the notice's grace kept for the trainer after a script-mode command stops.
SCRIPT_STOP_MARGIN_S = 10


def boot_env(settings, *, run_uri: str, group: str, code_uri: str, boot_uri: str = "") -> dict[str, str]:
    """Everything a machine of this stack needs, as env-file values (no secrets). `boot_uri`: the boot
    scripts' archive in the bucket (components/code.py's `pack_boot_scripts`), which every machine
    fetches before bootstrap; a document is rendered only with one.

    The TRAINSTACK_* trainer options (model, steps, …) are the trainer's own environment
    variables: the container gets this file with --env-file and needs no flags.
    """
    run, compute = settings.run, settings.compute
    env = {
        environment.CLOUD: settings.cloud,
        environment.REGION: settings.region,
        # Recorded with each attempt: status and COMPLETE split time and cost by placement.
        environment.PLACEMENT: f"{settings.cloud} {settings.region}",
        environment.RUN_URI: run_uri,
        environment.GROUP: group,
        environment.IMAGE: settings.image.reference,
        environment.CODE_URI: code_uri,
        environment.BOOT_URI: boot_uri,
        environment.MAX_RUNTIME_S: str(int(compute.max_runtime_hours * 3600)),
        environment.NODES: str(compute.nodes),
        environment.GPUS_PER_NODE: str(compute.gpus_per_node),
        environment.NOTICE_GRACE_S: str(NOTICE_GRACE_S[settings.cloud]),
        environment.POLL_S: "5",
        environment.MAX_FAILURES: "3",
        environment.MODEL: run.model,
        environment.STEPS: str(run.steps),
        environment.BATCH_SIZE: str(run.batch_size),
        environment.KEEP_CHECKPOINTS: str(run.keep_checkpoints),
        environment.SEED: str(run.seed),
    }
    if run.synthetic:
        env[environment.SYNTHETIC] = "1"
    if run.data_uri:
        env[environment.DATA_URI] = run.data_uri
    if run.validation_data_uri:
        env[environment.VALIDATION_DATA_URI] = run.validation_data_uri
    if run.eval_every_steps:
        env[environment.EVAL_EVERY_STEPS] = str(run.eval_every_steps)
    if run.keep_best:
        env[environment.KEEP_BEST] = run.keep_best
    # Both cadences always: a null (off) is the trainer's 0, never a missing key that its own
    # default would fill.
    env[environment.CHECKPOINT_EVERY_STEPS] = str(run.checkpoint_every_steps or 0)
    env[environment.CHECKPOINT_EVERY_SECONDS] = str(run.checkpoint_every_seconds or 0)
    if run.extra_args:
        env[environment.EXTRA_ARGS] = shlex.join(run.extra_args)
    if run.code:
        env[environment.CODE_DIR] = USER_CODE_DIR
    if run.command:
        # Script mode (trainer/script.py): the trainer runs this command in the code folder. The
        # command's own stop must end inside docker's stop timeout (the notice's grace), with
        # time left for the trainer to record it.
        env[environment.COMMAND] = json.dumps(run.command)
        env[environment.STOP_GRACE_S] = str(max(5, NOTICE_GRACE_S[settings.cloud] - SCRIPT_STOP_MARGIN_S))
        if run.keras == 2:
            # The command inherits the trainer's environment: its tf.keras is Keras 2 (tf_keras) on
            # every machine, one or several.
            env["TF_USE_LEGACY_KERAS"] = "1"
    if settings.access.jupyter:
        env[environment.JUPYTER] = "1"
    env.update(price_env(settings))
    return env


def price_env(settings) -> dict[str, str]:
    """The estimated USD per machine-hour the trainer records with the run (ops status and COMPLETE
    total the cost from it): the dearest of the stack's types, from the shipped price table only, so
    the user data does not change with the cloud's live spot price. Empty when the table has no price.

    A placement away from home's region adds its checkpoint writes to the home bucket (`pricing.checkpoint_writes`,
    at the assumed checkpoint size), spread over the run's machines: the cost so far counts them for exactly the
    time the run trains there, and the note says so."""
    from components import pricing

    est = pricing.hourly_cost(settings)
    per_machine = [t.spot if settings.compute.spot else t.on_demand for t in est.types]
    if not per_machine or None in per_machine:
        return {}
    if settings.compute.spot:
        what = "spot estimate (dearest type)"
        if settings.compute.max_price_per_hour is not None and settings.cloud == "aws":  # GCE has no max price
            per_machine = [min(p, settings.compute.max_price_per_hour) for p in per_machine]
    else:
        what = "on-demand (dearest type)"
    price = max(per_machine)
    writes = pricing.checkpoint_writes(settings, settings.cloud, settings.region).per_hour
    if writes:
        price += writes / settings.compute.nodes
        what += f" + checkpoint writes to home ${writes:.2f}/h"
    return {environment.PRICE_PER_HOUR: f"{price:.4f}",
            environment.PRICE_NOTE: f"{what}, price table {est.recorded}"}


def shipped(name: str) -> str:
    """The text of `userdata/<name>` as installed on the machines. Scripts lose their
    whole-line comments (EC2 takes 16 KiB of gzipped user data, and the comments, which
    say why, are a third of it); kept are the first two lines (the shebang or shellcheck's
    shell line, and the title), and `# shellcheck` directives (the rendered scripts are
    checked too). A `#` that is not the first thing on its line is never touched.
    """
    text = (USERDATA_DIR / name).read_text()
    if not name.endswith(".sh"):
        return text
    lines = text.splitlines(keepends=True)
    return "".join(line for i, line in enumerate(lines)
                   if i < 2 or not line.lstrip().startswith("#") or line.lstrip().startswith("# shellcheck"))


def render_env(env: Mapping[str, str]) -> str:
    """The env file: KEY=value lines, each value single-quoted for sh (`lib.sh` sources it; a quote
    inside is written '\\''). The container gets the values through `docker run --env-file`, one
    line each, taken literally but for a line's trailing carriage return: a value holds no line
    break, carriage return or NUL (bash cannot hold one)."""
    lines = []
    for k in sorted(env):
        v = str(env[k])
        if any(c in v for c in "\n\r\x00"):
            raise ValueError(f"{k}: value may not contain newlines, carriage returns or NULs: {v!r}")
        quoted = v.replace("'", "'\\''")
        lines.append(f"{k}='{quoted}'")
    return "\n".join(lines) + "\n"


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (the installed files) as literal `|` blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_user_data(cloud: str, env: Mapping[str, str]) -> str:
    """The `#cloud-config` document for one machine of `cloud`, with `env` in its env file.

    With TRAINSTACK_JUPYTER=1 in `env` it also installs and enables the Jupyter unit.

    cloud-init writes the scripts and units and enables the units once; systemd starts
    them on every later boot (cloud-init's runcmd runs only on an instance's first boot).
    """
    if cloud not in ("aws", "gcp"):
        raise ValueError(f"cloud must be aws or gcp, not {cloud!r}")
    missing = [k for k in BOOT_ENV_KEYS if k not in env]
    if missing:
        raise ValueError(f"user data env lacks {', '.join(missing)}")
    if env[environment.CLOUD] != cloud:
        raise ValueError(f"env is for {env[environment.CLOUD]!r}, the document for {cloud!r}")
    files = [
        {"path": ENV_FILE, "permissions": "0644", "owner": "root:root", "content": render_env(env)},
    ]
    jupyter = env.get(environment.JUPYTER) == "1"
    across = env.get(environment.STORE_CLOUD, cloud) != cloud
    if not env[environment.BOOT_URI]:
        raise ValueError(f"{environment.BOOT_URI} is empty: every machine fetches its boot scripts from the bucket "
                         "(components/code.py's pack_boot_scripts)")
    if across and env[environment.STORE_CLOUD] not in FEDERATION_FILES:
        raise ValueError(f"{environment.STORE_CLOUD} must be aws or gcp, not {env[environment.STORE_CLOUD]!r}")
    federation = FEDERATION_FILES[env[environment.STORE_CLOUD]] if across else ()
    for name, path, mode in FILES + (JUPYTER_FILES if jupyter else ()) + federation:
        files.append({"path": path, "permissions": mode, "owner": "root:root",
                      "content": shipped(name)})
    units = UNITS + ((JUPYTER_UNIT,) if jupyter else ())
    doc = {
        "write_files": files,
        "runcmd": [
            ["systemctl", "daemon-reload"],
            # --no-block: cloud-init is itself a unit in the boot transaction; waiting for
            # the trainer (which runs for hours) would hold up the rest of the boot.
            ["systemctl", "enable", "--now", "--no-block", *units],
        ],
    }
    return "#cloud-config\n" + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000)


def encode_user_data(text: str) -> str:
    """User data as EC2 launch templates take it: gzip (no timestamp, so unchanged text
    gives unchanged bytes and no replacement), then base64. cloud-init detects the gzip.
    """
    data = gzip.compress(text.encode(), compresslevel=9, mtime=0)
    if len(data) > AWS_USER_DATA_LIMIT:
        raise ValueError(f"user data is {len(data)} bytes gzipped; EC2 takes at most {AWS_USER_DATA_LIMIT}")
    return base64.b64encode(data).decode()


def decode_user_data(b64: str) -> str:
    """The text of base64 user data, gzipped or not (the inverse of `encode_user_data`)."""
    data = base64.b64decode(b64)
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode()


def aws_store_env(*, region: str, role_arn: pulumi.Input[str], audience: str) -> dict[str, pulumi.Input[str]]:
    """The env-file values of a machine on GCP whose run folder is in S3 (an AWS-home stack's GCP placement):
    the store's cloud and region (as AWS_DEFAULT_REGION, which the `aws` CLI and boto3 read), the role it
    assumes with its Google ID token, and the audience it asks that token for. lib.sh keeps the token in a file (AWS_WEB_IDENTITY_TOKEN_FILE), which the `aws` CLI and
    boto3 (the trainer's, in the container too) read by themselves with AWS_ROLE_ARN."""
    return {
        environment.STORE_CLOUD: "aws",
        "AWS_DEFAULT_REGION": region,
        "AWS_ROLE_ARN": role_arn,
        environment.TOKEN_AUDIENCE: audience,
    }


def gcs_store_env(*, audience: pulumi.Input[str], service_account: pulumi.Input[str]) -> dict[str, pulumi.Input[str]]:
    """The env-file values of a machine on AWS whose run folder is in GCS (a GCP-home stack's AWS placement):
    the store's cloud, the workload identity pool provider that trusts the machine's AWS role (`audience`,
    `//iam.googleapis.com/projects/NUMBER/locations/global/workloadIdentityPools/POOL/providers/ID`) and
    the service account that role's sessions impersonate. federation-gcp.sh writes google-auth's
    `external_account` credentials from them (an `aws1` credential source: the instance's role through
    IMDSv2), which `gcloud` and the trainer's GCS client read by themselves."""
    return {
        environment.STORE_CLOUD: "gcp",
        environment.GCP_AUDIENCE: audience,
        environment.GCP_SERVICE_ACCOUNT: service_account,
    }


def user_data_output(
    cloud: str, settings, *, group: str, run_uri: pulumi.Input[str], code_uri: pulumi.Input[str],
    boot_uri: pulumi.Input[str], image_ref: pulumi.Input[str],
    store: Mapping[str, pulumi.Input[str]] | None = None, image_public_key: pulumi.Input[str] | None = None,
) -> pulumi.Output[str]:
    """The stack's `#cloud-config` once the bucket, code and image are known; the image
    reference is the one the stack resolved (the pushed digest when it builds its own).
    `boot_uri`: the boot scripts' archive (components/code.py). `store`: env-file values
    saying how a machine reaches a run folder in the other cloud (`aws_store_env`), added to its own.
    `image_public_key`: the key that signed the image (base64 DER; public), which the machine verifies its
    signature with before `docker run` (userdata/bootstrap.sh); None for an image the stack does not sign."""
    store = dict(store or {})
    if image_public_key is not None:
        store[environment.IMAGE_PUBLIC_KEY] = image_public_key
    keys = sorted(store)

    def render(values: list[str]) -> str:
        run, code, boot, image, *extra = values
        env = boot_env(settings, run_uri=run, group=group, code_uri=code, boot_uri=boot)
        env[environment.IMAGE] = image
        env.update(zip(keys, extra, strict=True))
        if image_public_key is not None and not env[environment.IMAGE_PUBLIC_KEY]:
            raise ValueError(f"{environment.IMAGE_PUBLIC_KEY} is empty: the image was signed by no key the stack read")
        return render_user_data(cloud, env)

    return pulumi.Output.all(run_uri, code_uri, boot_uri, image_ref, *(store[k] for k in keys)).apply(render)

