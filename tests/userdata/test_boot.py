"""The machine's life, run for real: the rendered boot scripts in a sandbox (see conftest).

Each scenario boots the sandbox machine, lets the real scripts run against moto_server
and the fake metadata service with the real trainer inside the fake `docker run`, and
asserts the commands called, their order, the group's size and the bucket's contents.
"""

from __future__ import annotations

import json
import time

import boto3
import pytest

from tests.userdata.conftest import events, group_size, s3_keys, settings_for, wait_for
from tests.userdata.metadata import INSTANCE_ID


def _order(box, *steps: tuple[str, ...]) -> list[float]:
    times = [box.first(cmd, *prefix) for cmd, *prefix in steps]
    assert times == sorted(times), f"out of order: {list(zip(steps, times, strict=True))}"
    return times


@pytest.mark.slow
def test_clean_run_completes_scales_to_zero_and_shuts_down(sandbox_factory, s3_run, group, metadata):
    box = sandbox_factory()
    start = time.time()
    assert box.boot().wait(timeout=240) == 0, box.journal()
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
    assert run[-4:] == ["tensorflow/tensorflow:2.21.0-gpu", "python", "-m", "trainer"]
    # The machine used IMDSv2: a token first, every metadata read with it.
    aws_reads = [r for r in metadata.requests if r[1].startswith("/latest/")]
    assert aws_reads and aws_reads[0][:2] == ("PUT", "/latest/api/token")
    assert all(ok for _m, _p, ok in aws_reads)
    assert [e["event"] for e in events(s3_run)][-1] in ("finished", "complete")


def _committed_steps(run) -> list[int]:
    return sorted(int(k.split("/")[1].removeprefix("ckpt-")) for k in s3_keys(run)
                  if k.startswith("checkpoints/") and k.endswith("/COMMITTED"))


@pytest.mark.slow
def test_spot_notice_stops_with_grace_then_second_boot_resumes_installing_nothing_twice(
        sandbox_factory, s3_run, group, metadata):
    settings = settings_for(steps=3000, checkpointEverySteps=500)
    box = sandbox_factory(settings=settings, toolkit=False)
    supervisor = box.boot()
    wait_for(lambda: _committed_steps(s3_run), 180, "a committed checkpoint")
    metadata.notice_aws()
    wait_for(lambda: "spot_notice" in [e["event"] for e in events(s3_run)], 60, "the spot_notice event")
    wait_for(lambda: "exited with 143" in box.journal(), 30, "the trainer's exit 143")
    time.sleep(1.0)  # the supervisor now waits for the cloud: it must do nothing more
    assert supervisor.poll() is None
    assert box.argvs("docker").count(["stop", "--time", "100", "trainstack-trainer"]) == 1
    assert box.calls("docker-sigkill") == []
    assert box.argvs("shutdown") == []
    assert [a for a in box.argvs("aws") if a[0] == "autoscaling"] == []
    assert group_size(s3_run, group) == (1, 1, 1)
    evs = events(s3_run)
    names = [e["event"] for e in evs]
    assert "preempted" in names
    notice = next(e for e in evs if e["event"] == "spot_notice")
    assert notice["grace_s"] == 100 and notice["instance"] == INSTANCE_ID and notice["cloud"] == "aws"
    stopped_at = _committed_steps(s3_run)[-1]
    assert stopped_at < 3000
    # The toolkit was missing: installed from NVIDIA's repository at the pinned version.
    installs = [a for a in box.argvs("apt-get") if "install" in a]
    assert len(installs) == 1 and "nvidia-container-toolkit=1.17.8-1" in installs[0]
    sources = (box.root / "etc/apt/sources.list.d/nvidia-container-toolkit.list").read_text()
    assert "[signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg]" in sources
    first_boot_calls = len(box.calls())

    box.power_off()
    metadata.instance_action = None  # a new boot: no notice
    assert box.boot().wait(timeout=240) == 0, box.journal()
    second = box.calls()[first_boot_calls:]
    # Nothing installed, fetched or pulled twice on the same disk.
    assert [c for c in second if c["cmd"] == "apt-get"] == []
    assert [c for c in second if c["cmd"] == "nvidia-ctk" and c["argv"][:1] == ["runtime"]] == []
    assert [c for c in second if c["cmd"] == "docker" and c["argv"][:1] in (["pull"], ["login"])] == []
    assert [c for c in second if c["cmd"] == "docker" and c["argv"][0] == "run" and "sh" in c["argv"]] == []
    assert [c for c in second if c["cmd"] == "aws" and "code/" in " ".join(c["argv"])] == []
    names = [e["event"] for e in events(s3_run)]
    assert "resumed" in names[names.index("spot_notice"):]
    resumed = next(e for e in reversed(events(s3_run)) if e["event"] == "resumed")
    assert resumed["step"] >= stopped_at
    assert "COMPLETE" in s3_keys(s3_run)
    assert group_size(s3_run, group) == (0, 0, 0)
    assert box.argvs("shutdown") == [["-h", "now"]]


def test_deadline_passed_times_out_without_starting_anything(sandbox_factory, s3_run, group):
    box = sandbox_factory()
    s3 = boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"])
    key = s3_run.uri.removeprefix(f"s3://{s3_run.bucket}/")
    s3.put_object(Bucket=s3_run.bucket, Key=f"{key}/deadline", Body=f"{int(time.time()) - 5}\n".encode())
    assert box.boot(watcher=False).wait(timeout=60) == 0, box.journal()
    objects = s3_keys(s3_run)
    marker = json.loads(objects["TIMED_OUT"])
    assert marker["outcome"] == "TIMED_OUT" and "deadline" in marker["reason"] and marker["instance"] == INSTANCE_ID
    assert f"logs/{INSTANCE_ID}/trainstack.log" in objects
    assert group_size(s3_run, group) == (0, 0, 0)
    assert box.argvs("nvidia-smi") == [] and box.argvs("docker") == []
    _order(box, ("aws", "s3", "cp", "-"), ("aws", "autoscaling"), ("shutdown", "-h", "now"))


def test_complete_run_finishes_at_boot(sandbox_factory, s3_run, group):
    box = sandbox_factory()
    s3 = boto3.client("s3", endpoint_url=s3_run.vars["AWS_ENDPOINT_URL"])
    key = s3_run.uri.removeprefix(f"s3://{s3_run.bucket}/")
    s3.put_object(Bucket=s3_run.bucket, Key=f"{key}/COMPLETE", Body=b'{"step": 40}')
    assert box.boot(watcher=False).wait(timeout=60) == 0, box.journal()
    assert sorted(k for k in s3_keys(s3_run) if not k.startswith("logs/")) == ["COMPLETE"]
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
