"""The boot sandbox: the rendered user data installed in a temp root and run for real.

`write_files` of the rendered `#cloud-config` are written under `<tmp>/root` (the scripts
take `TRAINSTACK_ROOT` as the prefix of /etc, /var, /opt, /run), fake machine commands
(`tests/userdata/fakes.py`) come first on PATH and record their calls, the fake metadata
service answers on 127.0.0.1, and moto_server is the bucket and the Auto Scaling API.
`Sandbox.boot()` starts the two units' main processes as systemd would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import yaml

from components.settings import load_settings
from components.userdata import boot_env, render_user_data
from tests.userdata.metadata import INSTANCE_ID, MetadataServer
from trainer import layout

FAKES = Path(__file__).with_name("fakes.py")
TOOLS = ("aws", "docker", "nvidia-smi", "apt-get", "systemctl", "shutdown", "journalctl", "gpg", "snap",
         "modprobe", "mkfs.ext4", "mount", "mountpoint", "blkid", "findmnt", "gcloud")


def settings_for(cloud: str = "aws", **run):
    """A small run's settings: the mlp on synthetic data, a few hundred steps."""
    raw = {
        "cloud": cloud,
        "region": "us-east-1" if cloud == "aws" else "us-central1",
        "run": {"model": "mlp", "synthetic": True, "steps": 40, "batchSize": 16,
                "checkpointEverySteps": 20, "checkpointEverySeconds": 600, **run},
        "compute": {"instanceTypes": ["g5.xlarge"] if cloud == "aws" else ["g2-standard-4"], "maxRuntimeHours": 1},
    }
    if cloud == "gcp":
        raw["project"] = "trainstack-test"
    return load_settings(raw, stack="sandbox")


class Sandbox:
    """One machine's disk, PATH and processes; `boot()` is one boot of that machine."""

    def __init__(self, tmp: Path, run, metadata: MetadataServer, group: str, code_uri: str,
                 *, env_overrides: dict[str, str] | None = None, settings=None, toolkit: bool = True,
                 gpu: bool = True, nvme: bool = False):
        self.tmp, self.run, self.metadata, self.group = tmp, run, metadata, group
        self.root = tmp / "root"
        self.bin = tmp / "bin"
        self.state = tmp / "fake-state"
        self.log = tmp / "calls.jsonl"
        self.procs: dict[str, subprocess.Popen] = {}
        for d in (self.root, self.bin, self.state):
            d.mkdir(parents=True, exist_ok=True)
        tools = TOOLS + (("nvidia-ctk",) if toolkit else ())
        for name in tools:
            wrapper = self.bin / name
            wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKES}" {name} "$@"\n')
            wrapper.chmod(0o755)
        env = boot_env(settings or settings_for(), run_uri=run.uri, group=group, code_uri=code_uri)
        env.update({"TRAINSTACK_POLL_S": "0.2", **(env_overrides or {})})
        self.user_data = render_user_data(env["TRAINSTACK_CLOUD"], env)
        self.doc = yaml.safe_load(self.user_data)
        for f in self.doc["write_files"]:
            path = self.root / f["path"].lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f["content"])
            path.chmod(int(f["permissions"], 8))
        (self.root / "dev/disk/by-id").mkdir(parents=True)
        if nvme:
            (self.root / "dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_AWS0123").touch()
        pci = self.root / "sys/bus/pci/devices/0000:00:1e.0"
        pci.mkdir(parents=True)
        (pci / "vendor").write_text("0x10de\n" if gpu else "0x1d0f\n")
        self.env = {
            **run.env,
            "PATH": f"{self.bin}:/usr/bin:/bin:/usr/sbin:/sbin",
            "TRAINSTACK_ROOT": str(self.root),
            "TRAINSTACK_METADATA_URL": metadata.url,
            "TRAINSTACK_NVIDIA_REPO_URL": metadata.url + "/nvidia",
            "TRAINSTACK_DEV_DIR": str(self.root / "dev/disk/by-id"),
            "TRAINSTACK_PCI_DIR": str(self.root / "sys/bus/pci/devices"),
            "TRAINSTACK_RETRY_BASE_S": "0",
            "TRAINSTACK_RESTART_BACKOFF_S": "0",
            "TRAINSTACK_NOTICE_WAIT_S": "600",
            "FAKE_LOG": str(self.log),
            "FAKE_STATE": str(self.state),
            "FAKE_BIN": str(self.bin),
            "FAKE_GPU": "1" if gpu else "0",
            "CUDA_VISIBLE_DEVICES": "",
        }

    # -- running --

    def _start(self, unit: str, script: str) -> subprocess.Popen:
        out = open(self.tmp / f"journal-{unit}.log", "ab")  # noqa: SIM115 (the child owns it)
        proc = subprocess.Popen([str(self.root / "opt/trainstack/bin" / script)], env=self.env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.procs[unit] = proc
        return proc

    def boot(self, *, watcher: bool = True) -> subprocess.Popen:
        """One boot: the watcher and the trainer unit start; returns the trainer unit's process."""
        (self.root / "run").mkdir(exist_ok=True)
        if watcher:
            self._start("watcher", "watch-notice.sh")
        return self._start("trainer", "supervise.sh")

    def wait(self, unit: str = "trainer", timeout: float = 240) -> int:
        try:
            return self.procs[unit].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{unit} still running after {timeout}s:\n{self.journal(unit)[-4000:]}")

    def power_off(self) -> None:
        """The machine goes away: every process is killed and /run (tmpfs) is lost."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.procs.clear()
        for lost in (self.root / "run", self.state / "mounts", self.state / "mounted-sources",
                     self.state / "containers"):
            subprocess.run(["rm", "-rf", str(lost)], check=True)

    def journal(self, unit: str = "trainer") -> str:
        path = self.tmp / f"journal-{unit}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- what happened --

    def calls(self, cmd: str | None = None) -> list[dict]:
        if not self.log.exists():
            return []
        out = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [c for c in out if cmd is None or c["cmd"] == cmd]

    def argvs(self, cmd: str) -> list[list[str]]:
        return [c["argv"] for c in self.calls(cmd)]

    def first(self, cmd: str, *prefix: str) -> float:
        """Time of the first call of `cmd` whose argv starts with `prefix`."""
        for c in self.calls(cmd):
            argv = [a for a in c["argv"] if a != "--only-show-errors"]
            if argv[: len(prefix)] == list(prefix):
                return c["t"]
        raise AssertionError(f"no call {cmd} {' '.join(prefix)} in {[c['cmd'] for c in self.calls()]}")


def s3_keys(run) -> dict[str, bytes]:
    """Every object under the run folder, by key relative to it."""
    s3 = boto3.client("s3", endpoint_url=run.vars["AWS_ENDPOINT_URL"])
    prefix = run.uri.removeprefix(f"s3://{run.bucket}/") + "/"
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=run.bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix):]] = s3.get_object(Bucket=run.bucket, Key=o["Key"])["Body"].read()
    return out


def _jsonl(run, key: str) -> list[dict]:
    # One object read directly: listing the whole run races the trainer's checkpoint pruning.
    s3 = boto3.client("s3", endpoint_url=run.vars["AWS_ENDPOINT_URL"])
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


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    server = MetadataServer()
    yield server
    server.close()


@pytest.fixture
def group(s3_run) -> str:
    """An Auto Scaling group of one machine on moto_server; its name."""
    return make_group(s3_run, 1)


def make_group(s3_run, size: int) -> str:
    """An Auto Scaling group of `size` machines on moto_server; its name."""
    ep = s3_run.vars["AWS_ENDPOINT_URL"]
    name = f"trainstack-{uuid.uuid4().hex[:8]}"
    ec2 = boto3.client("ec2", endpoint_url=ep, region_name="us-east-1")
    ec2.create_launch_template(LaunchTemplateName=name,
                               LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})
    boto3.client("autoscaling", endpoint_url=ep, region_name="us-east-1").create_auto_scaling_group(
        AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": name}, MinSize=size, MaxSize=size,
        DesiredCapacity=size, AvailabilityZones=["us-east-1a"])
    return name


def group_size(run, name: str) -> tuple[int, int, int]:
    g = boto3.client("autoscaling", endpoint_url=run.vars["AWS_ENDPOINT_URL"], region_name="us-east-1")
    desc = g.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    return desc["MinSize"], desc["MaxSize"], desc["DesiredCapacity"]


@pytest.fixture
def code_uri(s3_run) -> str:
    """The checkout's trainer packed as the stack packs it, uploaded to the bucket."""
    from components.aws.code import archive_key, pack

    data = pack()
    key = archive_key(data)
    boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"]).put_object(
        Bucket=s3_run.bucket, Key=key, Body=data)
    return f"s3://{s3_run.bucket}/{key}"


@pytest.fixture
def machines(tmp_path, metadata) -> Iterator:
    """Makes sandbox machines (`machines(run, group, code_uri, **kw)`); powers them off after."""
    made: list[Sandbox] = []

    def make(run, group: str, code_uri: str, **kw) -> Sandbox:
        box = Sandbox(tmp_path / f"machine{len(made)}", run, metadata, group, code_uri, **kw)
        made.append(box)
        return box

    yield make
    for box in made:
        box.power_off()


@pytest.fixture
def sandbox_factory(s3_run, group, code_uri, machines):
    """Makes AWS sandbox machines of the `group` fixture's group, running the checkout's trainer."""

    def make(**kw) -> Sandbox:
        return machines(s3_run, group, kw.pop("code_uri", code_uri), **kw)

    return make


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")
