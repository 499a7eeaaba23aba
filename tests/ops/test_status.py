"""`ops status`: a run's state read from its bucket folder, on files, S3 (moto_server) and GCS.

Runs are built with the trainer's own writers where they exist (``EventLog`` for
``events.jsonl`` / ``progress.json``, ``CheckpointStore.commit`` for checkpoints,
``write_complete`` for ``COMPLETE``) and as the machine's scripts write them for
``machine-events/<machine>.jsonl`` and ``FAILED`` / ``TIMED_OUT``. ``--stack`` is resolved
through a fake ``pulumi`` on PATH.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ops import runstate, status
from ops.__main__ import main
from runfolder import layout
from runfolder.storage import open_store
from trainer.checkpoint_store import CheckpointStore
from trainer.events import EventLog

ROOT = Path(__file__).resolve().parents[2]
STATES = ["not_started", "running", "preempted", "resumed", "complete", "failed", "timed_out"]  # build() kinds


def iso(seconds_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).isoformat(timespec="milliseconds")


def events_of(store, attempt: int, *kinds: tuple[str, dict]) -> None:
    log = EventLog(store, attempt=attempt, stream=io.StringIO(), tty=False)
    for kind, fields in kinds:
        log.emit(kind, **fields)
    log.close()


def progress_of(store, attempt: int, step: int, total: int, loss: float, rate: float) -> None:
    log = EventLog(store, attempt=attempt, stream=io.StringIO(), tty=False)
    log.progress(step, total, loss, rate)
    log.close()


def machine_event(store, name: str, machine: str = "i-0abc", **fields) -> None:
    """One line appended to the machine's own object, as lib.sh's `event` leaves it."""
    from runfolder.storage import NotFound

    key = layout.machine_events_key(machine)
    try:
        old = store.get_bytes(key)
    except NotFound:
        old = b""
    line = json.dumps({"event": name, "time": iso(0), "instance": machine, **fields})
    store.put_bytes(key, old + line.encode() + b"\n")


def commit(store, tmp_path: Path, step: int) -> None:
    src = tmp_path / f"ckpt-src-{step}"
    src.mkdir(parents=True)
    (src / "state.json").write_text(json.dumps({"step": step}))
    (src / "ckpt.index").write_bytes(os.urandom(64))
    CheckpointStore(store).commit(step, str(src))


def write_complete_doc(store, step: int) -> None:
    """``COMPLETE`` as ``trainer.export.complete_record`` writes it (that one needs TF: 10 s to import)."""
    doc = {"step": step, "metrics": {"loss": 0.1}, "examples_seen": step * 64, "attempts": 2,
           "seconds_lost_to_preemption": 12.5, "total_seconds": 100.0, "finished_at": iso(0)}
    store.put_bytes(layout.COMPLETE, json.dumps(doc, indent=2).encode())


STARTED = ("started", {"config": {"steps": 1000, "batch_size": 64}, "global_batch": 64, "workers": 1})


def build(kind: str, store, tmp_path: Path) -> None:
    """Write the run folder a run in state ``kind`` has."""
    if kind == "not_started":
        return
    events_of(store, 1, STARTED, ("checkpoint", {"step": 100, "seconds": 0.1, "bytes": 10}))
    commit(store, tmp_path, 100)
    progress_of(store, 1, 130, 1000, 0.75, 640.0)
    if kind == "running":
        return
    machine_event(store, "spot_notice", cloud="aws", kind="termination")
    commit(store, tmp_path, 130)
    events_of(store, 1, ("checkpoint", {"step": 130}), ("preempted", {"step": 130, "signal": "SIGTERM"}))
    if kind == "preempted":
        return
    events_of(store, 2, STARTED, ("resumed", {"step": 130}))
    progress_of(store, 2, 400, 1000, 0.5, 640.0)
    if kind == "resumed":
        return
    if kind == "complete":
        commit(store, tmp_path, 1000)
        progress_of(store, 2, 1000, 1000, 0.1, 640.0)
        events_of(store, 2, ("finished", {"step": 1000, "metrics": {"loss": 0.1}}))
        write_complete_doc(store, 1000)
        return
    outcome = {"failed": "FAILED", "timed_out": "TIMED_OUT"}[kind]
    reason = {"FAILED": "the trainer failed 5 times in a row (last exit 1)", "TIMED_OUT": "the run's deadline passed"}
    doc = {"outcome": outcome, "reason": reason[outcome], "instance": "i-0abc", "time": iso(0),
           "step": 400, "attempts": 5}
    store.put_bytes(outcome, json.dumps(doc).encode())


EXPECTED = {
    # state, exit code, step, attempts, preemptions, newest checkpoint
    "running": ("RUNNING", 0, 130, 1, 0, 100),
    "preempted": ("PREEMPTED", 0, 130, 1, 1, 130),
    "resumed": ("RUNNING", 0, 400, 2, 1, 130),
    "complete": ("COMPLETE", 0, 1000, 2, 1, 1000),
    "failed": ("FAILED", 1, 400, 2, 1, 130),
    "timed_out": ("TIMED_OUT", 1, 400, 2, 1, 130),
}
# Nothing restarts a local run: stopped by a signal, it waits for its user.
LOCAL = {"preempted": ("STOPPED", 0, 130, 1, 1, 130)}


@pytest.mark.parametrize(
    ("run_root", "kinds"),
    [
        ("file", STATES[1:]),
        # Opening an S3 client takes most of a second: the states whose files differ most.
        pytest.param("s3", ["preempted", "complete", "timed_out"], marks=pytest.mark.slow),
        pytest.param("gs", ["resumed", "failed"], marks=pytest.mark.slow),
    ],
    indirect=["run_root"],
)
def test_status_json_and_exit_code_in_every_state(run_root, kinds, tmp_path, capsys):
    seen = {}
    for kind in kinds:
        uri = f"{run_root.uri}-{kind}"
        build(kind, open_store(uri), tmp_path / kind)
        rc = main(["status", "--run-uri", uri, "--json"])
        out = capsys.readouterr().out
        doc = json.loads(out)  # exactly one JSON object
        ckpt = doc["checkpoint"]["step"] if doc["checkpoint"] else None
        seen[kind] = (doc["state"], rc, doc["step"], doc["attempts"], doc["preemptions"], ckpt)
        assert doc["run_uri"] == uri
    local = LOCAL if run_root.uri.startswith("file://") else {}
    assert seen == {k: local.get(k, EXPECTED[k]) for k in kinds} and len(seen) == len(kinds)


def test_running_run_reports_progress_eta_checkpoint_age_and_recent_events(file_run, tmp_path):
    store = open_store(file_run.uri)
    build("resumed", store, tmp_path)
    st = status.read_status(file_run.uri, events=3)
    assert (st.state, st.step, st.total, st.loss, st.examples_per_sec) == ("RUNNING", 400, 1000, 0.5, 640.0)
    # 600 steps left at 640 examples/s with a global batch of 64 = 10 steps/s.
    assert st.eta_seconds == 60.0
    assert st.spot_notices == 1
    assert st.checkpoint.step == 130 and 0 <= st.checkpoint.age_seconds < 60
    assert 0 <= st.progress_age_seconds < 60
    assert [e["event"] for e in st.events] == ["preempted", "started", "resumed"]
    assert all("config" not in e for e in st.events)


@pytest.mark.slow
def test_preempted_cloud_run_says_it_waits_for_a_machine(s3_run, tmp_path):
    build("preempted", open_store(s3_run.uri), tmp_path)
    st = status.read_status(s3_run.uri)
    assert st.state == "PREEMPTED" and st.eta_seconds is None
    assert st.detail == "stopped at step 130; waiting for the group to start a machine"


def test_a_local_run_stopped_by_ctrl_c_says_how_to_resume(file_run, tmp_path, capsys):
    store = open_store(file_run.uri)
    events_of(store, 1, STARTED, ("preempted", {"step": 130, "signal": "SIGINT"}))
    assert main(["status", "--run-uri", file_run.uri, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["state"], doc["detail"]) == ("STOPPED", "stopped: run the same command to resume (stopped at step 130)")


def test_a_local_run_whose_process_died_says_how_to_resume(file_run, tmp_path):
    build("running", open_store(file_run.uri), tmp_path)
    st = status.read_status(file_run.uri, now=time.time() + 3600)
    assert (st.state, st.detail) == ("STOPPED", "stopped: run the same command to resume (no heartbeat for 1h 00m)")


def test_a_checkpoint_without_its_marker_is_not_reported(file_run, tmp_path):
    store = open_store(file_run.uri)
    build("running", store, tmp_path)
    store.put_bytes("checkpoints/ckpt-500/ckpt.index", b"half an upload")
    store.put_bytes("progress.json", b"{not json")  # a torn write must not break the report
    st = status.read_status(file_run.uri)
    assert (st.state, st.checkpoint.step, st.step, st.total) == ("RUNNING", 100, 100, 1000)


def test_failed_run_shows_the_reason(file_run, tmp_path, capsys):
    build("failed", open_store(file_run.uri), tmp_path)
    assert main(["status", "--run-uri", file_run.uri]) == 1
    out = capsys.readouterr().out
    assert "FAILED  the trainer failed 5 times in a row (last exit 1)" in out


def test_text_report_has_the_bar_and_the_figures(file_run, tmp_path, capsys):
    build("resumed", open_store(file_run.uri), tmp_path)
    assert main(["status", "--run-uri", file_run.uri]) == 0
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    by_label = {line.split()[0]: line for line in lines if line and not line.startswith(" ")}
    assert by_label["state"].split() == ["state", "RUNNING"]
    assert "━" in by_label["progress"] and by_label["progress"].endswith("400/1000 (40.0%)")
    assert by_label["loss"].split() == ["loss", "0.5", "examples/s", "640", "ETA", "1m", "00s"]
    assert by_label["attempts"].split() == ["attempts", "2", "preemptions", "1", "spot", "notices", "1"]
    assert by_label["checkpoint"].startswith("checkpoint  step 130, ")
    events = [line.split() for line in lines[lines.index(by_label["events"]):]]
    names = [(e[1:] if e[0] == "events" else e)[1] for e in events]
    assert names == ["checkpoint", "spot_notice", "checkpoint", "preempted", "started", "resumed"]
    assert events[-1][-2:] == ["attempt=2", "step=130"]


@pytest.mark.parametrize(
    ("last", "state", "detail"),
    [
        # A local run (file://): no machine retries it.
        (("failed", {"reason": "OSError: disk full", "step": 130}), "STOPPED",
         "attempt 1 failed (OSError: disk full); fix the cause and run the same command to resume from the newest "
         "checkpoint"),
        (("spot_notice", {"cloud": "gcp", "kind": "preempted"}), "RUNNING",
         "spot notice received: checkpointing before the machine is taken back"),
        (("finished", {"step": 1000}), "RUNNING", "training finished; writing the model"),
    ],
)
def test_running_run_says_what_it_is_doing(file_run, tmp_path, last, state, detail):
    store = open_store(file_run.uri)
    build("running", store, tmp_path)
    events_of(store, 1, last)
    st = status.read_status(file_run.uri)
    assert (st.state, st.detail) == (state, detail)


@pytest.mark.slow
def test_a_dead_trainer_is_stalled_not_running(s3_run, tmp_path, capsys):
    # The trainer rewrites progress.json every progress_every_seconds (10 s by default):
    # six intervals, and at least two minutes, without one is a stall.
    store = open_store(s3_run.uri)
    build("running", store, tmp_path)
    assert status.read_status(s3_run.uri, now=time.time() + 100).state == "RUNNING"
    st = status.read_status(s3_run.uri, now=time.time() + 3600)
    assert st.state == "STALLED" and st.eta_seconds is None and st.heartbeat_age_seconds >= 3600
    assert st.detail == ("no heartbeat for 1h 00m while training (expected every 10s): the trainer died or hangs; "
                         "see `ops logs`")
    assert st.checkpoint.age_seconds >= 3600
    # A fresh heartbeat makes it RUNNING again; a stall is exit 3 for scripts.
    progress_of(store, 1, 140, 1000, 0.7, 640.0)
    assert status.read_status(s3_run.uri).state == "RUNNING"
    assert status.exit_code(st) == 3


@pytest.mark.parametrize("phase", ["starting", "exporting"])
def test_phases_without_a_heartbeat_get_longer_before_a_stall(file_run, tmp_path, phase):
    # Staging data before the first step, and the model export after the last, write no
    # progress: half an hour before they count as a stall.
    store = open_store(file_run.uri)
    build("running", store, tmp_path)
    time.sleep(0.01)
    if phase == "starting":
        events_of(store, 2, STARTED, ("resumed", {"step": 100}))
        detail = "attempt 2 starting: staging data, building the model"
    else:
        events_of(store, 1, ("finished", {"step": 1000}))
        detail = "training finished; writing the model"
    st = status.read_status(file_run.uri, now=time.time() + 600)
    assert (st.state, st.detail) == ("RUNNING", detail)
    assert status.read_status(file_run.uri, now=time.time() + 2000).state == "STOPPED"  # a local run


def test_the_heartbeat_interval_comes_from_the_run(file_run, tmp_path):
    store = open_store(file_run.uri)
    slow = ("started", {"config": {"steps": 1000, "progress_every_seconds": 60}, "global_batch": 64})
    events_of(store, 1, slow)
    progress_of(store, 1, 10, 1000, 0.9, 640.0)
    assert status.read_status(file_run.uri, now=time.time() + 300).state == "RUNNING"
    assert status.read_status(file_run.uri, now=time.time() + 400).state == "STOPPED"


@pytest.mark.slow
def test_a_machine_taken_after_its_notice_is_preempted_not_stalled(s3_run, tmp_path):
    store = open_store(s3_run.uri)
    build("running", store, tmp_path)
    machine_event(store, "spot_notice", cloud="aws", kind="instance-action")
    assert status.read_status(s3_run.uri).detail.startswith("spot notice received")
    st = status.read_status(s3_run.uri, now=time.time() + 3600)
    assert st.state == "PREEMPTED" and "waiting for the group to start a machine" in st.detail


def test_watch_on_a_log_file_prints_a_snapshot_per_change_until_the_end(file_run, tmp_path):
    import argparse
    import threading

    from rich.console import Console

    store = open_store(file_run.uri)
    build("resumed", store, tmp_path)
    out = io.StringIO()
    console = Console(file=out, width=100)
    assert not console.is_terminal

    def shown(step: str) -> None:
        # Each change waits until the watch has printed the one before: the order is the
        # test's, whatever the machine's load (a fixed pause could be shorter than a tick).
        deadline = time.monotonic() + 30
        while f"{step}/1000" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)

    def finish_later() -> None:
        shown("400")
        progress_of(store, 2, 700, 1000, 0.3, 640.0)
        shown("700")
        write_complete_doc(store, 1000)

    writer = threading.Thread(target=finish_later)
    writer.start()
    args = argparse.Namespace(json=False, interval=0.1, events=2)
    st = status._watch(file_run.uri, args, console)
    writer.join()
    states = [line.split()[1] for line in out.getvalue().splitlines() if line.startswith("state ")]
    progress = [line.split()[-2] for line in out.getvalue().splitlines() if line.startswith("progress ")]
    assert (st.state, states[0], states[-1]) == ("COMPLETE", "RUNNING", "COMPLETE")
    # One snapshot per change (400, 700, then COMPLETE at 1000), not one per 0.1 s tick.
    assert progress == ["400/1000", "700/1000", "1000/1000"]


def test_no_run_at_the_uri_is_exit_2_and_one_line(file_run, capsys):
    assert main(["status", "--run-uri", file_run.uri]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ops status: no run at {file_run.uri}") and len(err.splitlines()) == 1
    assert main(["status", "--run-uri", file_run.uri, "--watch", "--json"]) == 2


def test_a_stacks_run_not_written_yet_is_not_started(file_run, tmp_path, monkeypatch, capsys):
    # With --stack the run is meant to be there: its machine is still booting.
    fake_pulumi(tmp_path / "bin", {"runUri": file_run.uri})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert main(["status", "--stack", "dev"]) == 0
    out = capsys.readouterr().out
    assert "NOT STARTED" in out and "none committed yet" in out


def test_machine_events_are_read_with_the_trainers_in_time_order(file_run, tmp_path):
    store = open_store(file_run.uri)
    events_of(store, 1, STARTED)
    machine_event(store, "rebalance", machine="i-0aaa")
    time.sleep(0.01)
    events_of(store, 1, ("checkpoint", {"step": 100, "seconds": 0.1, "bytes": 10}))
    time.sleep(0.01)
    machine_event(store, "spot_notice", machine="i-0bbb", cloud="aws")
    st = status.read_status(file_run.uri, events=10)
    assert [(e["event"], e.get("instance")) for e in st.events] == [
        ("started", None), ("rebalance", "i-0aaa"), ("checkpoint", None), ("spot_notice", "i-0bbb")]
    assert st.spot_notices == 1 and st.attempts == 1
    assert not store.get_bytes(layout.EVENTS_KEY).decode().count("spot_notice")


def test_end_markers_are_read_by_the_layouts_fields(file_run, tmp_path):
    store = open_store(file_run.uri)
    build("running", store, tmp_path)
    # An old machine's field name is not read: the contract's is `step`.
    store.put_bytes(layout.FAILED, json.dumps({"reason": "r", "final_step": 999, "attempts": 9}).encode())
    st = status.read_status(file_run.uri)
    assert (st.state, st.step, st.attempts, st.detail) == ("FAILED", 130, 1, "r")


def test_a_cancelled_run_ends_the_watch_with_exit_0(file_run, tmp_path, capsys):
    store = open_store(file_run.uri)
    build("resumed", store, tmp_path)
    store.put_bytes(layout.CANCELLED, json.dumps({"step": 420, "attempts": 2, "reason": "ops stop"}).encode())
    assert main(["status", "--run-uri", file_run.uri, "--watch", "--json", "--interval", "0.1"]) == 0
    doc = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (doc["state"], doc["step"], doc["detail"]) == ("CANCELLED", 420, "stopped on request at step 420 (ops stop)")


@pytest.mark.slow
def test_watch_ends_on_a_stall_with_exit_3(s3_run, tmp_path, capsys, monkeypatch):
    build("running", open_store(s3_run.uri), tmp_path)
    real = status.read_status
    monkeypatch.setattr(status, "read_status", lambda *a, **kw: real(*a, **{**kw, "now": time.time() + 3600}))
    assert main(["status", "--run-uri", s3_run.uri, "--watch", "--json", "--interval", "0.1"]) == 3
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["state"] == "STALLED"


@pytest.mark.parametrize(
    ("uri", "message"),
    [("ftp://bucket/run", "unsupported scheme 'ftp'"), ("no-scheme", "must start with s3://, gs:// or file://")],
)
def test_bad_run_uri_is_one_line_and_exit_2(uri, message, capsys):
    assert main(["status", "--run-uri", uri]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


# -- --stack through the pulumi CLI ----------------------------------------------------


def fake_pulumi(bin_dir: Path, outputs: dict | None, *, rc: int = 0, stderr: str = "") -> Path:
    """A `pulumi` executable that records its arguments and prints ``outputs`` as JSON."""
    bin_dir.mkdir(exist_ok=True)
    args_file = bin_dir / "pulumi-args"
    script = bin_dir / "pulumi"
    (bin_dir / "pulumi-stdout").write_text(json.dumps(outputs) if outputs is not None else "")
    (bin_dir / "pulumi-stderr").write_text(stderr)
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$PWD" "$@" > {args_file}\n'
        f"cat {bin_dir / 'pulumi-stdout'}\n"
        f"cat {bin_dir / 'pulumi-stderr'} >&2\n"
        f"exit {rc}\n"
    )
    script.chmod(0o755)
    return args_file


def test_watch_command_resolves_the_stack_with_pulumi_and_exits_1_on_failure(file_run, tmp_path):
    build("timed_out", open_store(file_run.uri), tmp_path)
    bin_dir = tmp_path / "bin"
    args_file = fake_pulumi(bin_dir, {"runUri": file_run.uri, "groupName": "g"})
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    # The stack's exported watchCommand, run from another folder: pulumi still runs in the project.
    proc = subprocess.run([sys.executable, "-m", "ops", "status", "--stack", "dev", "--json"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.strip(), proc.stderr
    assert json.loads(proc.stdout)["state"] == "TIMED_OUT"
    recorded = args_file.read_text().splitlines()
    assert recorded == [str(ROOT), "stack", "output", "--json", "--stack", "dev"]


def test_missing_pulumi_cli_is_one_line_suggesting_run_uri(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no pulumi here
    assert main(["status", "--stack", "dev"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ops status: the pulumi CLI is not on PATH") and "--run-uri" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("outputs", "rc", "stderr", "message"),
    [
        (None, 255, "error: no stack named 'prod' found", "failed: error: no stack named 'prod' found"),
        ({"bucketName": "b"}, 0, "", "stack prod has no runUri output; run `pulumi up` for it first"),
    ],
)
def test_pulumi_errors_are_reported(tmp_path, monkeypatch, capsys, outputs, rc, stderr, message):
    fake_pulumi(tmp_path / "bin", outputs, rc=rc, stderr=stderr)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert main(["status", "--stack", "prod"]) == 2
    assert message in capsys.readouterr().err


# -- --watch ---------------------------------------------------------------------------


def test_watch_refreshes_until_the_run_ends(file_run, tmp_path):
    store = open_store(file_run.uri)
    build("resumed", store, tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops", "status", "--run-uri", file_run.uri, "--watch", "--json", "--interval", "0.2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = json.loads(proc.stdout.readline())
        progress_of(store, 2, 700, 1000, 0.3, 640.0)
        deadline = time.monotonic() + 30
        steps = [first["step"]]
        while steps[-1] != 700 and time.monotonic() < deadline:
            steps.append(json.loads(proc.stdout.readline())["step"])
        write_complete_doc(store, 1000)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    last = json.loads(out.splitlines()[-1])
    assert (first["state"], steps[0], steps[-1]) == ("RUNNING", 400, 700)
    assert (last["state"], last["step"], proc.returncode) == ("COMPLETE", 1000, 0), err


# -- the group, with --stack -----------------------------------------------------------


def test_aws_group_state_reports_the_failed_launches_since_the_last_success():
    from datetime import datetime as dt

    import boto3
    from botocore.stub import Stubber

    from ops import hosts

    client = boto3.client("autoscaling", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    stub = Stubber(client)
    stub.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [{
        "AutoScalingGroupName": "g", "MinSize": 1, "MaxSize": 1, "DesiredCapacity": 1, "DefaultCooldown": 300,
        "AvailabilityZones": ["us-east-1a"], "HealthCheckType": "EC2", "CreatedTime": dt(2026, 1, 1),
        "Instances": []}]}, {"AutoScalingGroupNames": ["g"]})
    capacity = ("Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity "
                "available that matches your request. Launching EC2 instance failed.")

    def activity(hour: int, code: str, message: str = "") -> dict:
        a = {"ActivityId": f"a{hour}", "AutoScalingGroupName": "g", "Cause": "c", "StatusCode": code,
             "Description": "Launching a new EC2 instance", "StartTime": dt(2026, 1, 1, hour, 5)}
        return {**a, "StatusMessage": message} if message else a

    stub.add_response("describe_scaling_activities", {"Activities": [
        activity(12, "Failed", capacity), activity(11, "Failed", "VcpuLimitExceeded"),
        activity(10, "Successful"), activity(9, "Failed", "an old failure, overcome since")]},
        {"AutoScalingGroupName": "g", "MaxRecords": 20})
    with stub:
        state = hosts.aws_group_state("g", client=client)
    stub.assert_no_pending_responses()
    assert (state.running, state.desired) == (0, 1)
    assert state.launch_failures == (f"12:05 {capacity}", "11:05 VcpuLimitExceeded")


def test_gcp_group_state_from_gcloud(tmp_path, monkeypatch):
    from ops import hosts

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    answers = {
        "describe": {"targetSize": 1},
        "list-errors": [{"timestamp": "2026-11-30T20:01:02.000-08:00", "error": {
            "code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": "The zone does not have enough resources"}}],
        "list": [],
    }
    for name, doc in answers.items():
        (bin_dir / f"{name}.json").write_text(json.dumps(doc))
    (bin_dir / "gcloud").write_text(
        f'#!/bin/sh\necho "$@" >> {bin_dir}/calls\n'
        f'case "$*" in *managed\\ describe*) cat {bin_dir}/describe.json;; *list-errors*) cat {bin_dir}/list-errors.json;;'
        f' *instances\\ list*) cat {bin_dir}/list.json;; *) exit 2;; esac\n')
    (bin_dir / "gcloud").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    state = hosts.gcp_group_state("trainstack-dev", "us-central1")
    assert state == hosts.GroupState(running=0, desired=1, launch_failures=(
        "20:01 ZONE_RESOURCE_POOL_EXHAUSTED: The zone does not have enough resources",))
    calls = (bin_dir / "calls").read_text().splitlines()
    assert calls[0] == "compute instance-groups managed describe trainstack-dev --region us-central1 --format=json"
    # The stack's project, from its outputs, reaches every gcloud call: gcloud's own may be another.
    (bin_dir / "calls").unlink()
    fake_pulumi(tmp_path / "pulumi-bin", {"runUri": "gs://b/runs/r", "groupName": "trainstack-dev",
                                          "region": "us-central1", "project": "my-proj-123"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'pulumi-bin'}{os.pathsep}{os.environ['PATH']}")
    hosts._outputs_once.cache_clear()
    assert hosts.stack_group_state("dev") == state
    calls = (bin_dir / "calls").read_text().splitlines()
    assert len(calls) == 3 and all("--project my-proj-123" in c for c in calls), calls
    assert calls[0] == ("compute instance-groups managed describe trainstack-dev --region us-central1 "
                        "--project my-proj-123 --format=json")


@pytest.mark.slow
def test_status_of_a_stack_that_cannot_launch_says_why(s3_run, tmp_path, monkeypatch, capsys):
    from ops import hosts

    fake_pulumi(tmp_path / "bin", {"runUri": s3_run.uri, "groupName": "g"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    failure = "12:05 Could not launch Spot Instances. InsufficientInstanceCapacity"
    monkeypatch.setattr(hosts, "stack_group_state", lambda stack: hosts.GroupState(0, 1, (failure,)))
    assert main(["status", "--stack", "dev", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["state"], doc["detail"]) == ("NOT STARTED", f"the group cannot launch a machine: {failure}")
    assert (doc["machines_running"], doc["machines_desired"], doc["launch_failures"]) == (0, 1, [failure])
    # Without credentials the group is a note, and the run's own state still shows.
    monkeypatch.setattr(hosts, "stack_group_state",
                        lambda stack: (_ for _ in ()).throw(hosts.HostsError("cannot read the group g: no credentials")))
    assert main(["status", "--stack", "dev", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["group_note"] == "group not read: cannot read the group g: no credentials"
    assert doc["detail"].startswith("nothing written yet")


def test_a_workers_own_failed_event_is_in_the_timeline(file_run, tmp_path):
    from trainer.cluster import record_worker_event

    store = open_store(file_run.uri)
    events_of(store, 1, STARTED)
    time.sleep(0.01)
    failed = {"event": "failed", "time": iso(0), "attempt": 1, "reason": "a peer was lost", "exit_code": 76,
              "address": "10.0.0.7:2222"}
    assert record_worker_event(store, "10.0.0.7:2222", failed)
    st = status.read_status(file_run.uri, events=10)
    assert [(e["event"], e.get("address")) for e in st.events] == [("started", None), ("failed", "10.0.0.7:2222")]
    assert store.list(layout.WORKER_EVENTS_PREFIX) == [layout.worker_events_key("10.0.0.7:2222")]
    assert "failed" not in store.get_bytes(layout.EVENTS_KEY).decode()  # the chief's log is the chief's alone


def test_status_shows_the_cost_so_far_and_the_total_once_ended(s3_run, tmp_path, capsys):
    store = open_store(s3_run.uri)
    note = "spot estimate (dearest type), price table 2026-11-30"
    priced = ("started", {"config": {"steps": 1000, "price_per_hour": 1.5, "price_note": note}, "workers": 2,
                          "global_batch": 128})
    events_of(store, 1, priced, ("checkpoint", {"step": 100, "seconds": 0.1, "bytes": 10}))
    started_at = runstate.stamp(json.loads(store.get_bytes("events.jsonl").splitlines()[0])["time"])
    # An hour later the attempt still runs: 1 h x 2 nodes x $1.50.
    st = status.read_status(s3_run.uri, now=started_at + 3600)
    assert st.state == "STALLED"  # no heartbeat for an hour; the machine may still be billing
    assert (st.machine_hours, st.cost_usd, st.cost_note) == (2.0, 3.0, note)
    assert status.cost_text(st) == f"$3.00 so far for 2h 00m machine time ({note})"
    events_of(store, 1, ("preempted", {"step": 100, "signal": "SIGTERM"}))
    assert status.read_status(s3_run.uri, now=started_at + 3600).cost_usd < 0.1  # ended at the preemption
    write_complete_doc(store, 1000)
    assert main(["status", "--run-uri", s3_run.uri]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # Ended: the total, no "so far".
    assert re.search(r"cost \$0\.\d\d for \d+s machine time \(spot estimate \(dearest type\), price table 2026-11-30\)",
                     out), out


def test_status_splits_the_time_and_cost_of_a_run_that_moved_by_placement(s3_run, capsys):
    store = open_store(s3_run.uri)

    def started(price, where):
        return ("started", {"config": {"steps": 1000, "price_per_hour": price, "placement": where}, "workers": 1})

    events_of(store, 1, started(1.0, "aws us-east-1"), ("preempted", {"step": 10, "signal": "SIGTERM"}))
    events_of(store, 2, started(2.0, "aws us-west-2"), ("checkpoint", {"step": 20, "seconds": 0.1, "bytes": 10}))
    times = [runstate.stamp(json.loads(line)["time"]) for line in store.get_bytes("events.jsonl").splitlines()]
    st = status.read_status(s3_run.uri, now=times[2] + 3600)  # the second attempt still runs an hour on
    got = [(p["placement"], p["attempts"], p["cost_usd"]) for p in st.placement_costs]
    assert got == [("aws us-east-1", 1, 0.0), ("aws us-west-2", 1, 2.0)]
    lines = status.placement_cost_lines(st)
    assert [line.split(":")[0] for line in lines] == ["aws us-east-1", "aws us-west-2"]
    assert lines[1].startswith("aws us-west-2: $2.00 for 1h 00m machine time, 1 attempt"), lines
    assert main(["status", "--run-uri", s3_run.uri, "--json"]) in (0, status.EXIT_STALLED)
    doc = json.loads(capsys.readouterr().out)
    assert [p["placement"] for p in doc["placement_costs"]] == ["aws us-east-1", "aws us-west-2"]
    # One placement: no split to show (the cost line says it all).
    st.placement_costs = st.placement_costs[:1]
    assert status.placement_cost_lines(st) == []


def test_an_old_heartbeat_without_any_event_is_stalled_not_a_crash(s3_run, capsys):
    # progress.json alone (events.jsonl not written or lost), last updated long ago.
    open_store(s3_run.uri).put_bytes("progress.json", json.dumps(
        {"step": 7, "total": 10, "loss": 1.0, "examples_per_sec": 1.0, "attempt": 1,
         "updated": "2026-01-01T00:00:00+00:00"}).encode())
    assert main(["status", "--run-uri", s3_run.uri, "--json"]) == status.EXIT_STALLED
    doc = json.loads(capsys.readouterr().out)
    assert (doc["state"], doc["step"]) == ("STALLED", 7) and "while training" in doc["detail"]


@pytest.mark.slow
def test_machines_waiting_for_a_lost_peer_say_so_and_when_the_run_gives_up(s3_run, tmp_path):
    # A peer was lost and no replacement came: the survivor heartbeats in the rendezvous, no
    # trainer runs (no progress), and its `waiting_for_machines` event says until when.
    store = open_store(s3_run.uri)
    build("running", store, tmp_path)
    machine_event(store, layout.WAITING_FOR_MACHINES, generation=3, came=1, nodes=2,
                  since="2026-01-01T10:00:00Z", until="2026-01-01T10:30:00Z")
    for now in (time.time(), time.time() + 3600):  # the trainer's heartbeat has long stopped
        st = status.read_status(s3_run.uri, now=now)
        assert st.state in ("RUNNING", "PREEMPTED") and st.state != "STALLED"
        assert st.detail == ("waiting for the other machines: 1 of 2 came to generation 3 (since 10:00:00 UTC); the "
                             "run ends FAILED at 10:30:00 UTC unless the group brings the rest (TRAINSTACK_PEER_WAIT_S)")
    assert status.exit_code(st) != status.EXIT_STALLED
    # A generation that forms again starts a trainer: its events are newer, the wait is over.
    time.sleep(0.01)
    events_of(store, 2, STARTED, ("resumed", {"step": 100}))
    assert "waiting for the other machines" not in status.read_status(s3_run.uri).detail
