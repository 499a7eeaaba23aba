"""`lib.sh` `registry_login`: docker logs in to the registry the image's host names, with the machine's
identity, and to no other.

A placement's machines pull a built image from their own region's repository, which need not be the
stack's home region; an ECR token is for one region's registry, so the region comes from the image's
host (`ACCOUNT.dkr.ecr.REGION.amazonaws.com`), not from the machine's region. The function runs in
bash as the boot runs it, with `aws`, `gcloud` and `docker` as functions that record their arguments.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from components.userdata import USERDATA_DIR

ECR_WEST = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
AR_EUROPE = "europe-west4-docker.pkg.dev"


def _login(image: str, machine_region: str) -> list[list[str]]:
    """The commands `registry_login` ran (name first), in order; fails when it fails."""
    script = (
        f'set -euo pipefail; . "{USERDATA_DIR / "lib.sh"}"; '
        'record() { printf "%s\\n" "$*" >&3; }; '
        'aws() { record aws "$@"; echo ecr-token; }; '
        'gcloud() { record gcloud "$@"; echo ya29.token; }; '
        'docker() { local stdin; stdin=$(cat); record docker "$@" "<$stdin"; }; '
        f"TRAINSTACK_IMAGE={image!r}; TRAINSTACK_REGION={machine_region!r}; registry_login"
    )
    proc = subprocess.run(["bash", "-c", f"exec 3>&1 1>&2; {script}"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return [line.split(" ") for line in proc.stdout.splitlines()]


@pytest.mark.parametrize(("image", "machine_region", "expected"), [
    # A placement's machine in us-west-2 pulling its own region's repository, home being us-east-1: the
    # same either way, since the host decides.
    (f"{ECR_WEST}/trainstack/regions@sha256:{'ab' * 32}", "us-east-1",
     [["aws", "ecr", "get-login-password", "--region", "us-west-2"],
      ["docker", "login", "--username", "AWS", "--password-stdin", ECR_WEST, "<ecr-token"]]),
    (f"{ECR_WEST}/trainstack/regions@sha256:{'ab' * 32}", "us-west-2",
     [["aws", "ecr", "get-login-password", "--region", "us-west-2"],
      ["docker", "login", "--username", "AWS", "--password-stdin", ECR_WEST, "<ecr-token"]]),
    ("123456789012.dkr.ecr.ap-southeast-2.amazonaws.com/trainstack/dev:trainer-0123456789abcdef", "us-east-1",
     [["aws", "ecr", "get-login-password", "--region", "ap-southeast-2"],
      ["docker", "login", "--username", "AWS", "--password-stdin",
       "123456789012.dkr.ecr.ap-southeast-2.amazonaws.com", "<ecr-token"]]),
    (f"{AR_EUROPE}/my-proj-123/trainstack-regions/trainer@sha256:{'cd' * 32}", "us-central1",
     [["gcloud", "auth", "print-access-token"],
      ["docker", "login", "--username", "oauth2accesstoken", "--password-stdin", f"https://{AR_EUROPE}",
       "<ya29.token"]]),
    # A public image: no login at all.
    ("tensorflow/tensorflow:2.21.0-gpu", "us-east-1", []),
], ids=["ecr-of-another-region", "ecr-of-its-region", "ecr-by-tag", "artifact-registry", "public"])
def test_it_logs_in_to_the_registry_the_image_names(image, machine_region, expected):
    calls = _login(image, machine_region)
    assert calls == expected, json.dumps(calls)
