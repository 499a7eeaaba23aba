"""What a real first boot meets and the mocks do not: an image that already owns the
local disks, apt locked by the image's own updates, a flaky mirror, a trainer that says
this machine can never run the run, and a run cancelled on request.

Bootstrap-only scenarios run `bootstrap.sh` alone in the sandbox (seconds); the others
boot the machine with a stand-in trainer from a code archive (`_code_archive`).
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from devtools.metadata import INSTANCE_ID
from runfolder import layout
from tests.userdata.cluster import upload_code
from tests.userdata.helpers import group_size, machine_events, s3_keys

NVME = "dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_AWS0123"


def _bootstrap(box, timeout: float = 120) -> subprocess.CompletedProcess:
    (box.root / "run").mkdir(exist_ok=True)
    box.install_boot_scripts()  # as the supervisor does before each bootstrap
    return subprocess.run([str(box.root / "opt/trainstack/bin/bootstrap.sh")], env=box.env, capture_output=True,
                          text=True, timeout=timeout)


def _paths(box) -> dict[str, str]:
    text = (box.root / "var/lib/trainstack/paths").read_text()
    return dict(line.split("=", 1) for line in text.splitlines())


def _mark(box, kind: str, path) -> None:
    """Fake machine state: `mounts` (a mounted path), `signatures` (blkid's TYPE of a device)."""
    (box.state / kind).mkdir(parents=True, exist_ok=True)
    (box.state / kind / str(path).replace("/", "_")).write_text("")


# -- the data disk -----------------------------------------------------------------------


def test_deep_learning_ami_nvme_volume_is_used_and_its_member_disks_left_alone(machines, s3_run):
    # The DLAMI has already combined the instance-store disks into one volume at
    # /opt/dlami/nvme: the first disk is an LVM member that cannot be mounted by itself.
    box = machines(s3_run, "trainstack-x", "", nvme=True)
    dlami = box.root / "opt/dlami/nvme"
    dlami.mkdir(parents=True)
    _mark(box, "mounts", dlami)
    (box.state / "signatures").mkdir(parents=True)
    (box.state / "signatures" / str(box.root / NVME).replace("/", "_")).write_text("LVM2_member")
    proc = _bootstrap(box)
    assert proc.returncode == 0, proc.stderr
    assert _paths(box)["DATA_DIR"] == str(dlami / "trainstack") and (dlami / "trainstack").is_dir()
    assert box.argvs("mkfs.ext4") == [] and box.argvs("mount") == []
    assert "the image's instance-store volume" in proc.stderr


@pytest.mark.parametrize(
    ("case", "calls"),
    [
        ("a RAID member", {"mkfs.ext4": 0, "mount": 0}),  # someone else's disk: not touched
        ("already mounted", {"mkfs.ext4": 0, "mount": 0}),
        ("mkfs fails", {"mkfs.ext4": 1, "mount": 0}),
    ],
)
def test_a_data_disk_problem_falls_back_to_the_root_disk(machines, s3_run, case, calls):
    box = machines(s3_run, "trainstack-x", "", nvme=True)
    device = str(box.root / NVME)
    if case == "a RAID member":
        (box.state / "signatures").mkdir(parents=True)
        (box.state / "signatures" / device.replace("/", "_")).write_text("linux_raid_member")
    elif case == "already mounted":
        _mark(box, "mounted-sources", device)
    else:
        box.env["FAKE_MKFS_FAILS"] = "1"
    proc = _bootstrap(box)
    assert proc.returncode == 0, proc.stderr
    assert _paths(box)["DATA_DIR"] == str(box.root / "var/lib/trainstack/data")
    assert {cmd: len(box.argvs(cmd)) for cmd in calls} == calls
    assert "data staging on the root disk" in proc.stderr
    # Bootstrap went on: the image pulled, then checked by its digest (the last docker call).
    docker = box.argvs("docker")
    assert [a[0] for a in docker[-2:]] == ["pull", "image"] and "--format" in docker[-1], docker


def test_a_blank_local_disk_is_formatted_and_mounted(machines, s3_run):
    box = machines(s3_run, "trainstack-x", "", nvme=True)
    proc = _bootstrap(box)
    assert proc.returncode == 0, proc.stderr
    device, mnt = str(box.root / NVME), str(box.root / "mnt/trainstack-data")
    assert box.argvs("mkfs.ext4") == [["-F", "-q", "-L", "trainstack-data", device]]
    assert box.argvs("mount") == [["-o", "noatime,discard", device, mnt]]
    assert _paths(box)["DATA_DIR"] == mnt


# -- apt on a first boot -----------------------------------------------------------------


def test_first_boot_waits_for_the_dpkg_lock_held_by_the_images_updates(machines, s3_run):
    # GCP's and Ubuntu's images run apt-daily / unattended-upgrades at first boot.
    box = machines(s3_run, "trainstack-x", "", toolkit=False)
    (box.state / "dpkg-lock").write_text(str(time.time() + 3))
    start = time.monotonic()
    proc = _bootstrap(box)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start >= 2.5  # it waited for the lock rather than failing
    apt = box.argvs("apt-get")
    assert len(apt) == 2 and all(a[:2] == ["-o", "DPkg::Lock::Timeout=600"] for a in apt), apt
    assert "install" in apt[1] and "nvidia-container-toolkit=1.17.8-1" in apt[1]


@pytest.mark.slow
def test_a_flaky_mirror_retries_bootstrap_instead_of_failing_the_run(sandbox_factory, s3_run, group):
    # Four failed apt calls: the first bootstrap gives up after three, the second goes on.
    # The trainer then refuses a batch size of 0: enough to see that training was reached.
    box = sandbox_factory(toolkit=False, env_overrides={"TRAINSTACK_BATCH_SIZE": "0", "TRAINSTACK_MAX_FAILURES": "1"})
    (box.state / "apt-network-failures").write_text("4")
    assert box.boot(watcher=False).wait(timeout=180) == 0, box.journal()
    assert "bootstrap failed for a passing reason (1 so far)" in box.journal()
    marker = json.loads(s3_keys(s3_run)[layout.FAILED])
    assert marker["reason"] == "the trainer failed 1 times in a row (last exit 2)"
    runs = [a for a in box.argvs("docker") if a[0] == "run" and a[-3:] == ["python", "-m", "trainer"]]
    assert len(runs) == 1


@pytest.mark.slow
def test_bootstrap_failing_for_a_passing_reason_is_bounded_by_the_deadline(sandbox_factory, s3_run, group):
    box = sandbox_factory(toolkit=False, env_overrides={"TRAINSTACK_MAX_RUNTIME_S": "4"})
    box.env["TRAINSTACK_BOOTSTRAP_BACKOFF_S"] = "1"
    (box.state / "apt-network-failures").write_text("100000")
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    objects = s3_keys(s3_run)
    assert layout.FAILED not in objects
    marker = json.loads(objects[layout.TIMED_OUT])
    assert marker["reason"].startswith("the run's deadline passed while setting up the machine")
    assert group_size(s3_run, group) == (0, 0, 0) and box.argvs("shutdown") == [["-h", "now"]]
    assert [a for a in box.argvs("docker") if a[0] == "run"] == []


@pytest.mark.slow
def test_bootstrap_failing_for_a_passing_reason_ends_after_its_own_bound_long_before_the_deadline(
        sandbox_factory, s3_run, group):
    # A paid machine that is not training may not retry until a 24 h deadline: the setup
    # wait has its own bound, and the run ends FAILED with why.
    box = sandbox_factory(toolkit=False, env_overrides={"TRAINSTACK_MAX_RUNTIME_S": "86400"})
    box.env["TRAINSTACK_BOOTSTRAP_BACKOFF_S"] = "1"
    box.env["TRAINSTACK_BOOTSTRAP_WAIT_S"] = "4"
    (box.state / "apt-network-failures").write_text("100000")
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    objects = s3_keys(s3_run)
    assert layout.TIMED_OUT not in objects
    marker = json.loads(objects[layout.FAILED])
    assert marker["reason"].startswith("could not set up the machine in 4s (bootstrap failed ")
    assert group_size(s3_run, group) == (0, 0, 0) and box.argvs("shutdown") == [["-h", "now"]]
    assert [a for a in box.argvs("docker") if a[0] == "run"] == []


# -- what the trainer says ---------------------------------------------------------------

FAKE_TRAINER = '''\
"""A stand-in trainer: does what FAKE_TRAINER says, as the real one would end."""
import json, os, sys
import boto3

bucket, _, prefix = os.environ["TRAINSTACK_RUN_URI"].removeprefix("s3://").partition("/")
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
action = os.environ["FAKE_TRAINER"]
if action == "unusable":
    ev = {"event": "failed", "time": "2026-01-01T00:00:00.000+00:00", "attempt": 1,
          "reason": "asked for 1 GPU per node, TensorFlow sees 0 (no libcudnn.so.9)"}
    s3.put_object(Bucket=bucket, Key=prefix + "/events.jsonl", Body=(json.dumps(ev) + "\\n").encode())
    sys.exit(78)
if action == "cancel":
    doc = {"step": 7, "attempts": 1, "reason": "asked to stop"}
    s3.put_object(Bucket=bucket, Key=prefix + "/CANCELLED", Body=json.dumps(doc).encode())
    sys.exit(0)
if action == "exit0":  # a worker whose part is done; the chief writes the marker
    sys.exit(0)
if action == "progress-then-fail":  # the first three attempts each commit a newer checkpoint
    done = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/checkpoints/").get("KeyCount", 0)
    if done < 3:
        s3.put_object(Bucket=bucket, Key=f"{prefix}/checkpoints/ckpt-{(done + 1) * 10}/COMMITTED", Body=b"{}")
    sys.exit(1)
sys.exit(2)
'''


@pytest.fixture
def fake_trainer_uri(s3_run) -> str:
    """A code archive whose `python -m trainer` is FAKE_TRAINER, uploaded as the stack uploads one."""
    return upload_code(s3_run, {"trainer/__init__.py": "", "trainer/__main__.py": FAKE_TRAINER})


@pytest.mark.slow
def test_a_machine_that_can_never_run_the_run_fails_at_once_with_the_reason(
        sandbox_factory, s3_run, group, fake_trainer_uri):
    box = sandbox_factory(code_uri=fake_trainer_uri, env_overrides={"TRAINSTACK_MAX_FAILURES": "3"})
    box.env["FAKE_TRAINER"] = "unusable"
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    runs = [a for a in box.argvs("docker") if a[0] == "run" and a[-3:] == ["python", "-m", "trainer"]]
    assert len(runs) == 1  # no crash-loop retries
    marker = json.loads(s3_keys(s3_run)[layout.FAILED])
    assert marker[layout.MARKER_REASON] == ("the trainer cannot run on this machine (exit 78): "
                                            "asked for 1 GPU per node, TensorFlow sees 0 (no libcudnn.so.9)")
    assert group_size(s3_run, group) == (0, 0, 0) and box.argvs("shutdown") == [["-h", "now"]]


@pytest.mark.slow
def test_a_cancelled_run_finishes_like_a_complete_one(sandbox_factory, s3_run, group, fake_trainer_uri):
    box = sandbox_factory(code_uri=fake_trainer_uri)
    box.env["FAKE_TRAINER"] = "cancel"
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    objects = s3_keys(s3_run)
    assert layout.CANCELLED in objects and not {layout.FAILED, layout.TIMED_OUT, layout.COMPLETE} & set(objects)
    assert group_size(s3_run, group) == (0, 0, 0) and box.argvs("shutdown") == [["-h", "now"]]
    runs = [a for a in box.argvs("docker") if a[0] == "run" and a[-3:] == ["python", "-m", "trainer"]]
    assert len(runs) == 1
    finish = machine_events(s3_run)[-1]
    assert (finish["event"], finish["outcome"], finish["instance"]) == ("finish", "CANCELLED", INSTANCE_ID)


@pytest.mark.slow
def test_failures_count_in_a_row_only_without_progress(sandbox_factory, s3_run, group, fake_trainer_uri):
    # Three attempts each commit a newer checkpoint and then fail: each starts the count
    # again. The fourth makes no progress: with 2 failures allowed in a row, it ends the run.
    # (Without the reset, the second attempt would have ended it.)
    box = sandbox_factory(code_uri=fake_trainer_uri, env_overrides={"TRAINSTACK_MAX_FAILURES": "2"})
    box.env["FAKE_TRAINER"] = "progress-then-fail"
    assert box.boot(watcher=False).wait(timeout=180) == 0, box.journal()
    runs = [a for a in box.argvs("docker") if a[0] == "run" and a[-3:] == ["python", "-m", "trainer"]]
    assert len(runs) == 4
    assert box.journal().count("before it failed: counting from 1") == 3
    marker = json.loads(s3_keys(s3_run)[layout.FAILED])
    assert marker[layout.MARKER_REASON] == "the trainer failed 2 times in a row (last exit 1)"



@pytest.mark.slow
def test_a_notice_the_cloud_does_not_act_on_waits_its_bound_then_training_resumes(
        sandbox_factory, s3_run, group, fake_trainer_uri):
    # GCE live maintenance, or a notice whose machine the cloud keeps: the stopped machine
    # waits for the cloud a bounded time, then trains again instead of idling, paid.
    box = sandbox_factory(code_uri=fake_trainer_uri)
    box.env.update(FAKE_TRAINER="cancel", TRAINSTACK_NOTICE_WAIT_S="2")
    (box.root / "run/trainstack").mkdir(parents=True, exist_ok=True)
    (box.root / "run/trainstack/notice-pending").write_text("")
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    journal = box.journal()
    waited, resumed = journal.find("waiting for the cloud to take the machine back"), journal.find(
        "still here 2s after the notice: resuming training")
    assert 0 <= waited < resumed, journal
    assert layout.CANCELLED in s3_keys(s3_run)  # the trainer ran after the wait and ended the run
    assert len([a for a in box.argvs("docker") if a[0] == "run" and a[-3:] == ["python", "-m", "trainer"]]) == 1
    assert group_size(s3_run, group) == (0, 0, 0)
