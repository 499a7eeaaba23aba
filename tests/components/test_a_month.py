"""A month in one test: deploy, train, train again, destroy, redeploy, train, and what is left.

On a fake cloud that keeps the real naming and retention rules (tests/fixtures/fake_cloud.py:
global bucket names, GCP custom role ids reserved 37 days after delete, versioned objects
billed until a lifecycle rule removes them), with the real program under the SDK's mocks
diffed by URN between `up`s as the engine does, and the real trainer writing to a
versioned bucket on moto_server:

  day 1   `up`; run exp-1, preempted twice (three machines, each resuming the last one's checkpoint)
  day 9   `up` with run exp-2: a new group; the run
  day 15  `destroy` (the bucket is kept)
  day 26  `up` again with `storage.adopt` (11 days after the destroy: past the 7 days in which
          a deleted custom role can be undeleted, inside the 37 in which its id is reserved);
          the group comes back for exp-2, whose machine finds the run complete and finishes
  day 26  `up` with run exp-3; the run
  day 30  the bill

It asserts that no create is refused, that no machine remains after each run, and that the
bytes each run leaves billed on day 30 are the bytes the storage plan says.

The machines are modelled, not booted (the boot sandbox, tests/userdata, boots them): a
machine of a group runs the trainer with the env file the `up` rendered into its user data,
exactly as the container gets it. A spot notice is SIGTERM to the trainer (exit 143) at the
machine's first checkpoint, where the trainer is held until it comes (tests/userdata/held_trainer.py),
after which the cloud replaces the machine and the group keeps its size. A machine first reads its
run folder and finishes at once when the run has ended, as supervise.sh does. Finishing is
the finish path's own call: `scale_to_zero` of the shipped lib.sh, run by bash with the
machine's env file, with `aws` / `gcloud` on PATH recording the command line; the fake
cloud then applies that resize to the group it holds, refusing a group it does not have as
the cloud would. So the group the stack created is the group the machine scales, by name
and region, and the cloud's count of machines says whether any remain. The rest of the
finish path (marker, logs, shutdown) is the boot sandbox's to test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from datetime import datetime
from pathlib import Path

import boto3
import pytest
import yaml

from components.settings import load_settings
from components.storage import storage_plan
from components.userdata import ENV_FILE
from runfolder import exits, layout
from tests.fixtures.fake_cloud import Engine, FakeCloud, Refused
from tests.trainer.helpers import Trainer, trainer_env
from tests.userdata.helpers import wait_for

pytestmark = pytest.mark.slow

CLOUDS = {
    "aws": {"cloud": "aws", "region": "eu-west-1", "compute": {"instanceTypes": ["g5.xlarge"]}},
    "gcp": {"cloud": "gcp", "region": "us-central1", "project": "my-proj-123",
            "compute": {"instanceTypes": ["g2-standard-8"]}},
}
# Small and quick, yet pruning: 10 scheduled checkpoints, 2 kept. A notice lands at the
# attempt's first checkpoint, where the trainer waits for it.
RUN = {"model": "mlp", "synthetic": True, "steps": 600, "batchSize": 32, "checkpointEverySteps": 60,
       "keepCheckpoints": 2}
END_DAY = 30


class Month:
    """One stack's month: its `up`s, its machines and what they leave."""

    def __init__(self, cloud: str, endpoint: str, tmp: Path) -> None:
        self.kind, self.endpoint, self.tmp = cloud, endpoint, tmp
        base = CLOUDS[cloud]
        self.cloud = FakeCloud(cloud, base["region"], endpoint, project=base.get("project", ""))
        # Bucket names are global on the emulator too: a stack name of its own per test.
        self.stack = f"month-{uuid.uuid4().hex[:6]}"
        self.engine = Engine(self.cloud, self.stack)
        self.ups: list[tuple[float, list[tuple[str, str]]]] = []
        self.finishes: list[str] = []
        self.attempts: dict[str, list[int]] = {}

    def up(self, run_id: str, *, adopt: bool = False):
        raw = {**CLOUDS[self.kind], "run": {**RUN, "id": run_id}, "storage": {"adopt": adopt}}
        try:
            result = self.engine.up(raw)
        except Refused as e:
            pytest.fail(f"day {self.cloud.day:g}, `up` of run {run_id}: the cloud refused a step:\n{e}")
        self.ups.append((self.cloud.day, result.steps))
        return result

    def destroy(self) -> list[tuple[str, str]]:
        return self.engine.destroy()

    # -- machines --

    def serve(self, result, *, preemptions: int = 0) -> None:
        """Machines of the group the `up` left, one after another, until the group is at zero."""
        group = result.outputs["groupName"]
        (user_data,) = result.user_data.values()
        env = machine_env(user_data)
        assert env["TRAINSTACK_GROUP"] == group
        run_id = env["TRAINSTACK_RUN_URI"].rsplit("/", 1)[1]
        codes = self.attempts.setdefault(run_id, [])
        for _boot in range(preemptions + 2):
            if not self.cloud.groups.get(group):
                return
            if self.ended(env):
                self.finish(env)  # supervise.sh: a run that has ended costs only the listing
                continue
            rc = self.train(env, preempt=len([c for c in codes if c == exits.PREEMPTED]) < preemptions)
            codes.append(rc)
            if rc == exits.PREEMPTED:
                self.cloud.preempt(group)
                continue
            assert rc == exits.OK, f"run {run_id}: the trainer exited {rc}"
            self.finish(env)
        raise AssertionError(f"group {group} still has {self.cloud.groups.get(group)} machine(s) after {codes}")

    def store_uri(self, env: dict) -> str:
        # The GCS emulator keeps no noncurrent versions: the GCP bucket's stand-in is the
        # versioned moto bucket of the same name (tests/fixtures/fake_cloud.py).
        return "s3://" + env["TRAINSTACK_RUN_URI"].split("://", 1)[1]

    def ended(self, env: dict) -> bool:
        bucket, _, prefix = self.store_uri(env).removeprefix("s3://").partition("/")
        listed = self.cloud.s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/", Delimiter="/")
        names = {o["Key"].rsplit("/", 1)[1] for o in listed.get("Contents", [])}
        return bool(names & set(layout.END_MARKERS))

    def train(self, env: dict, *, preempt: bool) -> int:
        uri = self.store_uri(env)
        extra = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "TRAINSTACK_RUN_URI": uri}
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "STORAGE_EMULATOR"))}
        # The machine's GPU check would refuse TensorFlow on this CPU (exit 78): dropped, as the
        # boot sandbox's fake docker drops it.
        machine = {k: v for k, v in env.items() if not k.startswith("__") and k != "TRAINSTACK_GPUS_PER_NODE"}
        if not preempt:
            t = Trainer(uri, env=trainer_env(base, **{**machine, **extra}))
        else:
            # The spot notice lands at this machine's first checkpoint of the run: the real trainer,
            # held there until the signal (tests/userdata/held_trainer.py), so the notice lands
            # mid-run however slowly a loaded machine passes it on (unheld, 480 steps of margin
            # were once not enough).
            state = self.tmp / f"held-{uuid.uuid4().hex[:8]}"
            state.mkdir()
            t = Trainer(uri, env=trainer_env(base, **{**machine, **extra}, FAKE_STATE=str(state)),
                        module="tests.userdata.held_trainer")
            held = state / "trainer-held"  # its step and a newline, once held

            def held_step() -> str:
                return held.read_text() if held.exists() else ""

            wait_for(lambda: held_step().endswith("\n") or t.proc.poll() is not None, 180,
                     "the trainer held at its first checkpoint")
            assert held_step(), f"the trainer exited {t.wait()} before its first checkpoint: {t.stderr[-3000:]}"
            run_id = env["TRAINSTACK_RUN_URI"].rsplit("/", 1)[1]
            # A resumed attempt tells its step before its first checkpoint.
            start = t.wait_event(layout.RESUMED, timeout=60)["step"] if self.attempts.get(run_id) else 0
            # Held at a checkpoint of its own, before the run's end: the notice lands mid-run.
            assert start < int(held_step()) < RUN["steps"], (start, held_step())
            t.signal(signal.SIGTERM)
        rc = t.wait(timeout=240)
        assert rc in (exits.OK, exits.PREEMPTED), t.stderr[-3000:]
        return rc

    def finish(self, env: dict) -> None:
        """The finish path's scale call, run from the shipped lib.sh; the cloud applies it."""
        root = self.tmp / f"machine-{len(self.finishes)}"
        (root / "etc/trainstack").mkdir(parents=True)
        (root / ENV_FILE.lstrip("/")).write_text(env["__file__"])
        lib = root / "opt/trainstack/bin/lib.sh"
        lib.parent.mkdir(parents=True)
        lib.write_text(env["__lib__"])
        fakebin = root / "fakebin"
        fakebin.mkdir()
        calls = root / "calls.tsv"
        for tool in ("aws", "gcloud"):
            (fakebin / tool).write_text('#!/bin/sh\n{ printf %s "${0##*/}"; for a in "$@"; do printf "\\t%s" "$a"; done; '
                                        'echo; } >>"$CALLS"\n')
            (fakebin / tool).chmod(0o755)
        script = f'set -euo pipefail\n. "{lib}"\nload_env\nscale_to_zero\n'
        proc = subprocess.run(["bash", "-c", script], env={"PATH": f"{fakebin}:/usr/bin:/bin", "TRAINSTACK_ROOT": str(root),
                                                           "CALLS": str(calls)}, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        (line,) = calls.read_text().splitlines()
        tool, *argv = line.split("\t")
        name, size, region = scale_call(tool, argv)
        assert region == self.cloud.region, f"{tool} called for region {region}, the stack is in {self.cloud.region}"
        try:
            self.cloud.resize(name, size)
        except Refused as e:
            pytest.fail(f"day {self.cloud.day:g}: the finish path's scale call was refused:\n{e}")
        self.finishes.append(name)

    # -- the bill --

    def bucket(self) -> str:
        (name,) = self.cloud.buckets
        return name

    def events(self, run_id: str) -> list[dict]:
        """The run's events.jsonl as stored."""
        body = self.cloud.s3.get_object(Bucket=self.bucket(), Key=layout.run_prefix(run_id) + layout.EVENTS_KEY)["Body"]
        return [json.loads(line) for line in body.read().decode().splitlines() if line.strip()]


def machine_env(user_data: str) -> dict:
    """The env file cloud-init writes (KEY='value' lines), parsed; `__file__` and `__lib__` hold
    the file's text and the shipped lib.sh."""
    doc = yaml.safe_load(user_data)
    files = {f["path"]: f["content"] for f in doc["write_files"]}
    text = files[ENV_FILE]
    env = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        env[key] = value.removeprefix("'").removesuffix("'")
    env["__file__"] = text
    env["__lib__"] = files["/opt/trainstack/bin/lib.sh"]
    return env


def scale_call(tool: str, argv: list[str]) -> tuple[str, int, str]:
    """(group, size, region) of the scale call a machine made with the cloud's CLI."""
    if tool == "aws":
        assert argv[:2] == ["autoscaling", "update-auto-scaling-group"], argv
        opts = dict(zip(argv[2::2], argv[3::2], strict=True))
        assert opts["--min-size"] == opts["--max-size"] == opts["--desired-capacity"], opts
        return opts["--auto-scaling-group-name"], int(opts["--desired-capacity"]), opts["--region"]
    assert argv[:4] == ["compute", "instance-groups", "managed", "resize"], argv
    name, rest = argv[4], [a for a in argv[5:] if a != "--quiet"]
    opts = dict(zip(rest[::2], rest[1::2], strict=True))
    return name, int(opts["--size"]), opts["--region"]


def bill(month: Month, run_id: str, day: float) -> dict[str, tuple[int, int, int]]:
    """A run's bytes on `day`: {part: (billed by the fake cloud, planned, slack)}.

    Checkpoints are planned by the stack's storage plan (`components.storage.storage_plan`, the
    plan `ops synth` prints) from what the run did: the checkpoints it wrote, their size, the day
    of the last one. The plan takes one size for every checkpoint; the kept ones differ by a
    digit or two of their commit marker, so they may differ from it by that spread (the slack).
    The rest (model, events, progress, markers) is planned as the plan states it: live, and
    replaced or deleted versions kept `storage.noncurrentDays` days.
    """
    fc, bucket, prefix = month.cloud, month.bucket(), layout.run_prefix(run_id)
    settings = load_settings({**CLOUDS[month.kind], "run": {**RUN, "id": run_id}}, stack=month.stack)
    versions = fc.versions(bucket, prefix)
    ckpts = [v for v in versions if layout.is_checkpoint_key(v.key[len(prefix):])]
    rest = [v for v in versions if v not in ckpts]
    written = [e for e in month.events(run_id) if e["event"] == layout.CHECKPOINT]
    folders: dict[str, int] = {}
    for v in ckpts:
        if v.noncurrent_since is None:
            folder = v.key.rsplit("/", 1)[0]
            folders[folder] = folders.get(folder, 0) + v.size
    # One checkpoint's size (all its files, the commit marker too): the newest kept one's.
    newest = max(folders, key=lambda f: int(f.rsplit("-", 1)[1]))
    plan = storage_plan(settings, checkpoint_bytes=folders[newest])
    last = fc.sim_day(datetime.fromisoformat(written[-1]["time"]).timestamp())
    left = {"written": len(written), "days_after": day - last}
    pruned = plan.noncurrent_bytes_left(**left)
    kept = plan.checkpoint_bytes_left(**left) - pruned
    spread = len(folders) * (max(folders.values()) - min(folders.values()))
    planned_rest = sum(v.size for v in rest if v.noncurrent_since is None or day - v.noncurrent_since < plan.noncurrent_days)
    return {"kept checkpoints": (fc.billed_bytes(bucket, [v for v in ckpts if v.noncurrent_since is None], day), kept, spread),
            "pruned checkpoints": (fc.billed_bytes(bucket, [v for v in ckpts if v.noncurrent_since is not None], day),
                                   pruned, 0),
            "the rest": (fc.billed_bytes(bucket, rest, day), planned_rest, 0)}


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_a_month_of_runs_redeploys_and_storage(cloud, moto_server, tmp_path):
    month = Month(cloud, moto_server, tmp_path)
    fc = month.cloud

    # 1-2. Day 1: the first `up`, and a run preempted twice.
    fc.advance_to(1)
    first = month.up("exp-1")
    assert sum(op == "create" for op, _ in first.steps) >= 10
    assert fc.machines() == 1
    month.serve(first, preemptions=2)
    assert month.attempts["exp-1"] == [143, 143, 0]
    assert fc.replaced_machines == {first.outputs["groupName"]: 2}
    assert fc.machines() == 0

    # 3. Day 9: a second run: a new group at full size, the old one (at zero) deleted.
    fc.advance_to(9)
    second = month.up("exp-2")
    assert second.outputs["groupName"] != first.outputs["groupName"]
    assert ("replace", next(u for op, u in second.steps if u.endswith("-asg") or u.endswith("-mig"))) in second.steps
    assert fc.machines() == 1
    month.serve(second)
    assert month.attempts["exp-2"] == [0] and fc.machines() == 0

    # 4. Day 15: destroy, keeping the bucket; day 26: `up` again, adopting it.
    fc.advance_to(15)
    gone = month.destroy()
    assert [op for op, u in gone if u.endswith(("-s3", "-gcs"))] == ["forget"]
    assert fc.groups == {} and len(fc.buckets) == 1
    fc.advance_to(26)
    again = month.up("exp-2", adopt=True)
    assert [op for op, u in again.steps if u.endswith(("-s3", "-gcs"))] == ["import"]
    month.serve(again)  # the machine finds exp-2 complete and finishes at once
    assert month.attempts["exp-2"] == [0] and fc.machines() == 0

    # 5. Day 26: a third run.
    third = month.up("exp-3")
    assert fc.machines() == 1
    month.serve(third)
    assert month.attempts["exp-3"] == [0] and fc.machines() == 0
    assert month.finishes == [first.outputs["groupName"], second.outputs["groupName"],
                              second.outputs["groupName"], third.outputs["groupName"]]

    # No create refused (each `up` above fails the test with the cloud's text if one is): count them.
    assert [day for day, _ in month.ups] == [1, 9, 26, 26]

    # The bill on day 30: per run, the bytes billed are the bytes planned.
    fc.advance_to(END_DAY)
    runs = ("exp-1", "exp-2", "exp-3")
    pruned = [v for run in runs for v in fc.versions(month.bucket(), layout.run_prefix(run))
              if v.noncurrent_since is not None and layout.CHECKPOINTS_PREFIX in v.key]
    assert len(pruned) >= 3 * 6, "each run pruned checkpoints (else the bill proves nothing)"
    bills = {run: bill(month, run, END_DAY) for run in runs}
    assert all(parts["kept checkpoints"][1] > 0 and parts["the rest"][1] > 0 for parts in bills.values())
    # The kept checkpoints differ by their commit marker and the metrics in their state (tens of
    # bytes each), and a checkpoint written from a background snapshot lacks the variables' names,
    # which TF's object graph records for live variables only (448 bytes for this model; the
    # stored values and their keys are the same): under ten thousand bytes of slack on a bill of
    # megabytes.
    assert all(parts["kept checkpoints"][2] < 10_000 for parts in bills.values())
    over = {f"{run} {part}": f"billed {billed:,} B, planned {planned:,} B (± {slack} B)"
            for run, parts in bills.items() for part, (billed, planned, slack) in parts.items()
            if abs(billed - planned) > slack}
    assert not over, f"day {END_DAY}: {over}"
    # And the machines' account: nothing left running anywhere.
    assert fc.machines() == 0
    assert boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing").head_bucket(Bucket=month.bucket())
