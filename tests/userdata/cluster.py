"""Several sandbox machines at once: one run, one group, one bucket, a machine per address.

Each `Machine` is a `Sandbox` (devtools/sandbox.py) with its own metadata service on
its own loopback address (127.0.0.<n>), its own instance id and its own worker port (the
real trainer binds its port on every address). `Cluster` plays the cloud's part: it boots
the group's machines, serves a spot notice to one, takes one away (power-off: processes
killed, /run lost) and brings a replacement with a new address and id, as an Auto Scaling
group keeps its size. Every wait has a timeout.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import socket
import tarfile
import time
from pathlib import Path

import boto3

from devtools.metadata import MetadataServer
from devtools.sandbox import Sandbox
from runfolder import layout
from tests.userdata.helpers import wait_for

CLUSTER_TRAINER = Path(__file__).with_name("cluster_trainer.py")


def upload_code(run, files: dict[str, str]) -> str:
    """A code archive holding `files`, uploaded as the stack uploads one; its URI."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    key = f"code/trainer-{hashlib.sha256(data).hexdigest()[:16]}.tar.gz"
    boto3.client("s3", endpoint_url=run.vars["AWS_ENDPOINT_URL"]).put_object(Bucket=run.bucket, Key=key, Body=data)
    return f"s3://{run.bucket}/{key}"


def cluster_trainer_uri(run) -> str:
    """The stand-in multi-worker trainer (tests/userdata/cluster_trainer.py) as a code archive."""
    return upload_code(run, {"trainer/__init__.py": "", "trainer/__main__.py": CLUSTER_TRAINER.read_text()})


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Machine(Sandbox):
    """One machine of the cluster: a sandbox with its own address, id and metadata service."""

    def __init__(self, tmp: Path, run, group: str, code_uri: str, *, number: int, address: str | None = None, **kw):
        self.number = number
        self.address = address or f"127.0.0.{10 + number}"
        self.instance_id = f"i-{number:017x}"
        self.md = MetadataServer(instance_id=self.instance_id, name=f"{group}-m{number:03d}",
                                 address=self.address, host=self.address)
        super().__init__(tmp, run, self.md, group, code_uri, **{"warm_trainer": True, **kw})
        self.port = free_port(self.address)
        self.env["TRAINSTACK_WORKER_PORT"] = str(self.port)

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    def exits(self) -> list[int]:
        """The trainer exit codes this machine's supervisor saw, in order."""
        return [int(c) for c in re.findall(r"trainer exited with (\d+)", self.journal())]

    def failures_counted(self) -> list[int]:
        return [int(n) for n in re.findall(r"failures in a row: (\d+)", self.journal())]

    def close(self) -> None:
        self.power_off()
        self.md.close()


class Cluster:
    """The group: `nodes` machines asked for; `boot()` adds one, `take()` removes one."""

    def __init__(self, tmp: Path, run, group: str, code_uri: str, *, nodes: int, env: dict[str, str] | None = None,
                 settings=None, box_env: dict[str, str] | None = None):
        self.tmp, self.run, self.group, self.code_uri, self.nodes = tmp, run, group, code_uri, nodes
        # Polls as slow as a test allows: every poll here starts processes on 2 shared cores.
        self.env = {"TRAINSTACK_NODES": str(nodes), "TRAINSTACK_POLL_S": "1", **(env or {})}
        # A poll here takes seconds (every fake CLI call starts Python and boto3 on a shared
        # machine): the heartbeat TTL leaves room for several.
        self.box_env = {"TRAINSTACK_CLUSTER_POLL_S": "2", "TRAINSTACK_RENDEZVOUS_TTL_S": "30",
                        "TRAINSTACK_NOTICE_WAIT_S": "600", **(box_env or {})}
        self.settings = settings
        self.machines: list[Machine] = []
        self.taken: set[int] = set()  # the numbers of the machines `take` took
        self.s3 = boto3.client("s3", endpoint_url=run.vars["AWS_ENDPOINT_URL"])
        self.prefix = run.uri.removeprefix(f"s3://{run.bucket}/") + "/"

    def boot(self, *, address: str | None = None) -> Machine:
        """A new machine of the group (a new id; a new address, 127.0.0.<10 + n> unless given), booted."""
        number = len(self.machines)
        box = Machine(self.tmp / f"m{number}", self.run, self.group, self.code_uri, number=number,
                      address=address, env_overrides=self.env, settings=self.settings)
        box.env.update(self.box_env)
        self.machines.append(box)
        box.boot()
        return box

    def notice(self, box: Machine) -> None:
        """The cloud announces it takes `box` back (AWS: two minutes ahead)."""
        box.md.notice_aws()

    def take(self, box: Machine) -> None:
        """The cloud takes `box` away (after a notice, or at once: SIGKILL to everything on it)."""
        self.taken.add(box.number)
        box.close()

    def configs(self, box: Machine) -> list[dict]:
        """Every TF_CONFIG `box`'s trainers were started with, in order."""
        return [json.loads(line.removeprefix("TF_CONFIG=")) for env in box.argvs("docker-env-file")
                for line in env if line.startswith("TF_CONFIG=")]

    def assert_one_list_per_generation(self) -> None:
        """Every trainer of a generation started with that generation's sealed list, each at its own
        index (a member taken between the seal and its start never starts)."""
        sealed = self.sealed()
        started: dict[int, list[int]] = {}
        for box in self.machines:
            said = re.findall(r"generation (\d+): TF_CONFIG=(\S+)", box.journal())
            # What the supervisor said is what the trainer got (the container's env file). A machine taken
            # between saying its last list and starting that trainer (a load-dependent instant) said one more.
            got = self.configs(box)
            told = [json.loads(conf) for _gen, conf in said]
            if box.number in self.taken and len(told) == len(got) + 1:
                told = told[:-1]
            assert told == got, box.number
            for gen, conf in said:
                conf = json.loads(conf)
                assert conf["cluster"]["worker"] == sealed[int(gen)], (gen, conf, sealed)
                started.setdefault(int(gen), []).append(conf["task"]["index"])
        assert started, "no trainer started"
        for gen, indexes in started.items():
            assert len(set(indexes)) == len(indexes), (gen, indexes)

    def live(self) -> list[Machine]:
        return [m for m in self.machines if m.procs]

    def wait_all(self, timeout: float) -> list[int]:
        """Waits (at most `timeout` seconds in all) for every live machine's supervisor to end."""
        deadline = time.monotonic() + timeout
        codes = []
        for box in self.live():
            codes.append(box.wait("trainer", timeout=max(1.0, deadline - time.monotonic())))
        return codes

    def close(self) -> None:
        for box in self.machines:
            box.close()

    # -- what the run folder says --

    def keys(self, sub: str = "") -> list[str]:
        out = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.run.bucket, Prefix=self.prefix + sub):
            out += [o["Key"][len(self.prefix):] for o in page.get("Contents", [])]
        return out

    def get(self, key: str) -> bytes | None:
        try:
            return self.s3.get_object(Bucket=self.run.bucket, Key=self.prefix + key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None

    def committed(self) -> list[int]:
        found = [k.split("/")[1] for k in self.keys(layout.CHECKPOINTS_PREFIX) if k.endswith("/" + layout.COMMITTED)]
        return sorted(int(name.removeprefix(layout.CHECKPOINT_DIR + "-")) for name in found)

    def sealed(self) -> dict[int, list[str]]:
        """generation -> the endpoints of its sealed worker list."""
        out = {}
        for key in self.keys(layout.RENDEZVOUS_PREFIX):
            m = re.fullmatch(rf"{layout.RENDEZVOUS_PREFIX}gen-(\d+)/sealed", key)
            if m:
                out[int(m.group(1))] = [w["endpoint"] for w in json.loads(self.get(key))["workers"]]
        return dict(sorted(out.items()))

    def events(self) -> list[dict]:
        raw = self.get(layout.EVENTS_KEY) or b""
        return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]

    def wait_generation(self, gen: int, timeout: float) -> list[str]:
        return wait_for(lambda: self.sealed().get(gen), timeout, f"generation {gen} to be sealed")

    def journals(self) -> str:
        return "\n".join(f"==== machine {m.number} ({m.endpoint})\n{m.journal()[-3000:]}" for m in self.machines)
