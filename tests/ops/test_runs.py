"""`ops stop`, `ops runs` and `ops pull` against file runs and the S3 / GCS emulators.

Runs are built as in `test_status.py` (the trainer's own writers); the trainer's side of
`STOP` (it polls, commits a checkpoint, writes `CANCELLED`) is played here by a thread
that does what the trainer's contract says.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from ops import runs, runstate
from ops.__main__ import main
from runfolder import layout
from runfolder.storage import open_store
from runfolder.storage.keys import file_root
from tests.ops.test_status import build, commit, fake_pulumi


def _bucket_of(run_uri: str) -> str:
    return run_uri.rsplit("/runs/", 1)[0]


# -- stop ------------------------------------------------------------------------------


def test_stop_writes_the_request_and_waits_for_cancelled(file_run, tmp_path, capsys):
    store = open_store(file_run.uri)
    build("resumed", store, tmp_path)

    def trainer() -> None:
        # The trainer's side: it finds STOP, commits, writes CANCELLED.
        deadline = time.monotonic() + 30
        while not store.exists(layout.STOP_KEY) and time.monotonic() < deadline:
            time.sleep(0.05)
        commit(store, tmp_path, 420)
        store.put_bytes(layout.CANCELLED, json.dumps({"step": 420, "attempts": 2, "reason": "STOP"}).encode())

    t = threading.Thread(target=trainer)
    t.start()
    rc = main(["stop", "--run-uri", file_run.uri, "--reason", "out of budget", "--wait", "--interval", "0.1",
               "--timeout", "30"])
    t.join()
    out = capsys.readouterr().out
    assert rc == 0, out
    request = json.loads(store.get_bytes(layout.STOP_KEY))
    assert request["reason"] == "out of budget" and request["state"] == "RUNNING" and "@" in request["by"]
    assert out.splitlines()[0].startswith(f"asked {file_run.uri} to stop")
    assert out.splitlines()[-1] == "CANCELLED  stopped on request at step 420 (STOP)"


def test_stop_twice_keeps_the_first_request(file_run, tmp_path, capsys):
    store = open_store(file_run.uri)
    build("running", store, tmp_path)
    assert main(["stop", "--run-uri", file_run.uri]) == 0
    first = store.get_bytes(layout.STOP_KEY)
    assert main(["stop", "--run-uri", file_run.uri, "--reason", "again"]) == 0
    assert store.get_bytes(layout.STOP_KEY) == first
    assert "already asked to stop" in capsys.readouterr().out


@pytest.mark.parametrize(("kind", "message"), [
    ("complete", "the run has already ended: COMPLETE"),
    ("failed", "the run has already ended: FAILED"),
    (None, "no run at"),
])
def test_stop_refuses_a_run_that_ended_or_does_not_exist(file_run, tmp_path, capsys, kind, message):
    store = open_store(file_run.uri)
    if kind:
        build(kind, store, tmp_path)
    assert main(["stop", "--run-uri", file_run.uri]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ops stop: {message}") and len(err.strip().splitlines()) == 1
    assert not store.exists(layout.STOP_KEY)


def test_stop_a_local_run_that_is_not_running_says_to_start_it_once_more(file_run, tmp_path, capsys):
    build("preempted", open_store(file_run.uri), tmp_path)  # a local run stopped with Ctrl-C
    assert main(["stop", "--run-uri", file_run.uri]) == 0
    assert "start the same command once more" in capsys.readouterr().out


@pytest.mark.slow
def test_stop_on_s3_through_the_stack(s3_run, tmp_path, monkeypatch):
    build("running", open_store(s3_run.uri), tmp_path)
    fake_pulumi(tmp_path / "bin", {"runUri": s3_run.uri})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert main(["stop", "--stack", "dev"]) == 0
    assert json.loads(open_store(s3_run.uri).get_bytes(layout.STOP_KEY))["state"] == "RUNNING"


# -- runs ------------------------------------------------------------------------------


@pytest.mark.parametrize("run_root", ["file", pytest.param("s3", marks=pytest.mark.slow),
                                      pytest.param("gs", marks=pytest.mark.slow)], indirect=True)
def test_runs_lists_every_run_in_the_bucket(run_root, tmp_path, capsys):
    bucket = _bucket_of(run_root.uri)
    kinds = ["complete", "resumed", "failed"]
    for i, kind in enumerate(kinds):
        build(kind, open_store(f"{bucket}/runs/{kind}"), tmp_path / kind)
        if bucket.startswith("file://"):
            # The listing's order is by each run's newest object: a local run's files are
            # dated 30, 20 and 10 s ago instead of waiting for the clock to move.
            when = time.time() - 10 * (len(kinds) - i)
            for path in Path(file_root(f"{bucket}/runs/{kind}")).rglob("*"):
                os.utime(path, (when, when))
        else:
            time.sleep(1.1)  # the stores date an object when they receive it, S3 in whole seconds
    assert main(["runs", "--bucket-uri", bucket, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["id"], r["state"], r["step"], r["total"], r["attempts"]) for r in listed] == [
        ("failed", "FAILED", 400, 1000, 2), ("resumed", "RUNNING", 400, 1000, 2), ("complete", "COMPLETE", 1000, 1000, 2)]
    assert all(0 <= r["age_seconds"] < 120 for r in listed)
    assert listed[1]["uri"] == f"{bucket}/runs/resumed"
    # The table names every run and its figures.
    assert main(["runs", "--bucket-uri", bucket]) == 0
    out = capsys.readouterr().out
    cells = [line.replace("│", " ").replace("┃", " ").split() for line in out.splitlines()]
    rows: dict = {}
    for c in cells:  # a run's first line (a wrapped detail's next line may begin with a kind's word)
        if c and c[0] in kinds:
            rows.setdefault(c[0], c)
    assert rows["resumed"][1:3] == ["RUNNING", "400/1000"] and rows["failed"][1] == "FAILED"


def test_runs_through_the_stack_uses_the_runs_bucket(file_run, tmp_path, monkeypatch, capsys):
    build("running", open_store(file_run.uri), tmp_path)
    fake_pulumi(tmp_path / "bin", {"runUri": file_run.uri})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert main(["runs", "--stack", "dev", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["uri"], r["state"]) for r in listed] == [(file_run.uri, "RUNNING")]


def test_runs_shows_each_runs_cost(tmp_path, capsys):
    from tests.ops.test_status import events_of

    bucket = f"file://{tmp_path}/bucket"
    note = "on-demand (dearest type), price table 2026-11-30"
    priced = ("started", {"config": {"steps": 1000, "price_per_hour": 4.0, "price_note": note}, "workers": 3})
    events_of(open_store(f"{bucket}/runs/priced"), 1, priced, ("preempted", {"step": 10}))
    events_of(open_store(f"{bucket}/runs/unpriced"), 1, ("started", {"config": {"steps": 5}, "workers": 1}),
              ("preempted", {"step": 1}))
    assert main(["runs", "--bucket-uri", bucket, "--json"]) == 0
    listed = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["priced"]["cost_note"] == note and listed["priced"]["machine_hours"] is not None
    assert listed["priced"]["cost_usd"] == round(listed["priced"]["machine_hours"] * 4.0, 2)
    assert listed["unpriced"]["cost_usd"] is None
    assert main(["runs", "--bucket-uri", bucket]) == 0
    out = capsys.readouterr().out
    rows = {c[0]: c for c in (line.replace("│", " ").split() for line in out.splitlines()) if c}
    assert f"${listed['priced']['cost_usd']:,.2f}" in rows["priced"]
    assert not [c for c in rows["unpriced"] if c.startswith("$")]
    assert f"cost: machine time x nodes x {note}" in " ".join(out.split())


def test_an_empty_bucket_has_no_runs(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["runs", "--bucket-uri", f"file://{tmp_path}/empty"]) == 0
    assert capsys.readouterr().out.startswith("no runs in ")


# -- pull ------------------------------------------------------------------------------


def _model(store) -> dict[str, bytes]:
    files = {"model/saved_model.pb": os.urandom(300), "model/variables/variables.index": b"idx",
             "model/variables/variables.data-00000-of-00001": os.urandom(2000)}
    for key, data in files.items():
        store.put_bytes(key, data)
    return files


@pytest.mark.parametrize("run_root", ["file", pytest.param("s3", marks=pytest.mark.slow)], indirect=True)
def test_pull_downloads_the_model_and_the_newest_checkpoint(run_root, tmp_path, capsys):
    store = open_store(run_root.uri)
    build("complete", store, tmp_path / "build")
    files = _model(store)
    dest = tmp_path / "out"
    assert main(["pull", "--run-uri", run_root.uri, str(dest), "--checkpoint"]) == 0
    for key, data in files.items():
        assert (dest / key).read_bytes() == data
    ckpt = dest / layout.checkpoint_dir(1000)
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        k.rsplit("/", 1)[1] for k in store.list(layout.checkpoint_dir(1000) + "/"))
    assert (ckpt / layout.COMMITTED).exists()
    assert not (dest / layout.checkpoint_dir(130)).exists()  # only the newest
    out = capsys.readouterr().out
    assert f"model (3 files) -> {dest / 'model'}" in out and "checkpoint step 1000" in out
    # A second pull into the same folder refuses to mix two downloads.
    assert main(["pull", "--run-uri", run_root.uri, str(dest)]) == 2
    assert "exists already" in capsys.readouterr().err


def test_pull_without_a_model_says_why(file_run, tmp_path, capsys):
    build("running", open_store(file_run.uri), tmp_path / "build")
    assert main(["pull", "--run-uri", file_run.uri, str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no model in" in err and "the run is RUNNING" in err and "--checkpoint" in err
    # The newest committed checkpoint is there to take meanwhile.
    got = runs.pull(file_run.uri, tmp_path / "out", checkpoint=True)
    assert got["checkpoint"]["step"] == 100 and "model" not in got
    assert not list(Path(tmp_path / "out").glob(".*partial*"))


def test_pull_outputs_brings_back_what_a_script_kept(file_run, tmp_path, capsys):
    store = open_store(file_run.uri)
    build("complete", store, tmp_path / "build")
    _model(store)
    store.put_bytes("outputs/report.txt", b"accuracy 0.9")
    store.put_bytes("outputs/plots/loss.png", b"png")
    dest = tmp_path / "out"
    assert main(["pull", "--run-uri", file_run.uri, str(dest), "--outputs"]) == 0
    assert (dest / "outputs" / "report.txt").read_bytes() == b"accuracy 0.9"
    assert (dest / "outputs" / "plots" / "loss.png").read_bytes() == b"png"
    assert f"outputs (2 files) -> {dest / 'outputs'}" in capsys.readouterr().out
    # Without --outputs, only the model.
    assert main(["pull", "--run-uri", file_run.uri, str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / "outputs").exists()


def test_bucket_of_a_run_uri():
    assert runs.bucket_uri_of("s3://b/runs/dev") == "s3://b"
    assert runs.bucket_uri_of("gs://b/x/runs/dev/") == "gs://b/x"
    with pytest.raises(runs.OpsError, match="--bucket-uri"):
        runs.bucket_uri_of("s3://b/elsewhere")
    assert runstate.RESUME_LOCAL.startswith("stopped")
