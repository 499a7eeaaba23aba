"""`ops stop`, `ops runs` and `ops pull` as an operator types them: every line they print.

The commands run in this process through `python -m ops`'s own parser, over run folders on
disk (`file://`, no emulator), and each test compares what the operator reads (the lines on
stdout and stderr, the exit status, the files pulled, the request written) in full, so a
changed word, a lost hint or a wrong exit status fails here.
"""

from __future__ import annotations

import getpass
import json
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from ops import runs, runstate
from ops.__main__ import OpsParser, main
from runfolder import layout
from runfolder.storage import open_store
from tests.ops.test_status import build, commit, fake_pulumi, write_complete_doc

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(autouse=True)
def _who(monkeypatch):
    monkeypatch.setattr(getpass, "getuser", lambda: "ana")
    monkeypatch.setattr(socket, "gethostname", lambda: "laptop")


def _run(tmp_path: Path, kind: str, name: str = "r") -> tuple[str, object]:
    uri = f"file://{tmp_path}/bucket/runs/{name}"
    store = open_store(uri)
    if kind == "not_started":
        store.put_bytes("placement.json", b"{}")  # the folder exists; no trainer has written anything
    else:
        build(kind, store, tmp_path / f"build-{name}")
    return uri, store


def _parse(argv: list[str]):
    parser = OpsParser(prog="python -m ops")
    runs.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def _ends_once_asked(store, marker: str, doc: dict) -> threading.Thread:
    """The trainer's side of STOP: once the request is there, the run ends with ``marker``."""

    def trainer() -> None:
        deadline = time.monotonic() + 30
        while not store.exists(layout.STOP_KEY) and time.monotonic() < deadline:
            time.sleep(0.02)
        store.put_bytes(marker, json.dumps(doc).encode())

    t = threading.Thread(target=trainer, daemon=True)
    t.start()
    return t


# -- stop ------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "then"), [
    ("running", "  then the machine scales its group to zero and shuts down"),
    ("preempted", "  the run is not running here: start the same command once more and it ends at once"),
    ("not_started", "  no trainer runs now: the next machine's trainer ends it; its group then goes to zero"),
])
def test_stop_says_what_happens_next_for_the_state_the_run_is_in(tmp_path, capsys, kind, then):
    uri, store = _run(tmp_path, kind)
    assert main(["stop", "--run-uri", uri]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        f"asked {uri} to stop: the trainer commits a checkpoint and ends the run as CANCELLED;", then,
        f"follow it: python -m ops status --run-uri {uri} --watch"]
    request = json.loads(store.get_bytes(layout.STOP_KEY))
    assert (request["reason"], request["by"]) == ("asked to stop with ops stop", "ana@laptop")


def test_stop_records_the_reason_given(tmp_path, capsys):
    uri, store = _run(tmp_path, "running")
    assert main(["stop", "--run-uri", uri, "--reason", "out of budget"]) == 0
    assert json.loads(store.get_bytes(layout.STOP_KEY))["reason"] == "out of budget"


def test_stop_again_says_when_it_was_first_asked(tmp_path, capsys):
    uri, store = _run(tmp_path, "running")
    store.put_bytes(layout.STOP_KEY, json.dumps({"requested": "2026-12-01T10:00:00.000+00:00"}).encode())
    assert main(["stop", "--run-uri", uri]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"ops stop: {uri} was already asked to stop (2026-12-01T10:00:00.000+00:00); waiting for the trainer",
        f"follow it: python -m ops status --run-uri {uri} --watch"]
    store.put_bytes(layout.STOP_KEY, b"{torn")  # a request it cannot read still counts
    assert main(["stop", "--run-uri", uri]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"ops stop: {uri} was already asked to stop (earlier); waiting for the trainer")


@pytest.mark.parametrize(("marker", "doc", "rc", "last"), [
    (layout.CANCELLED, {"step": 130, "attempts": 1, "reason": "STOP"}, 0,
     "CANCELLED  stopped on request at step 130 (STOP)"),
    (layout.FAILED, {"outcome": "FAILED", "reason": "the trainer failed 5 times in a row", "step": 130}, 1,
     "FAILED  the trainer failed 5 times in a row"),
    (layout.TIMED_OUT, {"outcome": "TIMED_OUT", "reason": "the run's deadline passed", "step": 130}, 1,
     "TIMED_OUT  the run's deadline passed"),
    (layout.FAILED, {"outcome": "FAILED"}, 1, "FAILED"),  # a marker with no reason: the state alone
])
def test_stop_wait_ends_with_the_runs_end_and_its_exit_status(tmp_path, capsys, marker, doc, rc, last):
    uri, store = _run(tmp_path, "running")
    t = _ends_once_asked(store, marker, doc)
    got = main(["stop", "--run-uri", uri, "--wait", "--interval", "0.05", "--timeout", "10"])
    t.join()
    out, err = capsys.readouterr()
    assert (got, err) == (rc, "")
    assert out.splitlines()[-1] == last
    assert "follow it" not in out


def test_stop_wait_ending_complete_is_success(tmp_path, capsys):
    uri, store = _run(tmp_path, "running")

    def trainer() -> None:
        while not store.exists(layout.STOP_KEY):
            time.sleep(0.02)
        commit(store, tmp_path / "late", 1000)
        write_complete_doc(store, 1000)

    t = threading.Thread(target=trainer, daemon=True)
    t.start()
    assert main(["stop", "--run-uri", uri, "--wait", "--interval", "0.05", "--timeout", "10"]) == 0
    t.join()
    assert capsys.readouterr().out.splitlines()[-1].startswith("COMPLETE")


def test_stop_wait_gives_up_after_its_timeout_with_exit_1(tmp_path, capsys):
    uri, _store = _run(tmp_path, "running")
    start = time.monotonic()
    assert main(["stop", "--run-uri", uri, "--wait", "--interval", "0.05", "--timeout", "0.6"]) == 1
    took = time.monotonic() - start
    out, err = capsys.readouterr()
    assert err == (f"ops stop: the run has not ended after 1s (state RUNNING); "
                   f"see python -m ops status --run-uri {uri}\n")
    assert "follow it" not in out
    assert 0.6 <= took < 10  # it looked until the timeout, not once


@pytest.mark.parametrize("kind", ["complete", "failed"])
def test_stop_refuses_an_ended_run_with_its_detail(tmp_path, capsys, kind):
    uri, store = _run(tmp_path, kind)
    assert main(["stop", "--run-uri", uri]) == 2
    out, err = capsys.readouterr()
    detail = {"complete": f"COMPLETE  model in {uri}/model/",
              "failed": "FAILED  the trainer failed 5 times in a row (last exit 1)"}[kind]
    assert (out, err.splitlines()) == ("", [f"ops stop: the run has already ended: {detail}"])


def test_stop_refuses_an_ended_run_without_a_reason_with_its_state_alone(tmp_path, capsys):
    uri, store = _run(tmp_path, "running")
    store.put_bytes(layout.FAILED, b'{"outcome": "FAILED"}')
    assert main(["stop", "--run-uri", uri]) == 2
    assert capsys.readouterr() == ("", "ops stop: the run has already ended: FAILED\n")


def test_stop_through_a_stack_that_pulumi_cannot_read_is_one_line(tmp_path, monkeypatch, capsys):
    fake_pulumi(tmp_path / "bin", None, rc=255, stderr="error: no stack named 'dev' found")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert main(["stop", "--stack", "dev"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ops stop: ") and "no stack named 'dev' found" in err and len(err.splitlines()) == 1


def test_stop_through_the_stack_stops_its_run(tmp_path, monkeypatch, capsys):
    uri, store = _run(tmp_path, "running")
    fake_pulumi(tmp_path / "bin", {"runUri": uri})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert main(["stop", "--stack", "dev"]) == 0
    assert capsys.readouterr().out.startswith(f"asked {uri} to stop")
    assert store.exists(layout.STOP_KEY)


def test_stop_of_a_uri_no_store_can_open_is_one_line(capsys):
    assert main(["stop", "--run-uri", "ftp://host/runs/r"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("ops stop: ") and "ftp://host/runs/r" in err and len(err.splitlines()) == 1


# -- runs ------------------------------------------------------------------------------


def _table(out: str) -> dict[str, list[str]]:
    """The table's rows by run id: each row's cells (a wrapped cell's lines joined)."""
    rows: dict[str, list[str]] = {}
    last = None
    for line in ANSI.sub("", out).splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[0]:
            last = cells[0]
            rows[last] = cells
        elif last is not None:  # a wrapped cell's next line
            rows[last] = [f"{a} {b}".strip() for a, b in zip(rows[last], cells, strict=True)]
    return rows


def _aged(bucket: str, run_id: str, seconds_ago: float) -> None:
    import os

    from runfolder.storage.keys import file_root

    when = time.time() - seconds_ago
    for path in Path(file_root(f"{bucket}/runs/{run_id}")).rglob("*"):
        os.utime(path, (when, when))


@pytest.fixture
def wide(monkeypatch):
    """A wide terminal with colour, as an operator's: rich reads both from the environment."""
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)


def test_runs_table_shows_each_runs_figures_in_their_columns(tmp_path, capsys, wide):
    from tests.ops.test_status import iso, progress_of

    bucket = f"file://{tmp_path}/bucket"
    _run(tmp_path, "failed", "f")
    _run(tmp_path, "not_started", "n")
    note = "on-demand (dearest type), price table 2026-11-30"
    # One machine for an hour at $4321/h: the cost has a thousands separator.
    events = [{"event": "started", "time": iso(7200), "attempt": 1, "workers": 1,
               "config": {"price_per_hour": 4321.0, "price_note": note}},
              {"event": "preempted", "time": iso(3600), "attempt": 1, "step": 7}]
    open_store(f"{bucket}/runs/p").put_bytes("events.jsonl", "".join(json.dumps(e) + "\n" for e in events).encode())
    progress_of(open_store(f"{bucket}/runs/p"), 1, 7, 0, 0.5, 1.0)  # a step and no total
    _aged(bucket, "f", 3 * 3600 + 7 * 60)
    _aged(bucket, "n", 90)
    _aged(bucket, "p", 5)
    assert main(["runs", "--bucket-uri", bucket + "/"]) == 0
    out = capsys.readouterr().out
    plain = ANSI.sub("", out)
    assert plain.splitlines()[0].rstrip() == f"runs in {bucket}"
    assert [c.strip() for c in plain.splitlines()[2].strip("┃").split("┃")] == [
        "run", "state", "step", "age", "attempts", "cost", "goodput", "detail"]
    rows = _table(out)
    assert list(rows) == ["p", "n", "f"]  # newest first
    assert rows["f"][:6] == ["f", "FAILED", "400/1000", "3h 07m", "2", "-"]
    assert rows["f"][7] == "the trainer failed 5 times in a row (last exit 1)"
    assert rows["n"][6] == "-"  # nothing paid yet: no goodput
    assert rows["n"][:6] == ["n", runstate.NOT_STARTED, "-", "1m 30s", "0", "-"]
    assert rows["p"][2] == "7" and rows["p"][5] == "$4,321.00"
    assert plain.splitlines()[-1] == f"cost: machine time x nodes x {note}"
    assert out.splitlines()[-1].startswith("\x1b[2mcost: ")  # the note is dim: a footnote, not a figure
    # Each state in its colour.
    assert "\x1b[1;31mFAILED" in out and f"\x1b[2m{runstate.NOT_STARTED}" in out


def test_runs_aligns_numbers_right_and_words_left(tmp_path, capsys, wide):
    from tests.ops.test_status import iso

    _run(tmp_path, "failed", "a-long-run-name")
    uri, store = _run(tmp_path, "not_started", "n")
    events = [{"event": "started", "time": iso(7200), "attempt": 1, "workers": 1,
               "config": {"price_per_hour": 4321.0}},
              {"event": "preempted", "time": iso(3600), "attempt": 1, "step": 0}]
    store.put_bytes("events.jsonl", "".join(json.dumps(e) + "\n" for e in events).encode())
    assert main(["runs", "--bucket-uri", f"file://{tmp_path}/bucket"]) == 0
    lines = {ln.strip("│").split("│")[0].strip(): ln for ln in ANSI.sub("", capsys.readouterr().out).splitlines()
             if ln.startswith("│") and ln.strip("│").split("│")[0].strip()}
    long, short = lines["a-long-run-name"], lines["n"]
    # Left: the cells start at the same column; right: they end at the same column.
    for cell_long, cell_short in [("a-long-run-name", "n"), ("FAILED", runstate.STOPPED)]:
        assert long.index(cell_long) == short.index(cell_short)
    assert "$4,321.00" in short and " - │" in long
    # The short run stopped before its first commit: it stands at step 0 (its `preempted` event's).
    for cell_long, cell_short in [("400/1000", "0"), ("2 │", "1 │"), ("- │", "$4,321.00 │")]:
        assert long.index(cell_long) + len(cell_long) == short.index(cell_short) + len(cell_short)


def test_runs_wraps_a_long_detail_and_keeps_the_run_id_whole(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    name = "experiment-2026-12-04-resnet50-lr3e-4"
    _run(tmp_path, "failed", name)
    assert main(["runs", "--bucket-uri", f"file://{tmp_path}/bucket"]) == 0
    rows = _table(capsys.readouterr().out)
    assert list(rows) == [name]
    assert rows[name][7] == "the trainer failed 5 times in a row (last exit 1)"


def test_runs_json_is_the_listing(tmp_path, capsys):
    uri, _ = _run(tmp_path, "resumed", "r")
    assert main(["runs", "--bucket-uri", f"file://{tmp_path}/bucket/", "--json"]) == 0
    [r] = json.loads(capsys.readouterr().out)
    assert (r["id"], r["uri"], r["state"], r["step"], r["total"], r["attempts"]) == ("r", uri, "RUNNING", 400, 1000, 2)


def test_runs_of_a_bucket_whose_name_ends_in_x(tmp_path, capsys):
    uri = f"file://{tmp_path}/archiveX/runs/r"
    build("running", open_store(uri), tmp_path / "build")
    assert main(["runs", "--bucket-uri", f"file://{tmp_path}/archiveX/", "--json"]) == 0
    assert [r["uri"] for r in json.loads(capsys.readouterr().out)] == [uri]


def test_an_empty_bucket_says_where_it_looked(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    bucket = f"file://{tmp_path}/empty"
    assert main(["runs", "--bucket-uri", bucket + "/"]) == 0
    assert capsys.readouterr() == (f"no runs in {bucket}/runs/\n", "")


@pytest.mark.parametrize("command", ["runs", "dashboard"])
def test_a_folder_that_is_not_there_is_one_line_and_exit_2_for_runs_and_the_dashboard(tmp_path, capsys, command):
    from ops import dashboard

    parser = OpsParser(prog="python -m ops")
    sub = parser.add_subparsers(dest="command", required=True)
    runs.register(sub)
    dashboard.register(sub)
    args = parser.parse_args([command, "--bucket-uri", f"file://{tmp_path}/nope/runs", "--port", "0"][
        :None if command == "dashboard" else 3])
    assert args.func(args) == 2
    assert capsys.readouterr() == ("", f"ops {command}: no folder {tmp_path}/nope (file://{tmp_path}/nope/runs): give "
                                       "the bucket's folder or its runs/ folder\n")


def test_runs_of_the_runs_folder_are_the_buckets_runs_as_the_dashboard_reads_them(tmp_path, capsys, monkeypatch):
    from ops import dashboard

    uri = f"file://{tmp_path}/runs/demo"
    build("complete", open_store(uri), tmp_path / "build")
    monkeypatch.chdir(tmp_path)
    assert main(["runs", "--bucket-uri", "file://./runs", "--json"]) == 0
    assert [r["uri"] for r in json.loads(capsys.readouterr().out)] == [f"file://{tmp_path}/runs/demo"]
    bucket, store = runs.open_bucket("file://./runs/", None)
    assert (bucket, store.uri) == ("file://.", f"file://{tmp_path}")
    assert dashboard.open_bucket is runs.open_bucket  # the dashboard's rule is this one


def test_runs_through_a_stack_whose_run_uri_is_no_run_says_to_pass_the_bucket(tmp_path, monkeypatch, capsys):
    fake_pulumi(tmp_path / "bin", {"runUri": "s3://b/elsewhere"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert main(["runs", "--stack", "dev"]) == 2
    assert capsys.readouterr() == ("", "ops runs: run URI 's3://b/elsewhere' is not of the form <bucket>/runs/<id>; "
                                       "pass --bucket-uri\n")


def test_runs_of_a_bucket_no_store_can_open_is_one_line(capsys):
    assert main(["runs", "--bucket-uri", "ftp://host"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("ops runs: ") and "ftp://host" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(("argv", "where"), [(["--bucket-uri", "file://{}/b"], "file://{}/b"),
                                            (["--stack", "dev"], "dev")])
def test_runs_a_store_that_fails_names_the_bucket_and_the_error(tmp_path, monkeypatch, capsys, argv, where):
    (tmp_path / "b").mkdir()
    argv, where = [a.format(tmp_path) for a in argv], where.format(tmp_path)
    fake_pulumi(tmp_path / "bin", {"runUri": f"file://{tmp_path}/b/runs/r"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")

    def refused(_bucket, **_kw):
        raise PermissionError("Access Denied")

    monkeypatch.setattr(runs, "list_runs", refused)
    assert main(["runs", *argv]) == 2
    assert capsys.readouterr() == ("", f"ops runs: cannot list the runs in {where}: PermissionError: Access Denied\n")


# -- pull ------------------------------------------------------------------------------


def _model(store, n: int = 2) -> None:
    store.put_bytes("model/saved_model.pb", b"pb")
    for i in range(n - 1):
        store.put_bytes(f"model/variables/v{i}", b"v")


def test_pull_prints_where_the_model_went_and_how_to_load_it(tmp_path, capsys):
    uri, store = _run(tmp_path, "complete")
    _model(store, 3)
    dest = tmp_path / "out"
    assert main(["pull", "--run-uri", uri, str(dest)]) == 0
    assert capsys.readouterr() == (
        f"model (3 files) -> {dest / 'model'}  (tf.saved_model.load({str(dest / 'model')!r}))\n", "")
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "model/saved_model.pb", "model/variables/v0", "model/variables/v1"]
    assert [p.name for p in dest.iterdir()] == ["model"]  # no partial folder left beside it


@pytest.mark.parametrize(("files", "load"), [
    (["x.keras"], "keras.models.load_model({!r})".format),
    (["sub/net.h5", "notes.txt"], "keras.models.load_model({!r})".format),
    (["saved_model.pb", "variables/v0", "assets/m.keras"], None),
])
def test_pull_names_the_loader_of_the_model_it_fetched(tmp_path, capsys, files, load):
    uri, store = _run(tmp_path, "complete")
    for name in files:
        store.put_bytes(f"model/{name}", b"m")
    dest = tmp_path / "out"
    assert main(["pull", "--run-uri", uri, str(dest)]) == 0
    model = dest / "model"
    call = load(str(model / files[0])) if load else f"tf.saved_model.load({str(model)!r})"
    assert capsys.readouterr() == (f"model ({len(files)} files) -> {model}  ({call})\n", "")


@pytest.mark.parametrize("files", [["a.keras", "b.keras"], ["weights.bin"]])
def test_pull_of_a_model_it_cannot_name_a_loader_for_names_none(tmp_path, capsys, files):
    uri, store = _run(tmp_path, "complete")
    for name in files:
        store.put_bytes(f"model/{name}", b"m")
    dest = tmp_path / "out"
    assert main(["pull", "--run-uri", uri, str(dest)]) == 0
    assert capsys.readouterr() == (f"model ({len(files)} files) -> {dest / 'model'}\n", "")


def test_pull_of_a_running_run_warns_the_model_may_be_early(tmp_path, capsys):
    uri, store = _run(tmp_path, "resumed")
    _model(store)
    dest = tmp_path / "out"
    assert main(["pull", "--run-uri", uri, str(dest), "--checkpoint"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"model (2 files) -> {dest / 'model'}  (tf.saved_model.load({str(dest / 'model')!r}))",
        f"checkpoint step 130 (3 files) -> {dest / layout.checkpoint_dir(130)}"]
    assert err == "note: the run is RUNNING, not COMPLETE: the model may be from before its end\n"


def test_pull_checkpoint_alone_says_there_is_no_model_yet(tmp_path, capsys):
    uri, store = _run(tmp_path, "resumed")
    dest = tmp_path / "out"
    assert main(["pull", "--run-uri", uri, str(dest), "--checkpoint"]) == 0
    out, err = capsys.readouterr()
    assert out == f"checkpoint step 130 (3 files) -> {dest / layout.checkpoint_dir(130)}\n"
    assert err == f"ops pull: no model in {uri} yet (the run is RUNNING)\n"
    assert sorted(p.name for p in (dest / layout.checkpoint_dir(130)).iterdir()) == [
        "COMMITTED", "ckpt.index", "state.json"]


@pytest.mark.parametrize(("flags", "what", "hint"), [
    ([], "no model", "; --checkpoint fetches the newest committed checkpoint"),
    (["--outputs"], "no model and no outputs", "; --checkpoint fetches the newest committed checkpoint"),
    (["--checkpoint"], "no model and no committed checkpoint", ""),
    (["--checkpoint", "--outputs"], "no model and no committed checkpoint and no outputs", ""),
])
def test_pull_with_nothing_to_fetch_names_what_is_missing(tmp_path, capsys, flags, what, hint):
    uri, _store = _run(tmp_path, "not_started")
    assert main(["pull", "--run-uri", uri, str(tmp_path / "out"), *flags]) == 2
    assert capsys.readouterr() == ("", f"ops pull: {what} in {uri} yet (the run is {runstate.NOT_STARTED}: "
                                       f"the trainer writes model/ when training ends){hint}\n")


def _scripts_run(tmp_path, note: str | None) -> tuple[str, object]:
    uri = f"file://{tmp_path}/bucket/runs/s"
    store = open_store(uri)
    doc = {"step": 10, "attempts": 1, "model_files": 0, **({"model_note": note} if note else {})}
    store.put_bytes(layout.COMPLETE, json.dumps(doc).encode())
    return uri, store


@pytest.mark.parametrize("note", [None, "the script keeps its model in outputs/best.keras"])
def test_pull_of_a_script_that_saved_no_model_says_so_and_points_to_outputs(tmp_path, capsys, note):
    uri, _store = _scripts_run(tmp_path, note)
    said = note or runstate.NO_SCRIPT_MODEL
    assert main(["pull", "--run-uri", uri, str(tmp_path / "out")]) == 2
    assert capsys.readouterr() == ("", f"ops pull: no model in {uri}: {said}; --outputs fetches what it kept in "
                                       "outputs/\n")


def test_pull_outputs_of_a_script_that_saved_no_model(tmp_path, capsys):
    uri, store = _scripts_run(tmp_path, None)
    store.put_bytes("outputs/best.keras", b"k")
    dest = tmp_path / "out"
    assert main(["pull", "--run-uri", uri, str(dest), "--outputs"]) == 0
    out, err = capsys.readouterr()
    assert out == f"outputs (1 files) -> {dest / 'outputs'}\n"
    assert err == f"ops pull: no model in {uri}: {runstate.NO_SCRIPT_MODEL}\n"
    assert (dest / "outputs" / "best.keras").read_bytes() == b"k"


def test_pull_outputs_that_the_script_did_not_write_says_so(tmp_path, capsys):
    uri, store = _run(tmp_path, "complete")
    _model(store)
    dest = tmp_path / "out"
    assert main(["pull", "--run-uri", uri, str(dest), "--outputs"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("model (2 files)")
    assert err == f"ops pull: no outputs in {uri} (the script wrote nothing to fit.output_dir())\n"
    assert not (dest / "outputs").exists()


def test_pull_returns_what_it_fetched(tmp_path):
    uri, store = _run(tmp_path, "complete")
    _model(store)
    store.put_bytes("outputs/a.txt", b"a")
    dest = tmp_path / "out"
    got = runs.pull(uri, dest, checkpoint=True, outputs=True, store=store)
    assert got == {"state": "COMPLETE", "model": {"path": str(dest / "model"), "files": 2,
                                                  "load": f"tf.saved_model.load({str(dest / 'model')!r})"},
                   "checkpoint": {"step": 1000, "path": str(dest / layout.checkpoint_dir(1000)), "files": 3},
                   "outputs": {"path": str(dest / "outputs"), "files": 1}}


def test_pull_into_a_folder_that_holds_a_model_refuses_and_keeps_it(tmp_path, capsys):
    uri, store = _run(tmp_path, "complete")
    _model(store)
    dest = tmp_path / "out"
    (dest / "model").mkdir(parents=True)
    (dest / "model" / "mine.txt").write_text("keep")
    assert main(["pull", "--run-uri", uri, str(dest)]) == 2
    assert capsys.readouterr() == ("", f"ops pull: {dest / 'model'} exists already; remove it or pull into another "
                                       "folder\n")
    assert [p.name for p in (dest / "model").iterdir()] == ["mine.txt"]
    assert [p.name for p in dest.iterdir()] == ["model"]


def test_a_download_that_fails_leaves_nothing_half_written(tmp_path, monkeypatch):
    from runfolder import storage

    uri, store = _run(tmp_path, "complete")
    _model(store, 3)
    dest = tmp_path / "out"

    def broken(store, pairs, **kw):
        first = sorted(pairs.items())[0]
        Path(first[1]).parent.mkdir(parents=True, exist_ok=True)
        Path(first[1]).write_bytes(store.get_bytes(first[0]))
        raise OSError("connection reset")

    monkeypatch.setattr(storage, "download_many", broken)
    with pytest.raises(OSError, match="connection reset"):
        runs.pull(uri, dest)
    assert list(dest.iterdir()) == []


def test_pull_of_no_run_is_one_line(tmp_path, capsys):
    uri = f"file://{tmp_path}/bucket/runs/none"
    assert main(["pull", "--run-uri", uri, str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"ops pull: no run at {uri}") and len(err.splitlines()) == 1


# -- the command line ------------------------------------------------------------------


def test_the_commands_defaults(tmp_path):
    stop = _parse(["stop", "--run-uri", "s3://b/runs/r"])
    assert (stop.func, stop.wait, stop.timeout, stop.interval, stop.reason, stop.stack) == (
        runs.cmd_stop, False, runs.DEFAULT_WAIT_S, 5.0, None, None)
    assert runs.DEFAULT_WAIT_S == 900.0
    listing = _parse(["runs", "--bucket-uri", "s3://b"])
    assert (listing.func, listing.json, listing.stack) == (runs.cmd_runs, False, None)
    pulled = _parse(["pull", "--stack", "dev", "out"])
    assert (pulled.func, pulled.dest, pulled.checkpoint, pulled.outputs, pulled.run_uri) == (
        runs.cmd_pull, "out", False, False, None)
    assert _parse(["stop", "--stack", "dev", "--wait", "--timeout", "2.5", "--interval", "0.5"]).timeout == 2.5


@pytest.mark.parametrize(("argv", "error"), [
    (["stop"], "one of the arguments --stack --run-uri is required"),
    (["stop", "--stack", "dev", "--run-uri", "s3://b/runs/r"], "argument --run-uri: not allowed with argument --stack"),
    (["runs"], "one of the arguments --stack --bucket-uri is required"),
    (["runs", "--run-uri", "s3://b/runs/r"], "one of the arguments --stack --bucket-uri is required"),
    (["pull", "out"], "one of the arguments --stack --run-uri is required"),
    (["pull", "--stack", "dev", "--bucket-uri", "s3://b", "out"], "unknown option --bucket-uri"),
    (["stop", "--stack", "dev", "--timeout", "0"], "argument --timeout: '0': must be more than 0"),
    (["stop", "--stack", "dev", "--interval", "-1"], "argument --interval: '-1': must be more than 0"),
])
def test_the_commands_refuse_what_they_do_not_take(capsys, argv, error):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert error in capsys.readouterr().err


@pytest.mark.parametrize(("command", "helps"), [
    ("stop", ["end a run early: it checkpoints and ends as CANCELLED; the group goes to zero",
              "--stack STACK stack name: the run URI comes from its outputs (pulumi CLI)",
              "--run-uri RUN_URI the run's URI: s3://B/runs/ID, gs://B/runs/ID or file:///...",
              "--reason REASON recorded in the STOP request", "--wait wait until the run has ended",
              "--timeout TIMEOUT seconds --wait waits (default: 900.0)",
              "--interval INTERVAL seconds between checks with --wait"]),
    ("runs", ["every run in the stack's bucket: state, step/total, age, attempts",
              "--bucket-uri BUCKET_URI the bucket: s3://BUCKET, gs://BUCKET or file:///...",
              "--json print a JSON list"]),
    ("pull", ["download the run's SavedModel (model/) and, optionally, its newest checkpoint",
              "DEST local folder: DEST/model/ (and DEST/checkpoints/ckpt-N/)",
              "--checkpoint also the newest committed checkpoint",
              "--outputs also what a script wrote to fit.output_dir() (outputs/), to DEST/outputs/"]),
])
def test_each_commands_help_says_what_each_flag_does(capsys, monkeypatch, command, helps):
    monkeypatch.setenv("COLUMNS", "200")  # one line per flag: argparse wraps at hyphens
    with pytest.raises(SystemExit):
        main(["--help"])
    overview = " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f" {helps[0]} " in overview + " "  # the whole sentence, nothing added around it
    for line in helps[1:]:
        assert line in text, line


def test_pull_fetches_only_the_model_unless_asked_and_makes_the_folders_on_the_way(tmp_path):
    uri, store = _run(tmp_path, "complete")
    _model(store)
    store.put_bytes("outputs/a.txt", b"a")
    dest = tmp_path / "a" / "b" / "out"
    assert runs.pull(uri, dest) == {"state": "COMPLETE", "model": {
        "path": str(dest / "model"), "files": 2, "load": f"tf.saved_model.load({str(dest / 'model')!r})"}}
    assert [p.name for p in dest.iterdir()] == ["model"]


def test_a_partial_folder_left_by_an_earlier_pull_is_not_mixed_in(tmp_path):
    import os

    uri, store = _run(tmp_path, "complete")
    _model(store)
    dest = tmp_path / "out"
    stale = dest / f".model.partial-{os.getpid()}"  # a pull killed before it renamed its folder
    (stale / "variables").mkdir(parents=True)
    (stale / "variables" / "old-shard").write_bytes(b"from another model")
    runs.pull(uri, dest)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "model/saved_model.pb", "model/variables/v0"]


def test_pull_checkpoint_of_a_script_that_saved_no_model_fetches_it_and_says_why_no_model(tmp_path, capsys):
    uri, store = _scripts_run(tmp_path, None)
    commit(store, tmp_path / "ckpt", 10)
    dest = tmp_path / "out"
    assert main(["pull", "--run-uri", uri, str(dest), "--checkpoint"]) == 0
    assert capsys.readouterr() == (f"checkpoint step 10 (3 files) -> {dest / layout.checkpoint_dir(10)}\n",
                                   f"ops pull: no model in {uri}: {runstate.NO_SCRIPT_MODEL}\n")


@pytest.mark.parametrize("held", [False, True])
def test_stop_without_a_training_machine_ends_a_cloud_run_itself(tmp_path, capsys, monkeypatch, held):
    from ops import runstate
    from tests.controller.helpers import trained

    uri = f"file://{tmp_path}/bucket/runs/r"
    store = open_store(uri)
    now = time.time()
    trained(store, step=30, last_beat=now - 600, lease_released=not held, lease_until=now + 120)
    monkeypatch.setattr(runstate, "is_local", lambda run_uri: False)  # as a run in a bucket reads

    assert runs.cmd_stop(_parse(["stop", "--run-uri", uri])) == 0

    out = capsys.readouterr().out
    if held:  # a trainer holds the lease: it heeds the request itself
        assert not store.exists(layout.CANCELLED) and "no machine is training" not in out
        return
    marker = json.loads(store.get_bytes(layout.CANCELLED))
    assert (marker["outcome"], marker["instance"], marker["step"]) == (layout.CANCELLED, "ops stop", 30)
    assert "no machine is training, so it ends CANCELLED now" in out
