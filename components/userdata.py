"""Renders the cloud-init user data for a stack's machines from the files in `userdata/`.

The `#cloud-config` document is built as data (a dict dumped with YAML), never as shell
inside YAML strings: the boot scripts are real files in `userdata/`, installed with
`write_files`. Only non-secret values go in: the env file carries what the machine needs
to find its run (bucket URI, region, group name, image reference, limits).
"""

from __future__ import annotations

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
