"""Renders the cloud-init user data for a stack's machines from the files in `userdata/`.

The `#cloud-config` document is built as data (a dict dumped with YAML), never as shell
inside YAML strings: the boot scripts are real files in `userdata/`, installed with
`write_files`. Only non-secret values go in: the env file carries what the machine needs
to find its run (bucket URI, region, group name, image reference, limits).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

import yaml

USERDATA_DIR = Path(__file__).resolve().parent.parent / "userdata"
ENV_FILE = "/etc/trainstack/env"

# Keys every machine's env file holds; components fill them, boot scripts read them.
BOOT_ENV_KEYS = (
    "TRAINSTACK_CLOUD",          # aws | gcp
    "TRAINSTACK_REGION",         # region of the stack
    "TRAINSTACK_RUN_URI",        # s3://BUCKET/runs/ID or gs://BUCKET/runs/ID
    "TRAINSTACK_GROUP",          # the Auto Scaling group / managed instance group name
    "TRAINSTACK_IMAGE",          # pinned image reference (by digest when known)
    "TRAINSTACK_CODE_URI",       # trainer archive in the bucket ("" when baked into the image)
    "TRAINSTACK_MAX_RUNTIME_S",  # the run's deadline, counted from the first boot
    "TRAINSTACK_NODES",          # machines in the group
    "TRAINSTACK_GPUS_PER_NODE",
)


def boot_env(settings, *, run_uri: str, group: str, code_uri: str) -> dict[str, str]:
    """Everything a machine of this stack needs, as env-file values (no secrets).

    The TRAINSTACK_* trainer options (model, steps, …) are the trainer's own environment
    variables: the container gets this file with --env-file and needs no flags.
    """
    run, compute = settings.run, settings.compute
    env = {
        "TRAINSTACK_CLOUD": settings.cloud,
        "TRAINSTACK_REGION": settings.region,
        "TRAINSTACK_RUN_URI": run_uri,
        "TRAINSTACK_GROUP": group,
        "TRAINSTACK_IMAGE": settings.image.reference,
        "TRAINSTACK_CODE_URI": code_uri,
        "TRAINSTACK_MAX_RUNTIME_S": str(int(compute.max_runtime_hours * 3600)),
        "TRAINSTACK_NODES": str(compute.nodes),
        "TRAINSTACK_GPUS_PER_NODE": str(compute.gpus_per_node),
        "TRAINSTACK_MODEL": run.model,
        "TRAINSTACK_STEPS": str(run.steps),
        "TRAINSTACK_BATCH_SIZE": str(run.batch_size),
        "TRAINSTACK_KEEP_CHECKPOINTS": str(run.keep_checkpoints),
        "TRAINSTACK_SEED": str(run.seed),
    }
    if run.synthetic:
        env["TRAINSTACK_SYNTHETIC"] = "1"
    if run.data_uri:
        env["TRAINSTACK_DATA_URI"] = run.data_uri
    if run.checkpoint_every_steps:
        env["TRAINSTACK_CHECKPOINT_EVERY_STEPS"] = str(run.checkpoint_every_steps)
    if run.checkpoint_every_seconds:
        env["TRAINSTACK_CHECKPOINT_EVERY_SECONDS"] = str(run.checkpoint_every_seconds)
    if run.extra_args:
        env["TRAINSTACK_EXTRA_ARGS"] = shlex.join(run.extra_args)
    return env


def render_env(env: Mapping[str, str]) -> str:
    """The env file: KEY=value lines, values single-quoted for systemd and sh alike."""
    lines = []
    for k in sorted(env):
        v = str(env[k])
        if "'" in v or "\n" in v:
            raise ValueError(f"{k}: value may not contain quotes or newlines: {v!r}")
        lines.append(f"{k}='{v}'")
    return "\n".join(lines) + "\n"


def render_user_data(cloud: str, env: Mapping[str, str]) -> str:
    """The `#cloud-config` document for one machine of `cloud`, with `env` in its env file."""
    if cloud not in ("aws", "gcp"):
        raise ValueError(f"cloud must be aws or gcp, not {cloud!r}")
    missing = [k for k in BOOT_ENV_KEYS if k not in env]
    if missing:
        raise ValueError(f"user data env lacks {', '.join(missing)}")
    doc = {
        "write_files": [
            {"path": ENV_FILE, "permissions": "0644", "owner": "root:root", "content": render_env(env)},
        ],
    }
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False, width=1000)
