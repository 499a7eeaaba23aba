"""The boot sandbox: the rendered user data installed in a temp root and run for real.

`write_files` of the rendered `#cloud-config` are written under `<tmp>/root` (the scripts
take `TRAINSTACK_ROOT` as the prefix of /etc, /var, /opt, /run), fake machine commands
(`devtools/machine_commands.py`) come first on PATH and record their calls, the fake metadata
service answers on 127.0.0.1, and moto_server is the bucket and the Auto Scaling API.
`Sandbox.boot()` starts the two units' main processes as systemd would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import boto3
import yaml

from components.settings import load_settings
from components.userdata import boot_env, render_user_data
from devtools import cli_server, trainer_server
from devtools.metadata import MetadataServer

FAKES = Path(__file__).parent / "machine_commands.py"
TOOLS = ("aws", "docker", "nvidia-smi", "apt-get", "systemctl", "shutdown", "journalctl", "gpg", "snap",
         "modprobe", "mkfs.ext4", "mount", "mountpoint", "blkid", "findmnt", "gcloud")


def settings_for(cloud: str = "aws", **run):
    """A small run's settings: the mlp on synthetic data, a few hundred steps."""
    raw = {
        "cloud": cloud,
        "region": "us-east-1" if cloud == "aws" else "us-central1",
        "run": {"model": "mlp", "synthetic": True, "checkpointEverySeconds": 600, **(
            {} if "command" in run else {"steps": 40, "batchSize": 16, "checkpointEverySteps": 20}), **run},
        "compute": {"instanceTypes": ["g5.xlarge"] if cloud == "aws" else ["g2-standard-4"], "maxRuntimeHours": 1},
    }
    if cloud == "gcp":
        raw["project"] = "trainstack-test"
    return load_settings(raw, stack="sandbox")


# The digest a sandbox's image is pinned by when its settings give none: what `pulumi up` resolves the
# tag to (components/registry.py), here a stand-in, since the sandbox's docker is a fake.
SANDBOX_DIGEST = "sha256:" + "5a" * 32


def pinned(settings):
    """`settings` with its image pinned by digest, as `pulumi up` pins it (the one given, else SANDBOX_DIGEST)."""
    if settings.image.digest:
        return settings
    return settings.model_copy(update={"image": settings.image.model_copy(update={"digest": SANDBOX_DIGEST})})


def make_group(run, size: int) -> str:
    """An Auto Scaling group of `size` machines on the moto_server that `run` (a `devtools.servers.Run`) is on; its name."""
    ep = run.vars["AWS_ENDPOINT_URL"]
    name = f"trainstack-{uuid.uuid4().hex[:8]}"
    ec2 = boto3.client("ec2", endpoint_url=ep, region_name="us-east-1")
    ec2.create_launch_template(LaunchTemplateName=name,
                               LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})
    boto3.client("autoscaling", endpoint_url=ep, region_name="us-east-1").create_auto_scaling_group(
        AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": name}, MinSize=size, MaxSize=size,
        DesiredCapacity=size, AvailabilityZones=["us-east-1a"])
    return name


def upload_boot_scripts(run) -> str:
    """The boot scripts' archive, packed as the stack packs it, in `run`'s bucket (as `pulumi up` puts
    it there); its URI."""
    from components.code import boot_key, pack_boot_scripts

    data = pack_boot_scripts()
    key = boot_key(data)
    scheme, rest = run.uri.split("://", 1)
    bucket = rest.split("/", 1)[0]
    from unittest import mock

    from runfolder.storage import open_store

    # A store of its own, made with the run's variables over this process's: boto3's default session
    # keeps the first credentials it found, which a test's earlier server may have issued.
    with mock.patch.dict(os.environ, run.vars):
        open_store(f"{scheme}://{bucket}").put_bytes(key, data)
    return f"{scheme}://{bucket}/{key}"


class Sandbox:
    """One machine's disk, PATH and processes; `boot()` is one boot of that machine.

    `warm_trainer`: the machine's trainer (`docker run ... python -m trainer`) forks from this
    process's warm trainer server (devtools/trainer_server.py) instead of importing TensorFlow
    itself; the tests' machines do, the bench's never (it measures real start-ups)."""

    def __init__(self, tmp: Path, run, metadata: MetadataServer, group: str, code_uri: str,
                 *, env_overrides: dict[str, str] | None = None, settings=None, toolkit: bool = True,
                 gpu: bool = True, nvme: bool = False, warm_trainer: bool = False):
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
            wrapper.write_text(cli_server.wrapper(name, FAKES))
            wrapper.chmod(0o755)
        env = boot_env(pinned(settings or settings_for()), run_uri=run.uri, group=group, code_uri=code_uri)
        # The watcher polls the metadata service each second (5 s on a machine): a poll is two
        # metadata reads (a curl each, about 20 ms of CPU in all), and at 0.2 s the watcher alone
        # took 2.7 s of CPU in 20 s of a test's wait when a read was a dozen short processes,
        # against 0.9 s at 1 s.
        env.update({"TRAINSTACK_POLL_S": "1", **(env_overrides or {})})
        if not env["TRAINSTACK_BOOT_URI"]:
            env["TRAINSTACK_BOOT_URI"] = upload_boot_scripts(run)
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
            "FAKE_CLI_SOCKET": cli_server.ensure_server(),
            "FAKE_GPU": "1" if gpu else "0",
            "CUDA_VISIBLE_DEVICES": "",
        }
        if warm_trainer:  # the tests' machines: `docker run ... python -m trainer` forks from a warm server
            # Waited for: a trainer started before the server answers runs as the plain process (about
            # 3 s of CPU more), as the first trainers of a worker's first cluster test did on a loaded machine.
            self.env[trainer_server.SOCKET_VAR] = trainer_server.ensure_server()

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

    def install_boot_scripts(self) -> None:
        """The boot archive's scripts (bootstrap.sh, rendezvous.sh) fetched and installed as the supervisor
        does before its first bootstrap (lib.sh's boot_scripts), for tests that run them alone."""
        (self.root / "run").mkdir(exist_ok=True)
        proc = subprocess.run(["bash", "-c", '. "$1"; load_env; boot_scripts', "-",
                               str(self.root / "opt/trainstack/bin/lib.sh")],
                              env=self.env, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise AssertionError(f"boot_scripts exited {proc.returncode}: {proc.stdout}{proc.stderr}")

    def bootstrap(self, timeout: float = 120) -> int:
        """bootstrap.sh alone, as the supervisor runs it (after load_env and boot_scripts), to its exit;
        what it leaves running in the background (the package cache's upload) is killed by power_off."""
        self.install_boot_scripts()
        self._start("bootstrap", "bootstrap.sh")
        return self.wait("bootstrap", timeout)

    def wait(self, unit: str = "trainer", timeout: float = 240) -> int:
        try:
            return self.procs[unit].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{unit} still running after {timeout}s:\n{self.journal(unit)[-4000:]}") from None

    def power_off(self) -> None:
        """The machine goes away: every process is killed and /run (tmpfs) is lost."""
        for proc in self.procs.values():
            # The whole session, also when its first process has exited: what it left running
            # in the background goes with the machine.
            with contextlib.suppress(ProcessLookupError):
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
