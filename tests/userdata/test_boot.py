"""The machine's life, run for real: the rendered boot scripts in a sandbox (see conftest).

Each scenario boots the sandbox machine, lets the real scripts run against moto_server
and the fake metadata service with the real trainer inside the fake `docker run`, and
asserts the commands called, their order, the group's size and the bucket's contents.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import boto3
import pytest

from devtools.metadata import GCE_NAME, INSTANCE_ID
from devtools.sandbox import SANDBOX_DIGEST, settings_for
from runfolder import layout
from tests.trainer.helpers import REPO
from tests.userdata.helpers import events, group_size, machine_events, s3_keys, wait_for


def _order(box, *steps: tuple[str, ...]) -> list[float]:
    times = [box.first(cmd, *prefix) for cmd, *prefix in steps]
    assert times == sorted(times), f"out of order: {list(zip(steps, times, strict=True))}"
    return times


@pytest.mark.slow
def test_clean_run_completes_scales_to_zero_and_shuts_down(sandbox_factory, s3_run, group, metadata,
                                                          record_property):
    box = sandbox_factory()
    start = time.time()
    assert box.boot().wait(timeout=240) == 0, box.journal()
    # The boot scripts' own work (fake pull and installs are instant here): from power-on to
    # the trainer's `docker run`, and from the trainer's exit to `shutdown`. Reported in
    # docs/boot.md, not asserted: the figure depends on the machine's load.
    calls = box.calls()
    trainer_start = next(c["t"] for c in calls if c["cmd"] == "docker" and c["argv"][0] == "run"
                         and "trainer" in c["argv"])
    after = next(c["t"] for c in calls if c["t"] > trainer_start and c["cmd"] == "aws")
    boot_s, finish_s = trainer_start - start, box.first("shutdown") - after
    record_property("boot_to_trainer_s", round(boot_s, 2))
    record_property("trainer_exit_to_shutdown_s", round(finish_s, 2))
    print(f"boot to docker run: {boot_s:.2f}s; trainer exit to shutdown: {finish_s:.2f}s; {len(calls)} calls")
    assert boot_s > 0 and finish_s > 0
    objects = s3_keys(s3_run)
    assert "COMPLETE" in objects and "FAILED" not in objects, sorted(objects)
    assert int(objects["deadline"]) > start + 3000  # maxRuntimeHours: 1, counted from this boot
    assert f"logs/{INSTANCE_ID}/trainstack.log" in objects
    assert b"finishing: COMPLETE" in objects[f"logs/{INSTANCE_ID}/trainstack.log"]
    assert group_size(s3_run, group) == (0, 0, 0)
    # The toolkit was there: nothing installed, the docker runtime configured once.
    assert box.argvs("apt-get") == []
    assert box.argvs("nvidia-ctk")[1][:2] == ["runtime", "configure"]
    _order(box, ("nvidia-smi",), ("docker", "pull"), ("docker", "run"),
           ("aws", "autoscaling", "update-auto-scaling-group"), ("shutdown", "-h", "now"))
    runs = [a for a in box.argvs("docker") if a[0] == "run" and "trainer" in a]
    assert len(runs) == 1
    run = runs[0]
    for flag in (["--gpus", "all"], ["--network", "host"], ["--ipc", "host"], ["--stop-timeout", "100"]):
        assert any(run[i : i + 2] == flag for i in range(len(run))), (flag, run)
    # The container runs the image by the digest it was pulled by, never by a tag.
    assert run[-4:] == [f"tensorflow/tensorflow@{SANDBOX_DIGEST}", "python", "-m", "trainer"]
    assert [a for a in box.argvs("docker") if a[0] == "pull"] == [["pull", "-q", f"tensorflow/tensorflow@{SANDBOX_DIGEST}"]]
    # The machine used IMDSv2: a token first, every metadata read with it.
    aws_reads = [r for r in metadata.requests if r[1].startswith("/latest/")]
    assert aws_reads and aws_reads[0][:2] == ("PUT", "/latest/api/token")
    assert all(ok for _m, _p, ok in aws_reads)
    assert [e["event"] for e in events(s3_run)][-1] in ("finished", "complete")
    finish = machine_events(s3_run)[-1]
    assert (finish["event"], finish["outcome"], finish["instance"]) == ("finish", "COMPLETE", INSTANCE_ID)


def _committed_steps(run) -> list[int]:
    return sorted(int(k.split("/")[1].removeprefix("ckpt-")) for k in s3_keys(run)
                  if k.startswith("checkpoints/") and k.endswith("/COMMITTED"))


@pytest.mark.slow
def test_spot_notice_stops_with_grace_then_second_boot_resumes_installing_nothing_twice(
        sandbox_factory, s3_run, group, metadata):
    # The notice lands mid-run at a known step, however slowly this machine trains: the first
    # boot's trainer holds after its first checkpoint (step 20) until the stop signal arrives
    # (tests/userdata/held_trainer.py), so 100 steps leave 60 to train after the stop.
    settings = settings_for(steps=100, checkpointEverySteps=20)
    box = sandbox_factory(settings=settings, toolkit=False, nvme=True)
    box.env.update(FAKE_TRAINER_MODULE="tests.userdata.held_trainer", FAKE_TRAINER_PATH=str(REPO))
    supervisor = box.boot()
    wait_for(lambda: (box.state / "trainer-held").exists(), 180, "the trainer held after its first checkpoint")
    assert (box.state / "trainer-held").read_text() == "20\n"
    wait_for(lambda: _committed_steps(s3_run), 60, "a committed checkpoint")
    metadata.notice_aws()
    wait_for(lambda: "spot_notice" in [e["event"] for e in machine_events(s3_run)], 60, "the spot_notice event")
    wait_for(lambda: "exited with 143" in box.journal(), 90, "the trainer's exit 143")
    # The supervisor says so just before its wait for the cloud (600 s here): from that line on it
    # must do nothing more, so what it did by then is all it does.
    wait_for(lambda: "waiting for the cloud to take the machine back" in box.journal(), 60,
             "the supervisor's wait for the cloud")
    assert supervisor.poll() is None
    assert box.argvs("docker").count(["stop", "--time", "100", "trainstack-trainer"]) == 1
    assert box.calls("docker-sigkill") == []
    assert box.argvs("shutdown") == []
    assert [a for a in box.argvs("aws") if a[0] == "autoscaling"] == []
    assert group_size(s3_run, group) == (1, 1, 1)
    names = [e["event"] for e in events(s3_run)]
    assert "preempted" in names and "spot_notice" not in names  # the trainer's file is the trainer's alone
    notice = next(e for e in machine_events(s3_run) if e["event"] == "spot_notice")
    assert notice["grace_s"] == 100 and notice["instance"] == INSTANCE_ID and notice["cloud"] == "aws"
    stopped_at = _committed_steps(s3_run)[-1]
    assert 20 < stopped_at < 100  # the stop's own checkpoint, after the held step and before the end
    # The toolkit was missing: installed from NVIDIA's repository at the pinned version.
    installs = [a for a in box.argvs("apt-get") if "install" in a]
    assert len(installs) == 1 and "nvidia-container-toolkit=1.17.8-1" in installs[0]
    sources = (box.root / "etc/apt/sources.list.d/nvidia-container-toolkit.list").read_text()
    assert "[signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg]" in sources
    # Local NVMe: formatted once, mounted, and the container's /data.
    device = str(box.root / "dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_AWS0123")
    mnt = str(box.root / "mnt/trainstack-data")
    assert box.argvs("mkfs.ext4") == [["-F", "-q", "-L", "trainstack-data", device]]
    assert box.argvs("mount") == [["-o", "noatime,discard", device, mnt]]
    trainer_run = next(a for a in box.argvs("docker") if a[0] == "run" and "trainer" in a)
    assert f"{mnt}:/data" in trainer_run
    first_boot_calls = len(box.calls())

    box.power_off()
    metadata.instance_action = None  # a new boot: no notice
    box.env.pop("FAKE_TRAINER_MODULE")  # the plain trainer, not held
    assert box.boot().wait(timeout=240) == 0, box.journal()
    second = box.calls()[first_boot_calls:]
    # Nothing installed, fetched or pulled twice on the same disk.
    assert [c for c in second if c["cmd"] == "apt-get"] == []
    assert [c for c in second if c["cmd"] == "nvidia-ctk" and c["argv"][:1] == ["runtime"]] == []
    assert [c for c in second if c["cmd"] == "docker" and c["argv"][:1] in (["pull"], ["login"])] == []
    assert [c for c in second if c["cmd"] == "docker" and c["argv"][0] == "run" and "sh" in c["argv"]] == []
    assert [c for c in second if c["cmd"] == "aws" and "code/" in " ".join(c["argv"])] == []
    assert [c for c in second if c["cmd"] == "mkfs.ext4"] == []  # the disk keeps its file system
    assert [c["argv"][-1] for c in second if c["cmd"] == "mount"] == [mnt]  # mounted again
    names = [e["event"] for e in events(s3_run)]
    assert "resumed" in names[names.index("preempted"):]
    resumed = next(e for e in reversed(events(s3_run)) if e["event"] == "resumed")
    assert resumed["step"] >= stopped_at
    assert "COMPLETE" in s3_keys(s3_run)
    assert group_size(s3_run, group) == (0, 0, 0)
    assert box.argvs("shutdown") == [["-h", "now"]]


@pytest.mark.slow
def test_deadline_passed_times_out_without_starting_anything(sandbox_factory, s3_run, group):
    box = sandbox_factory()
    s3 = boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"])
    key = s3_run.uri.removeprefix(f"s3://{s3_run.bucket}/")
    s3.put_object(Bucket=s3_run.bucket, Key=f"{key}/deadline", Body=f"{int(time.time()) - 5}\n".encode())
    assert box.boot(watcher=False).wait(timeout=60) == 0, box.journal()
    objects = s3_keys(s3_run)
    marker = json.loads(objects["TIMED_OUT"])
    assert marker["outcome"] == "TIMED_OUT" and "deadline" in marker["reason"] and marker["instance"] == INSTANCE_ID
    # The marker's fields are the layout's: `step` (none trained here), `attempts`, `reason`.
    assert marker[layout.MARKER_STEP] == -1 and "final_step" not in marker and layout.MARKER_ATTEMPTS in marker
    assert f"logs/{INSTANCE_ID}/trainstack.log" in objects
    assert group_size(s3_run, group) == (0, 0, 0)
    assert box.argvs("nvidia-smi") == [] and box.argvs("docker") == []
    _order(box, ("aws", "s3", "cp", "-"), ("aws", "autoscaling"), ("shutdown", "-h", "now"))


@pytest.mark.slow
@pytest.mark.parametrize("marker", [layout.COMPLETE, layout.CANCELLED])
def test_ended_run_finishes_at_boot(sandbox_factory, s3_run, group, marker):
    # CANCELLED (the trainer stopped on request) ends a run as COMPLETE does: a machine
    # the group starts again only scales it to zero and shuts down.
    box = sandbox_factory()
    s3 = boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"])
    key = s3_run.uri.removeprefix(f"s3://{s3_run.bucket}/")
    s3.put_object(Bucket=s3_run.bucket, Key=f"{key}/{marker}", Body=b'{"step": 40}')
    assert box.boot(watcher=False).wait(timeout=60) == 0, box.journal()
    assert sorted(k for k in s3_keys(s3_run) if not k.startswith(("logs/", "machine-events/"))) == [marker]
    assert [(e["event"], e["outcome"]) for e in machine_events(s3_run)] == [("finish", marker)]
    assert group_size(s3_run, group) == (0, 0, 0)
    assert box.argvs("docker") == [] and box.argvs("shutdown") == [["-h", "now"]]


@pytest.mark.slow
def test_crash_loop_fails_after_n_in_a_row_with_logs(sandbox_factory, s3_run, group):
    # A batch size of 0 is refused by the real trainer at start-up (exit 2), every time.
    box = sandbox_factory(env_overrides={"TRAINSTACK_BATCH_SIZE": "0", "TRAINSTACK_MAX_FAILURES": "3"})
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    runs = [a for a in box.argvs("docker") if a[0] == "run" and a[-3:] == ["python", "-m", "trainer"]]
    assert len(runs) == 3
    objects = s3_keys(s3_run)
    marker = json.loads(objects["FAILED"])
    assert marker["attempts"] == 3 and "3 times in a row" in marker["reason"] and "exit 2" in marker["reason"]
    log = objects[f"logs/{INSTANCE_ID}/trainstack.log"].decode()
    assert log.count("trainer exited with 2") == 3
    assert f"logs/{INSTANCE_ID}/journal.log" in objects
    assert group_size(s3_run, group) == (0, 0, 0)
    _order(box, ("aws", "s3", "cp", "-"), ("aws", "s3", "cp", "--recursive"), ("aws", "autoscaling"),
           ("shutdown", "-h", "now"))


@pytest.mark.slow
def test_no_gpu_fails_fast_with_reason(sandbox_factory, s3_run, group):
    box = sandbox_factory(gpu=False)
    start = time.monotonic()
    assert box.boot(watcher=False).wait(timeout=60) == 0, box.journal()
    elapsed = time.monotonic() - start
    marker = json.loads(s3_keys(s3_run)["FAILED"])
    assert "no NVIDIA GPU" in marker["reason"], marker
    assert box.argvs("docker") == [] and box.argvs("apt-get") == []
    assert group_size(s3_run, group) == (0, 0, 0)
    assert box.argvs("shutdown") == [["-h", "now"]]
    assert elapsed < 30, elapsed


@pytest.mark.slow
def test_a_run_whose_lease_another_machine_holds_is_tried_again_not_failed(sandbox_factory, s3_run, group):
    """Another machine's trainer holds the run's lease: this machine's trainer exits 77 without
    writing to the run, the supervisor tries again (no failure counted), and once the lease is
    released the run trains here and completes."""
    s3 = boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"])
    key = s3_run.uri.removeprefix(f"s3://{s3_run.bucket}/") + "/" + layout.LEASE_KEY
    held = {"format": 1, "holder": "i-0another/7", "token": "t", "epoch": 3, "ttl_s": 60,
            "expires": time.time() + 3600, "released": False, "nonce": "n"}
    s3.put_object(Bucket=s3_run.bucket, Key=key, Body=json.dumps(held).encode())
    box = sandbox_factory(env_overrides={"TRAINSTACK_LEASE_WAIT_S": "1", "TRAINSTACK_MAX_FAILURES": "1",
                                         "TRAINSTACK_LEASE_RETRY_S": "1"})
    proc = box.boot(watcher=False)
    wait_for(lambda: box.journal().count("trainer exited with 77") >= 2, 180, "two attempts refused the lease")
    assert "events.jsonl" not in s3_keys(s3_run)  # the refused attempts wrote nothing to the run
    s3.put_object(Bucket=s3_run.bucket, Key=key, Body=json.dumps({**held, "released": True}).encode())
    assert proc.wait(timeout=240) == 0, box.journal()
    objects = s3_keys(s3_run)
    assert "COMPLETE" in objects and "FAILED" not in objects, sorted(objects)
    assert "another machine holds the run's lease: trying again in 1s" in box.journal()  # paused between tries
    lease = json.loads(objects[layout.LEASE_KEY])
    assert lease["holder"].startswith(f"{INSTANCE_ID}/") and lease["epoch"] == 4 and lease["released"]
    assert [e["event"] for e in events(s3_run)].count("started") == 1


class _Container:
    """A stand-in for a running trainer container: a process `docker stop` can signal."""

    def __init__(self, box):
        code = "import signal,sys,time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); time.sleep(120)"
        self.proc = subprocess.Popen([sys.executable, "-c", code])
        pid_file = box.state / "containers" / "trainstack-trainer.pid"
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(str(self.proc.pid))
        self.rc: list[int] = []
        threading.Thread(target=lambda: self.rc.append(self.proc.wait()), daemon=True).start()


def _gcs_events(run, key: str = layout.machine_events_key(GCE_NAME)) -> list[dict]:
    from google.cloud import storage

    blob = storage.Client().bucket(run.bucket).blob(run.uri.removeprefix(f"gs://{run.bucket}/") + "/" + key)
    if not blob.exists():
        return []
    return [json.loads(line) for line in blob.download_as_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_aws_rebalance_is_recorded_and_the_notice_stops_with_100s_grace(machines, s3_run, metadata):
    box = machines(s3_run, "trainstack-x", "")
    container = _Container(box)
    box._start("watcher", "watch-notice.sh")
    metadata.rebalance = {"noticeTime": "2026-01-01T00:00:00Z"}
    wait_for(lambda: [e for e in machine_events(s3_run) if e["event"] == "rebalance"], 30, "rebalance event")
    # Several polls after it (each waits for the previous one's work): a rebalance hint must not stop training.
    polls = len([r for r in metadata.requests if r[1].endswith("spot/instance-action")])
    wait_for(lambda: len([r for r in metadata.requests if r[1].endswith("spot/instance-action")]) >= polls + 3,
             30, "three more polls")
    assert container.proc.poll() is None and box.argvs("docker") == []
    metadata.notice_aws()
    wait_for(lambda: container.rc, 30, "the container to stop")
    assert container.rc == [143]
    assert box.argvs("docker") == [["stop", "--time", "100", "trainstack-trainer"]]
    wait_for(lambda: [e for e in machine_events(s3_run) if e["event"] == "spot_notice"], 30, "spot_notice event")
    assert (box.root / "run/trainstack/notice-pending").read_text().startswith("instance-action ")
    assert [e["event"] for e in machine_events(s3_run)] == ["rebalance", "spot_notice"]
    assert events(s3_run) == []
    aws_reads = [r for r in metadata.requests if r[1].startswith("/latest/")]
    assert all(ok for _m, _p, ok in aws_reads)
    # One IMDSv2 token serves every poll (it lives 6 hours).
    assert [r[0] for r in aws_reads].count("PUT") == 1 and len(aws_reads) > 5
    assert oct((box.root / "run/trainstack/imds-token").stat().st_mode & 0o777) == "0o600"


def test_gce_preemption_stops_with_25s_grace_and_records_the_event(machines, gs_run, metadata):
    box = machines(gs_run, "trainstack-gcp", "", settings=settings_for("gcp"))
    container = _Container(box)
    box._start("watcher", "watch-notice.sh")
    wait_for(lambda: any("preempted" in p for _m, p, _ok in metadata.requests), 30, "the watcher's first poll")
    assert container.proc.poll() is None
    metadata.gce_preempted = True
    wait_for(lambda: container.rc, 30, "the container to stop")
    assert container.rc == [143]
    assert box.argvs("docker") == [["stop", "--time", "25", "trainstack-trainer"]]
    evs = wait_for(lambda: _gcs_events(gs_run), 30, "the spot_notice event")
    assert [(e["event"], e["cloud"], e["grace_s"], e["instance"]) for e in evs] == [
        ("spot_notice", "gcp", 25, GCE_NAME)]
    gce = [r for r in metadata.requests if r[1].startswith("/computeMetadata/")]
    assert gce and all(ok for _m, _p, ok in gce)  # every read carried Metadata-Flavor: Google


@pytest.mark.slow
def test_gcp_deadline_passed_writes_timed_out_and_resizes_the_group(machines, gs_run, metadata):
    from google.cloud import storage

    box = machines(gs_run, "trainstack-gcp", "", settings=settings_for("gcp"))
    bucket = storage.Client().bucket(gs_run.bucket)
    prefix = gs_run.uri.removeprefix(f"gs://{gs_run.bucket}/")
    bucket.blob(f"{prefix}/deadline").upload_from_string(f"{int(time.time()) - 5}\n")
    assert box.boot(watcher=False).wait(timeout=60) == 0, box.journal()
    marker = json.loads(bucket.blob(f"{prefix}/TIMED_OUT").download_as_text())
    assert marker["outcome"] == "TIMED_OUT" and marker["instance"] == GCE_NAME
    assert bucket.blob(f"{prefix}/logs/{GCE_NAME}/trainstack.log").exists()
    resize = ["compute", "instance-groups", "managed", "resize", "trainstack-gcp", "--size", "0",
              "--region", "us-central1", "--quiet"]
    assert resize in box.argvs("gcloud")
    _order(box, ("gcloud", "storage", "cp"), ("gcloud", "compute"), ("shutdown", "-h", "now"))
    assert box.argvs("docker") == []


@pytest.mark.slow
def test_deadline_reached_during_training_stops_the_trainer_and_times_out(sandbox_factory, s3_run, group):
    # The deadline must come after set-up (seconds, more on a loaded machine) and before the
    # steps are done: a generous deadline and steps no CPU finishes within it. The trainer holds
    # after its first checkpoint until the deadline's stop signal (tests/userdata/held_trainer.py)
    # instead of training flat out until then: the same stop, during training, without the CPU.
    box = sandbox_factory(env_overrides={"TRAINSTACK_MAX_RUNTIME_S": "40", "TRAINSTACK_STEPS": "100000000"})
    box.env.update(FAKE_TRAINER_MODULE="tests.userdata.held_trainer", FAKE_TRAINER_PATH=str(REPO))
    assert box.boot(watcher=False).wait(timeout=240) == 0, box.journal()
    assert (box.state / "trainer-held").exists()  # the stop found the trainer mid-run
    assert "starting the trainer" in box.journal()
    assert box.argvs("docker").count(["stop", "--time", "100", "trainstack-trainer"]) == 1
    marker = json.loads(s3_keys(s3_run)["TIMED_OUT"])
    assert "during training" in marker["reason"]
    assert "COMPLETE" not in s3_keys(s3_run)
    assert group_size(s3_run, group) == (0, 0, 0)
    _order(box, ("docker", "run"), ("docker", "stop"), ("aws", "autoscaling"), ("shutdown", "-h", "now"))


@pytest.mark.slow
def test_a_trainer_that_stops_making_progress_is_stopped_and_its_machine_replaced(sandbox_factory, s3_run, group):
    # The trainer holds after its first checkpoint (tests/userdata/held_trainer.py), as a hung collective
    # would: its progress.json stops changing. The start (set-up, TensorFlow's import, the first steps)
    # is silent for longer than the training bound here, and is not taken for a stall.
    settings = settings_for(steps=100, checkpointEverySteps=20)
    box = sandbox_factory(settings=settings, env_overrides={
        "TRAINSTACK_STALL_S": "6", "TRAINSTACK_STALL_POLL_S": "1", "TRAINSTACK_START_STALL_S": "600"})
    box.env.update(FAKE_TRAINER_MODULE="tests.userdata.held_trainer", FAKE_TRAINER_PATH=str(REPO))
    assert box.boot(watcher=False).wait(timeout=240) == 0, box.journal()
    assert (box.state / "trainer-held").read_text() == "20\n"
    journal = box.journal()
    assert "the trainer makes progress (step 20)" in journal
    assert box.argvs("docker").count(["stop", "--time", "100", "trainstack-trainer"]) == 1
    (stalled,) = [e for e in machine_events(s3_run) if e["event"] == layout.MACHINE_STALLED]
    assert stalled["reason"].startswith("the trainer made no progress for ") and stalled["reason"].endswith(
        "s after step 20"), stalled
    assert stalled["key"] == INSTANCE_ID and stalled["committed"] >= 20
    keys = s3_keys(s3_run)
    # No verdict on the run: no marker, the group keeps its size and brings a fresh machine.
    assert not any(marker in keys for marker in layout.END_MARKERS)
    assert group_size(s3_run, group) == (1, 1, 1)
    assert [a for a in box.argvs("aws") if a[0] == "autoscaling"] == []
    assert any(k.startswith(f"logs/{INSTANCE_ID}/") for k in keys)
    assert box.argvs("shutdown") == [["-h", "now"]]
    _order(box, ("docker", "run"), ("docker", "stop"), ("shutdown", "-h", "now"))


@pytest.mark.slow
def test_sigterm_from_a_shutdown_is_no_verdict_but_an_unexpected_exit_is_failed(sandbox_factory, s3_run, group):
    # systemd stopping the unit (the machine shutting down) ends the supervisor with 143
    # and leaves the run as it is.
    box = sandbox_factory()
    supervisor = box.boot(watcher=False)
    wait_for(lambda: "deadline" in s3_keys(s3_run), 60, "the first boot's deadline")
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=60) == 143
    assert not {"FAILED", "TIMED_OUT", "COMPLETE"} & set(s3_keys(s3_run))
    assert box.argvs("shutdown") == [] and group_size(s3_run, group) == (1, 1, 1)

    # A supervisor that breaks (here: bootstrap claims success but leaves no paths file)
    # finishes the run as FAILED instead of being restarted forever.
    box.power_off()
    # The first boot may have been stopped before it installed the boot scripts: installed now, so
    # the next boot does not fetch them again over the broken bootstrap.
    box.install_boot_scripts()
    bootstrap = box.root / "opt/trainstack/bin/bootstrap.sh"
    bootstrap.write_text("#!/bin/sh\nexit 0\n")
    # The first boot's bootstrap may have finished before the SIGTERM: no paths file either way.
    (box.root / "var/lib/trainstack/paths").unlink(missing_ok=True)
    assert box.boot(watcher=False).wait(timeout=60) == 0, box.journal()
    marker = json.loads(s3_keys(s3_run)["FAILED"])
    assert "stopped unexpectedly (exit 1)" in marker["reason"], marker
    assert box.argvs("shutdown") == [["-h", "now"]] and group_size(s3_run, group) == (0, 0, 0)
