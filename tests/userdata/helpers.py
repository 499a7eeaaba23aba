"""Helpers for the boot sandbox tests: what a run left in the bucket, the emulated Auto Scaling
group, the container's environment as the machine writes it from the env file, and waiting
for a condition with a timeout."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import boto3
import pytest

from components.userdata import USERDATA_DIR, render_env
from devtools.metadata import INSTANCE_ID
from runfolder import layout


@functools.cache
def _s3_client(endpoint: str, *credentials: str | None):
    # A session of its own: boto3's default session keeps the first credentials it resolved in this
    # process, so a client made later with other keys in the environment would still sign with those.
    return boto3.session.Session().client("s3", endpoint_url=endpoint)


def _s3(run):
    """An S3 client for `run`'s server, made once per server and credentials (a client costs
    about 12 ms of CPU to make, and waits ask the bucket many times)."""
    return _s3_client(run.vars["AWS_ENDPOINT_URL"], *(os.environ.get(k) for k in (
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION")))


def s3_keys(run) -> dict[str, bytes]:
    """Every object under the run folder, by key relative to it."""
    s3 = _s3(run)
    prefix = run.uri.removeprefix(f"s3://{run.bucket}/") + "/"
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=run.bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix):]] = s3.get_object(Bucket=run.bucket, Key=o["Key"])["Body"].read()
    return out


def _jsonl(run, key: str) -> list[dict]:
    # One object read directly: listing the whole run races the trainer's checkpoint pruning.
    s3 = _s3(run)
    try:
        raw = s3.get_object(Bucket=run.bucket, Key=run.uri.removeprefix(f"s3://{run.bucket}/") + "/" + key)
    except s3.exceptions.NoSuchKey:
        return []
    return [json.loads(line) for line in raw["Body"].read().decode().splitlines() if line.strip()]


def events(run) -> list[dict]:
    """The trainer's events (events.jsonl)."""
    return _jsonl(run, layout.EVENTS_KEY)


def machine_events(run, machine: str = INSTANCE_ID) -> list[dict]:
    """One machine's own events (machine-events/<machine>.jsonl)."""
    return _jsonl(run, layout.machine_events_key(machine))


def group_size(run, name: str) -> tuple[int, int, int]:
    g = boto3.client("autoscaling", endpoint_url=run.vars["AWS_ENDPOINT_URL"], region_name="us-east-1")
    desc = g.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    return desc["MinSize"], desc["MaxSize"], desc["DesiredCapacity"]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1, longest: float = 0.5):
    """`predicate()`'s first true value, asked every `interval` seconds at first, then less often
    (up to every `longest`): a predicate often reads the bucket (about 20 ms of CPU between the
    client and moto_server), and a wait can last a trainer's whole start-up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
        interval = min(interval * 1.5, max(interval, longest))
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


PIPELINE = r"""
set -euo pipefail
. "$LIB"
instance_id() { echo i-0abc; }
load_env
eval "$(sed -n '/^write_container_env() {/,/^}/p' "$SUPERVISE")"
write_container_env
"""


def docker_env_file(data: bytes) -> dict[str, str]:
    """`docker run --env-file` as docker documents and implements it: one variable per line (a line's
    trailing CR dropped, as Go's line scanner does), leading whitespace trimmed, `#` lines and blank
    lines skipped, split at the first `=`, the value taken literally."""
    env = {}
    for raw in data.split(b"\n"):
        line = raw.removesuffix(b"\r").decode("utf-8").lstrip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def through_the_machine(env: dict[str, str], tmp: Path) -> dict[str, str]:
    """The container's environment after render → load_env → write_container_env → docker."""
    return container_env(render_env(env), tmp)


def container_env(env_file: str, tmp: Path) -> dict[str, str]:
    """The container's environment from the machine's env file (its text, as the user data writes
    it): the real `lib.sh` `load_env` and `supervise.sh` `write_container_env` in bash, then docker's
    reading of `--env-file`."""
    path = tmp / "env"
    path.write_bytes(env_file.encode())
    container = tmp / "container.env"
    run = subprocess.run(["bash", "-c", PIPELINE], capture_output=True, timeout=60, env={
        "PATH": "/usr/bin:/bin", "LIB": str(USERDATA_DIR / "lib.sh"), "SUPERVISE": str(USERDATA_DIR / "supervise.sh"),
        "TRAINSTACK_ROOT": str(tmp / "root"), "TRAINSTACK_ENV_FILE": str(path), "CONTAINER_ENV": str(container)})
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    return docker_env_file(container.read_bytes())


def committed_steps(store) -> list[int]:
    """The steps of the run's committed checkpoints, oldest first."""
    return sorted(s for k in store.list(layout.CHECKPOINTS_PREFIX)
                  for s, rest in [layout.checkpoint_key_step(k) or (0, "")] if rest == layout.COMMITTED)


def diff_from_uninterrupted(run_uri: str, tmp: Path, *, steps: int, batch: int, seed: int, every: int) -> float:
    """Max |Δ| between the final weights of the run at `run_uri` and those of the same run (the mlp on
    synthetic data, deterministic) trained in one attempt, never stopped, under `tmp`."""
    from tests.trainer.helpers import committed_weights, max_abs_diff, run_trainer, trainer_env

    reference = f"file://{tmp}/reference/runs/ref"
    rc, _events, err = run_trainer(reference, "--model", "mlp", "--synthetic", "--deterministic", "--steps", str(steps),
                                   "--batch-size", str(batch), "--seed", str(seed), "--checkpoint-every-steps",
                                   str(every), env=trainer_env())
    assert rc == 0, err[-3000:]
    return max_abs_diff(committed_weights(run_uri, steps, tmp / "moved"), committed_weights(reference, steps, tmp / "ref"))


def preempted_after_first_checkpoint(box, md, store) -> int:
    """An AWS sandbox machine (`box`, its metadata server `md`) trains the run in `store` with the trainer
    held after its first checkpoint (held_trainer.py), gets a spot notice there, stops with exit 143 and
    waits for the cloud, which takes it (powered off); the run's last committed step."""
    from tests.trainer.helpers import REPO

    box.env.update(FAKE_TRAINER_MODULE="tests.userdata.held_trainer", FAKE_TRAINER_PATH=str(REPO))
    box.boot()
    wait_for(lambda: (box.state / "trainer-held").exists(), 180, "the trainer held after its first checkpoint")
    wait_for(lambda: committed_steps(store), 60, "a committed checkpoint")
    md.notice_aws()
    wait_for(lambda: "exited with 143" in box.journal(), 120, "the trainer's exit 143")
    wait_for(lambda: "waiting for the cloud to take the machine back" in box.journal(), 60,
             "the supervisor waiting for the cloud")
    box.power_off()
    return committed_steps(store)[-1]


def installed_scripts(user_data: str, where: Path) -> list[Path]:
    """The scripts a machine of `user_data` runs, written to `where` as it installs them (for shellcheck,
    which follows their `source`s there): the document's, then the boot archive's, which lib.sh's
    boot_scripts puts beside them (components/code.py's BOOT_SCRIPTS, as shipped)."""
    import yaml

    from components.code import BOOT_SCRIPTS

    scripts = []
    for f in yaml.safe_load(user_data)["write_files"]:
        if f["path"].endswith(".sh"):
            scripts.append(where / Path(f["path"]).name)
            scripts[-1].write_text(f["content"])
    for name, _mode in BOOT_SCRIPTS:
        scripts.append(where / name)
        scripts[-1].write_text((USERDATA_DIR / name).read_text())
    return scripts


def shellcheck(names: list[str], where: Path) -> tuple[int, str]:
    """`shellcheck -x` (its default severity, style: every check) over the scripts `names` in the folder
    `where`, which their `source`s are followed in: its exit code and output. The same scripts (the
    folder's every script, by name and content) are checked once a test session, across its xdist
    workers: each cloud's document installs the same boot scripts (about 4 CPU-s a check)."""
    digest = hashlib.sha256("\0".join(names).encode())
    for path in sorted(where.glob("*.sh")):
        digest.update(f"\0{path.name}\0".encode() + hashlib.sha256(path.read_bytes()).digest())
    folder = Path(tempfile.gettempdir()) / f"trainstack-shellcheck-{os.environ.get('PYTEST_XDIST_TESTRUNUID', os.getpid())}"
    folder.mkdir(exist_ok=True)
    verdict = folder / f"{digest.hexdigest()}.json"
    with open(folder / f"{digest.hexdigest()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second worker with the same scripts waits for the first's verdict
        if not verdict.exists():
            proc = subprocess.run(["shellcheck", "-x", *names], cwd=where, capture_output=True, text=True, timeout=120)
            verdict.with_suffix(".tmp").write_text(json.dumps([proc.returncode, proc.stdout + proc.stderr]))
            verdict.with_suffix(".tmp").rename(verdict)
        code, output = json.loads(verdict.read_text())
    return code, output
