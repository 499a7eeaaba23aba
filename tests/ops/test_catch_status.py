"""`ops status` as an operator reads it: every row of the report, from statuses built here.

`tests/ops/test_status.py` reads real run folders into a status; here `RunStatus` values are
built field by field so that each row the report can show (progress, loss, metrics and the
best, the placement, the group's machines and failed launches, cost per placement, the
checkpoint, the model's signature, the events) is compared whole, with its edge cases (no
total, a step past the total, one attempt, a long event). The command's own paths (the stack's
group, a read that fails mid-watch, each exit status) run in process over `file://` runs.
"""

from __future__ import annotations

import argparse
import io
import json

import pytest
from rich.console import Console

from ops import hosts, runstate, status
from ops.__main__ import OpsParser, main
from ops.runstate import Checkpoint, RunStatus
from runfolder import layout
from runfolder.storage import open_store
from tests.ops.test_status import build, fake_pulumi

READ_STATUS = status.read_status


def _shown(st: RunStatus) -> list[str]:
    """The report as text (no colour, 160 columns), right-trimmed lines."""
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(status.render(st))
    return [line.rstrip() for line in out.getvalue().splitlines()]


def _rows(st: RunStatus) -> dict[str, str]:
    """label -> the text after it, for each row that has a label."""
    rows = {}
    for line in _shown(st):
        label, _, rest = line.partition("  ")
        if label and not label.startswith(" "):
            rows.setdefault(label, rest.strip())
    return rows


def test_a_bare_status_has_its_run_state_attempts_and_no_checkpoint():
    assert _shown(RunStatus("s3://b/runs/r", runstate.NOT_STARTED)) == [
        "run         s3://b/runs/r",
        "state       NOT STARTED",
        "attempts    0   preemptions 0   spot notices 0",
        "checkpoint  none committed yet",
    ]


def test_the_state_carries_its_detail():
    assert _rows(RunStatus("s3://b/runs/r", "RUNNING", detail="training finished; writing the model"))["state"] == (
        "RUNNING  training finished; writing the model")


@pytest.mark.parametrize(("step", "total", "shown"), [
    (400, 1000, "400/1000 (40.0%)"), (None, 1000, "0/1000 (0.0%)"), (1200, 1000, "1200/1000 (120.0%)"),
    (1, 3, "1/3 (33.3%)"),
])
def test_progress_is_a_bar_with_the_step_of_the_total(step, total, shown):
    progress = _rows(RunStatus("r", "RUNNING", step=step, total=total))["progress"]
    assert progress.endswith(shown)
    bar = progress[:-len(shown)].strip()
    # Without colour the bar is its done part: 36 characters wide for the whole.
    assert bar.strip("━╸") == "" and bar.count("━") == int(min(step or 0, total) / total * 36)


def test_a_step_without_a_total_is_the_step_alone():
    assert _rows(RunStatus("r", "RUNNING", step=7))["progress"] == "step 7"
    assert "progress" not in _rows(RunStatus("r", "RUNNING"))


@pytest.mark.parametrize(("loss", "rate", "eta", "shown"), [
    (0.123456, 1234.6, 65.0, "0.1235   examples/s 1,235   ETA 1m 05s"),
    (None, 640.0, None, "-   examples/s 640   ETA -"),
    (2.0, None, 3.0, "2   examples/s -   ETA 3s"),
])
def test_the_loss_row_has_the_rate_and_the_eta(loss, rate, eta, shown):
    assert _rows(RunStatus("r", "RUNNING", loss=loss, examples_per_sec=rate, eta_seconds=eta))["loss"] == shown


def test_no_loss_and_no_rate_is_no_loss_row():
    assert "loss" not in _rows(RunStatus("r", "RUNNING", eta_seconds=5.0))


@pytest.mark.parametrize(("evaluated", "seconds", "tail"), [
    (None, None, ""), (400, None, "   (evaluated at step 400)"), (None, 3.24, "   (evaluation 3.2s in all)"),
    (400, 59.9, "   (evaluated at step 400; evaluation 59.9s in all)"),
    (400, 60.0, "   (evaluated at step 400; evaluation 1m 00s in all)"),
])
def test_metrics_are_sorted_by_name_with_when_they_were_evaluated(evaluated, seconds, tail):
    st = RunStatus("r", "RUNNING", metrics={"val_loss": 0.061234, "accuracy": 0.98123},
                   evaluated_step=evaluated, eval_seconds=seconds)
    assert _rows(st)["metrics"] == "accuracy 0.9812   val_loss 0.06123" + tail


@pytest.mark.parametrize(("best", "shown"), [
    ({"metric": "val_loss", "value": 0.251234, "step": 20}, "val_loss 0.2512 at step 20"),
    ({"metric": "val_loss", "value": 0.25, "step": 20, "mode": "min"}, "val_loss 0.25 at step 20 (min)"),
    ({"metric": "acc", "value": 0.9, "step": 5, "mode": "max", "exported": True},
     "acc 0.9 at step 5 (max); exported as model/"),
    ({"metric": "acc", "value": 0.9, "step": 5, "exported": False},
     "acc 0.9 at step 5; its checkpoint could not be read: model/ is the final one"),
    ({"metric": "acc", "value": 0.9, "step": 5, "exported": None}, "acc 0.9 at step 5"),
])
def test_the_best_says_whether_model_holds_it(best, shown):
    assert status.best_text(best) == shown
    assert _rows(RunStatus("r", "COMPLETE", best=best))["best"] == shown


def test_the_progress_age_and_the_attempts():
    rows = _rows(RunStatus("r", "RUNNING", progress_updated="2026-12-04T10:00:00", progress_age_seconds=125,
                           attempts=3, preemptions=2, spot_notices=1))
    assert rows["updated"] == "2026-12-04T10:00:00 (2m 05s ago)"
    assert rows["attempts"] == "3   preemptions 2   spot notices 1"


def test_placement_rows_show_where_the_run_is_and_each_move():
    placement = {"active": 1, "since": "2026-12-04T10:00:00.000+00:00", "moves": [
        {"from": 0, "to": 1, "from_placement": "aws us-east-1", "to_placement": "aws us-west-2", "step": 30,
         "time": "2026-12-04T10:00:00.000+00:00", "reason": "no capacity", "done": True},
        {"from": 1, "to": 0, "time": "2026-12-04T11:00:00", "reason": "asked"}, "not a move"]}
    assert status.placement_lines(placement) == [
        ("placement", "1 (aws us-west-2) since 2026-12-04 10:00:00"),
        ("moved", "2026-12-04 10:00:00 aws us-east-1 -> aws us-west-2 at step 30: no capacity"),
        ("moved", "2026-12-04 11:00:00 1 -> 0 (under way): asked"),
    ]
    assert status.placement_lines({}) == [("placement", "0")]
    assert status.placement_lines({"active": 0, "moves": [{"to": 0, "to_placement": "gcp us-central1",
                                                           "step": "7"}]}) == [
        ("placement", "0 (gcp us-central1)"), ("moved", " None -> gcp us-central1 (under way): ")]
    assert status.placement_lines(None) == [] and status.placement_lines([1]) == []
    shown = _shown(RunStatus("r", "RUNNING", placement=placement))
    assert "placement   1 (aws us-west-2) since 2026-12-04 10:00:00" in shown
    assert "moved       2026-12-04 11:00:00 1 -> 0 (under way): asked" in shown


def test_the_group_rows_say_its_machines_failures_and_notes():
    rows = _shown(RunStatus("r", runstate.NOT_STARTED, machines_running=1, machines_desired=2,
                            launch_failures=["12:05 no capacity", "11:05 quota"], group_note="group not read: x",
                            waiting="every placement failed"))
    assert rows[3:9] == [
        "waiting        the run cannot train anywhere now: every placement failed",
        "machines       1 of 2 running",
        "launch failed  12:05 no capacity",
        "launch failed  11:05 quota",
        "group          group not read: x",
        "checkpoint     none committed yet",
    ]
    assert _rows(RunStatus("r", "RUNNING", machines_running=0))["machines"] == "0 running"


def test_the_cost_row_and_each_placements_share():
    st = RunStatus("r", "RUNNING", machine_hours=2.5, cost_usd=1234.5, cost_note="spot estimate", placement_costs=[
        {"placement": "aws us-east-1", "machine_hours": 2.0, "cost_usd": 1000.0, "attempts": 1},
        {"placement": "aws us-west-2", "machine_hours": None, "cost_usd": None, "attempts": 2}])
    assert status.cost_text(st) == "$1,234.50 so far for 2h 30m machine time (spot estimate)"
    assert status.placement_cost_lines(st) == ["aws us-east-1: $1,000.00 for 2h 00m machine time, 1 attempt",
                                               "aws us-west-2: no price for 0s machine time, 2 attempts"]
    shown = _shown(st)
    at = shown.index("cost        $1,234.50 so far for 2h 30m machine time (spot estimate)")
    assert shown[at + 1:at + 3] == ["            aws us-east-1: $1,000.00 for 2h 00m machine time, 1 attempt",
                                    "            aws us-west-2: no price for 0s machine time, 2 attempts"]
    one = RunStatus("r", layout.COMPLETE, machine_hours=0.5, cost_usd=2.0, placement_costs=st.placement_costs[:1])
    assert status.cost_text(one) == "$2.00 for 30m 00s machine time"
    assert status.placement_cost_lines(one) == []
    assert status.cost_text(RunStatus("r", "RUNNING", machine_hours=0.5)) == (
        "30m 00s machine time (no price recorded with the run)")
    assert status.cost_text(RunStatus("r", "RUNNING")) == "" and "cost" not in _rows(RunStatus("r", "RUNNING"))


@pytest.mark.parametrize(("checkpoint", "shown"), [
    (Checkpoint(130, "2026-12-04T10:00:00", 65.0), "step 130, 1m 05s ago"), (Checkpoint(130, None, None), "step 130"),
    (Checkpoint(0, None, 0.0), "step 0, 0s ago"),
])
def test_the_newest_checkpoint_and_its_age(checkpoint, shown):
    assert _rows(RunStatus("r", "RUNNING", checkpoint=checkpoint))["checkpoint"] == shown


def test_a_finished_runs_model_signature_follows_the_checkpoint():
    end = {"signature": {"endpoint": "serving_default",
                         "inputs": {"x": {"dtype": "float32", "shape": [None, 28, 28]}},
                         "outputs": {"y": {"dtype": "float32", "shape": [None, 10]}}}}
    shown = _shown(RunStatus("r", layout.COMPLETE, end=end, checkpoint=Checkpoint(5, None, None)))
    assert shown[-3:] == ["checkpoint  step 5", "model       SavedModel endpoint serving_default(x float32[?, 28, 28])",
                          "returns     y float32[?, 10]"]


def test_each_event_is_a_line_of_its_clock_name_and_fields():
    assert status._event_line({"event": "checkpoint", "time": "2026-12-04T10:11:12.345+00:00", "attempt": 2,
                               "step": 130}) == "10:11:12 checkpoint attempt=2 step=130"
    assert status._event_line({"time": "10:11"}) == "10:11 ? "
    assert status._event_line({"event": "x", "time": "2026-12-04T10:11:1"}) == "2026-12-04T10:11:1 x "
    long = status._event_line({"event": "failed", "time": "2026-12-04T10:11:12", "reason": "r" * 200})
    assert long == ("10:11:12 failed reason=" + "r" * 200)[:107] + "..." and len(long) == 110
    exact = {"event": "e", "time": "2026-12-04T10:11:12", "k": "v" * 97}
    assert status._event_line(exact) == "10:11:12 e k=" + "v" * 97 and len(status._event_line(exact)) == 110
    st = RunStatus("r", "RUNNING", events=[{"event": "started", "time": "2026-12-04T10:00:00"},
                                           {"event": "resumed", "time": "2026-12-04T10:05:00", "step": 3}])
    shown = _shown(st)
    assert shown[-2:] == ["events      10:00:00 started", "            10:05:00 resumed step=3"]


def test_the_metrics_text_sorts_by_name():
    assert status.metrics_text({"b": 1.0, "a": 0.123456}) == "a 0.1235   b 1"


# -- the group, with --stack -----------------------------------------------------------


def test_a_run_not_started_while_its_group_fails_to_launch_says_why():
    group = hosts.GroupState(running=0, desired=1, launch_failures=("12:05 no capacity", "11:05 quota"))
    st = status.with_group(RunStatus("r", runstate.NOT_STARTED, detail="nothing written yet"), group)
    assert (st.machines_running, st.machines_desired, st.launch_failures) == (0, 1, ["12:05 no capacity",
                                                                                      "11:05 quota"])
    assert st.detail == "the group cannot launch a machine: 12:05 no capacity"
    for running, state, failures in [(1, runstate.NOT_STARTED, ("x",)), (0, "RUNNING", ("x",)),
                                     (0, runstate.NOT_STARTED, ())]:
        st = status.with_group(RunStatus("r", state, detail="as it was"), hosts.GroupState(running, 1, failures))
        assert st.detail == "as it was"


def _stack_args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"stack": "dev", "run_uri": None, "events": 0, **kw})


@pytest.fixture
def groups(monkeypatch):
    """The stack's home group and a placement's group, recording which was read."""
    read = []
    monkeypatch.setattr(hosts, "stack_group_state",
                        lambda stack: read.append(("home", stack)) or hosts.GroupState(1, 1, ()))
    monkeypatch.setattr(hosts, "placement_group_state",
                        lambda stack, i: read.append((i, stack)) or hosts.GroupState(2, 2, ()))
    return read


def _cloud_run(tmp_path, monkeypatch, kind: str = "running", placement: dict | None = None):
    """A run folder on disk that `ops status` reads as if it were at s3://b/runs/r."""
    uri = f"file://{tmp_path}/b/runs/r"
    store = open_store(uri)
    build(kind, store, tmp_path / "build")
    if placement is not None:
        store.put_bytes(layout.PLACEMENT_KEY, json.dumps(placement).encode())
    monkeypatch.setattr(status, "read_status", lambda u, **kw: READ_STATUS(uri, **kw))
    return "s3://b/runs/r"


def test_the_stack_reads_its_home_group_until_a_move_then_the_placements(tmp_path, monkeypatch, groups):
    uri = _cloud_run(tmp_path, monkeypatch)
    assert status._snapshot(uri, _stack_args()).machines_running == 1
    uri = _cloud_run(tmp_path / "moved", monkeypatch, placement={"active": 2, "moves": []})
    assert status._snapshot(uri, _stack_args()).machines_running == 2
    uri = _cloud_run(tmp_path / "home", monkeypatch, placement={"active": 0})
    status._snapshot(uri, _stack_args())
    assert groups == [("home", "dev"), (2, "dev"), ("home", "dev")]


def test_no_group_is_read_for_a_run_given_by_uri_a_local_run_or_one_that_ended(tmp_path, monkeypatch, groups):
    uri = _cloud_run(tmp_path, monkeypatch)
    status._snapshot(uri, _stack_args(stack=None, run_uri=uri))
    local = f"file://{tmp_path}/local/runs/r"
    build("running", open_store(local), tmp_path / "local-build")
    monkeypatch.undo()
    status._snapshot(local, _stack_args())
    ended = _cloud_run(tmp_path / "ended", monkeypatch, kind="complete")
    status._snapshot(ended, _stack_args())
    assert groups == []


def test_a_group_that_cannot_be_read_is_a_note_not_a_failure(tmp_path, monkeypatch):
    uri = _cloud_run(tmp_path, monkeypatch)

    def refused(stack):
        raise hosts.HostsError("cannot read the group g: AccessDenied")

    monkeypatch.setattr(hosts, "stack_group_state", refused)
    st = status._snapshot(uri, _stack_args())
    assert (st.state, st.group_note, st.machines_running) == ("RUNNING", "group not read: cannot read the group g: "
                                                                         "AccessDenied", None)


def test_a_run_given_by_uri_must_exist_one_of_a_stack_need_not(tmp_path, monkeypatch, groups):
    uri = f"file://{tmp_path}/nothing/runs/r"
    with pytest.raises(status.NoRun):
        status._snapshot(uri, _stack_args(stack=None, run_uri=uri))
    assert status._snapshot(uri, _stack_args()).state == runstate.NOT_STARTED


# -- the command ---------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "code"), [
    ("RUNNING", 0), (layout.COMPLETE, 0), (layout.CANCELLED, 0), (layout.FAILED, 1), (layout.TIMED_OUT, 1),
    (runstate.STALLED, 3), (runstate.STOPPED, 0), (runstate.NOT_STARTED, 0), (runstate.PREEMPTED, 0),
])
def test_each_state_has_its_exit_status(state, code):
    assert status.exit_code(RunStatus("r", state)) == code


def test_status_prints_the_report_or_json_and_exits_with_the_runs_status(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    uri = f"file://{tmp_path}/b/runs/r"
    build("failed", open_store(uri), tmp_path / "build")
    assert main(["status", "--run-uri", uri]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["run", uri]
    assert main(["status", "--run-uri", uri, "--json", "--events", "2"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["state"] == "FAILED" and len(doc["events"]) == 2
    assert main(["status", "--run-uri", uri, "--json", "--events", "0"]) == 1
    assert json.loads(capsys.readouterr().out)["events"] == []
    assert main(["status", "--run-uri", uri, "--json"]) == 1
    assert len(json.loads(capsys.readouterr().out)["events"]) == runstate.DEFAULT_EVENTS


@pytest.mark.parametrize(("raised", "rc", "err"), [
    (ValueError("unsupported scheme 'ftp'"), 2, "ops status: unsupported scheme 'ftp'\n"),
    (status.NoRun("no run at x"), 2, "ops status: no run at x\n"),
    (KeyboardInterrupt(), 130, ""),
    (PermissionError("Access Denied"), 2, "ops status: cannot read the run at s3://b/runs/r: PermissionError: "
                                          "Access Denied\n"),
])
def test_a_read_that_fails_is_one_line_and_its_exit_status(monkeypatch, capsys, raised, rc, err):
    def fails(*_a, **_k):
        raise raised

    monkeypatch.setattr(status, "read_status", fails)
    assert main(["status", "--run-uri", "s3://b/runs/r"]) == rc
    assert capsys.readouterr() == ("", err)
    assert main(["status", "--run-uri", "s3://b/runs/r", "--watch", "--json"]) == rc


def test_a_stack_pulumi_cannot_read_is_one_line(tmp_path, monkeypatch, capsys):
    fake_pulumi(tmp_path / "bin", None, rc=255, stderr="error: no stack named 'dev' found")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert main(["status", "--stack", "dev"]) == 2
    assert capsys.readouterr() == ("", "ops status: pulumi stack output --stack dev failed: error: no stack named "
                                       "'dev' found\n")


def test_a_read_that_fails_mid_watch_keeps_the_last_snapshot_and_says_so(tmp_path, capsys, monkeypatch):
    uri = f"file://{tmp_path}/b/runs/r"
    build("running", open_store(uri), tmp_path / "build")
    previous = RunStatus(uri, "RUNNING", step=5)
    real = status._snapshot

    def blip(*_a, **_k):
        raise ConnectionError("reset by peer")

    monkeypatch.setattr(status, "_snapshot", blip)
    assert status._reread(uri, None, _stack_args(), previous) is previous
    assert capsys.readouterr().err == "ops status: could not read the run (ConnectionError: reset by peer); retrying\n"
    monkeypatch.setattr(status, "_snapshot", real)
    assert status._reread(uri, open_store(uri), _stack_args(stack=None, run_uri=uri), previous).step == 130


def test_a_json_watch_prints_one_object_per_refresh_until_the_end(tmp_path, capsys, monkeypatch):
    uri = f"file://{tmp_path}/b/runs/r"
    store = open_store(uri)
    build("resumed", store, tmp_path / "build")
    reads = []
    real = status._snapshot

    def snapshot(u, args, st=None):
        reads.append(u)
        if len(reads) == 3:
            store.put_bytes(layout.CANCELLED, json.dumps({"step": 420, "reason": "ops stop"}).encode())
        return real(u, args, st)

    monkeypatch.setattr(status, "_snapshot", snapshot)
    assert main(["status", "--run-uri", uri, "--watch", "--json", "--interval", "0.01"]) == 0
    states = [json.loads(line)["state"] for line in capsys.readouterr().out.splitlines()]
    assert states == ["RUNNING", "RUNNING", "CANCELLED"]


def test_a_watch_on_a_terminal_redraws_until_the_end(tmp_path, monkeypatch):
    uri = f"file://{tmp_path}/b/runs/r"
    store = open_store(uri)
    build("resumed", store, tmp_path / "build")
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True, color_system=None)
    real = status._snapshot
    reads = []

    def snapshot(u, args, st=None):
        reads.append(u)
        if len(reads) == 2:
            store.put_bytes(layout.CANCELLED, json.dumps({"step": 420, "reason": "ops stop"}).encode())
        return real(u, args, st)

    monkeypatch.setattr(status, "_snapshot", snapshot)
    st = status._watch(uri, argparse.Namespace(json=False, interval=0.01, events=2, run_uri=uri), console)
    assert st.state == "CANCELLED" and len(reads) == 2
    text = out.getvalue()
    assert text.index("RUNNING") < text.index("CANCELLED")


def test_status_arguments_and_their_defaults(capsys, monkeypatch):
    parser = OpsParser(prog="python -m ops")
    status.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["status", "--run-uri", "s3://b/runs/r"])
    assert (args.func, args.watch, args.interval, args.json, args.events, args.stack) == (
        status.cmd_status, False, 5.0, False, runstate.DEFAULT_EVENTS, None)
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        parser.parse_args(["status", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for line in ["--stack STACK stack name: the run URI comes from its outputs (pulumi CLI)",
                 "--run-uri RUN_URI the run's URI: s3://B/runs/ID, gs://B/runs/ID or file:///...",
                 "--watch refresh until the run ends, stalls, or (a local run) stops",
                 "--interval INTERVAL seconds between refreshes with --watch (default: 5.0)",
                 "--json print one JSON object (one per refresh with --watch)",
                 f"--events EVENTS how many recent events (default: {runstate.DEFAULT_EVENTS})"]:
        assert line in text, line
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert " where a run stands: state, progress, attempts, checkpoints, events " in " ".join(capsys.readouterr().out.split()) + " "
    for argv, error in [(["status"], "one of the arguments --stack --run-uri is required"),
                        (["status", "--stack", "d", "--interval", "0"], "argument --interval: '0': must be more than 0"),
                        (["status", "--stack", "d", "--events", "-1"], "argument --events: '-1': must be 0 or more")]:
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        assert error in capsys.readouterr().err


# -- --watch, over a scripted sequence of readings ---------------------------------------------


class _Readings:
    """`_snapshot` replaced by a script of statuses (an exception is raised as a failed read); it records
    the store each read was given."""

    def __init__(self, monkeypatch, *script) -> None:
        self.script, self.stores = list(script), []
        monkeypatch.setattr(status, "_snapshot", self)
        self.opened = []
        from runfolder import storage

        monkeypatch.setattr(storage, "open_store", lambda uri: self.opened.append(uri) or object())
        monkeypatch.setattr(status.time, "sleep", lambda s: None)

    def __call__(self, uri, args, store=None):
        self.stores.append(store)
        got = self.script.pop(0)
        if isinstance(got, Exception):
            raise got
        return got


EVENT_SECOND = {"started": 0, "checkpoint": 1, "a": 2, "b": 3, "finished": 4}


def _st(state: str, step: int, *events: str) -> RunStatus:
    return RunStatus("s3://b/runs/r", state, step=step, total=1000,
                     events=[{"event": e, "time": f"2026-12-04T10:00:{EVENT_SECOND[e]:02d}"} for e in events])


def _watch_args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"json": False, "interval": 5.0, "events": 3, "run_uri": "s3://b/runs/r", **kw})


@pytest.mark.parametrize("mode", ["json", "terminal", "log"])
def test_a_watch_opens_one_client_for_all_its_reads_and_rides_out_a_failed_read(monkeypatch, capsys, mode):
    readings = _Readings(monkeypatch, _st("RUNNING", 400, "started"), ConnectionError("reset"),
                         _st("RUNNING", 700, "started"), _st(layout.COMPLETE, 1000, "started", "finished"))
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=mode == "terminal", color_system=None)
    st = status._watch("s3://b/runs/r", _watch_args(json=mode == "json"), console)
    assert st.state == layout.COMPLETE and readings.script == []
    assert readings.opened == ["s3://b/runs/r"] and len(readings.stores) == 4
    assert all(s is not None and s is readings.stores[0] for s in readings.stores)
    printed, err = capsys.readouterr()
    said = "ops status: could not read the run (ConnectionError: reset); retrying"
    # (Rich's live display takes over stderr while it draws, and prints the line above it.)
    assert said in (out.getvalue() if mode == "terminal" else err)
    if mode == "json":
        # One line per refresh: the failed read repeats the last snapshot.
        assert [json.loads(line)["step"] for line in printed.splitlines()] == [400, 400, 700, 1000]
    else:
        shown = out.getvalue()
        assert shown.index("400/1000") < shown.index("700/1000") < shown.index("1000/1000")


def test_a_json_watch_flushes_each_snapshot_for_a_pipe(monkeypatch):
    _Readings(monkeypatch, _st("RUNNING", 400), _st("RUNNING", 700), _st(layout.COMPLETE, 1000))
    lines, flushed = [], []

    class Pipe:
        def write(self, text: str) -> None:
            lines.append(text)

        def flush(self) -> None:
            flushed.append(len("".join(lines).splitlines()))

    monkeypatch.setattr("sys.stdout", Pipe())
    status._watch("s3://b/runs/r", _watch_args(json=True), Console(file=io.StringIO()))
    assert flushed[:3] == [1, 2, 3]  # each line is out before the next wait


def test_a_log_file_gets_a_snapshot_only_when_the_state_step_or_newest_event_changes(monkeypatch):
    _Readings(monkeypatch,
              _st("RUNNING", 400, "started"),
              _st("RUNNING", 400, "started"),                 # nothing new: not printed
              _st("RUNNING", 400, "started", "checkpoint"),   # a new event
              _st("RUNNING", 400, "started", "checkpoint"),
              _st("RUNNING", 400, "checkpoint", "a"),         # as many events, the newest new
              _st("RUNNING", 400, "checkpoint", "a"),
              _st(layout.COMPLETE, 400, "checkpoint", "a"))   # the end, same step and events
    out = io.StringIO()
    st = status._watch("s3://b/runs/r", _watch_args(), Console(file=out, width=120, color_system=None))
    assert st.state == layout.COMPLETE
    snapshots = out.getvalue().split("\n\n")
    assert len(snapshots) == 4
    assert ["10:00:01 checkpoint" in s for s in snapshots] == [False, True, True, True]
    assert ["10:00:02 a" in s for s in snapshots] == [False, False, True, True]
    assert "COMPLETE" in snapshots[3] and "COMPLETE" not in snapshots[2]


def test_a_terminal_watch_draws_every_new_snapshot_not_only_the_last(monkeypatch):
    _Readings(monkeypatch, _st("RUNNING", 400), _st("RUNNING", 700), _st(layout.CANCELLED, 800))
    out = io.StringIO()
    status._watch("s3://b/runs/r", _watch_args(), Console(file=out, width=120, force_terminal=True,
                                                          color_system=None))
    text = out.getvalue()
    assert text.index("400/1000") < text.index("700/1000") < text.index("CANCELLED")


def test_the_labels_are_bold_and_whole_and_the_state_in_its_colour():
    st = RunStatus("r", "RUNNING", launch_failures=["12:05 no capacity in any zone of the region right now"])
    out = io.StringIO()
    Console(file=out, width=120, force_terminal=True, color_system="standard").print(status.render(st))
    assert "\x1b[1mrun" in out.getvalue() and "\x1b[1;36mRUNNING" in out.getvalue()
    narrow = io.StringIO()
    Console(file=narrow, width=20, color_system=None).print(status.render(st))
    assert "launch failed" in narrow.getvalue()  # a label is never wrapped, however narrow the terminal


ANSI_RE = __import__("re").compile(r"\x1b\[[0-9;]*m")


@pytest.mark.parametrize(("hours", "shown"), [(0.50011111, "30m 00s"), (0.50025, "30m 01s")])
def test_machine_time_is_hours_times_3600_seconds(hours, shown):
    st = RunStatus("r", "RUNNING", machine_hours=hours, cost_usd=1.0, placement_costs=[
        {"placement": "a", "machine_hours": hours, "cost_usd": 1.0, "attempts": 1},
        {"placement": "b", "machine_hours": hours, "cost_usd": 1.0, "attempts": 1}])
    assert status.cost_text(st) == f"$1.00 so far for {shown} machine time"
    assert status.placement_cost_lines(st)[0] == f"a: $1.00 for {shown} machine time, 1 attempt"


def test_an_event_without_a_time_or_of_111_characters():
    assert status._event_line({"event": "x", "k": 1}) == " x k=1"
    line = {"event": "e", "time": "2026-12-04T10:11:12", "k": "v" * 98}
    assert status._event_line(line) == ("10:11:12 e k=" + "v" * 98)[:107] + "..."


@pytest.mark.parametrize("scheme", ["s3://", "gs://"])  # whole schemes: the mutation run leaves out cases named "s3"
def test_a_stacks_run_on_either_cloud_reads_its_group(tmp_path, monkeypatch, groups, scheme):
    _cloud_run(tmp_path, monkeypatch)
    status._snapshot(f"{scheme}b/runs/r", _stack_args())
    assert groups == [("home", "dev")]


def test_a_placement_record_without_an_active_one_is_home(tmp_path, monkeypatch, groups):
    uri = _cloud_run(tmp_path, monkeypatch, placement={"moves": []})
    status._snapshot(uri, _stack_args())
    assert groups == [("home", "dev")]


def test_a_snapshot_reads_through_the_store_it_is_given(tmp_path):
    uri = f"file://{tmp_path}/b/runs/r"
    build("running", open_store(uri), tmp_path / "build")
    fetched = []

    class Recording:
        def __init__(self, store) -> None:
            self.store, self.uri = store, store.uri

        def __getattr__(self, name: str):
            return getattr(self.store, name)

        def get_bytes(self, key: str) -> bytes:
            fetched.append(key)
            return self.store.get_bytes(key)

    st = status._snapshot(uri, _stack_args(stack=None, run_uri=uri), Recording(open_store(uri)))
    assert st.state == "RUNNING" and "progress.json" in fetched


def test_a_watch_in_a_log_file_prints_the_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    uri = f"file://{tmp_path}/b/runs/r"
    build("complete", open_store(uri), tmp_path / "build")
    assert main(["status", "--run-uri", uri, "--watch", "--interval", "0.01"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["run", uri] and "COMPLETE" in out


def test_warnings_are_red_and_notes_dim():
    st = RunStatus("r", runstate.NOT_STARTED, waiting="every placement failed", launch_failures=["12:05 no capacity"],
                   group_note="group not read: x")
    out = io.StringIO()
    Console(file=out, width=160, force_terminal=True, color_system="standard").print(status.render(st))
    text = out.getvalue()
    assert "\x1b[1;31mthe run cannot train anywhere now: every placement failed" in text
    assert "\x1b[31m12:05 no capacity" in text and "\x1b[2mgroup not read: x" in text


def test_a_long_event_is_cut_to_the_terminal_not_wrapped():
    st = RunStatus("r", "RUNNING", events=[{"event": "failed", "time": "2026-12-04T10:11:12", "reason": "r" * 90}])
    out = io.StringIO()
    Console(file=out, width=60, color_system=None).print(status.render(st))
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("events      10:11:12 failed reason=rrr") and last.rstrip().endswith("…")
    assert len(out.getvalue().splitlines()) == 5


def test_a_full_bar_then_one_space_then_the_figures():
    assert _shown(RunStatus("r", layout.COMPLETE, step=1000, total=1000))[2] == (
        "progress    " + "━" * 36 + " 1000/1000 (100.0%)")
    assert len(_shown(RunStatus("r", layout.COMPLETE, step=1000, total=1000))) == 5


def test_a_run_folder_holding_only_a_stray_file_has_not_started(tmp_path):
    uri = f"file://{tmp_path}/b/runs/r"
    open_store(uri).put_bytes("notes.txt", b"mine")
    assert status.read_status(uri, must_exist=True).state == runstate.NOT_STARTED
    with pytest.raises(status.NoRun) as e:
        status.read_status(f"file://{tmp_path}/b/runs/none", must_exist=True)
    assert str(e.value) == (f"no run at file://{tmp_path}/b/runs/none: nothing is stored there (check the URI, or "
                            "give --stack for a stack whose machine is still booting)")


def test_a_listing_reads_the_checkpoint_without_its_marker(tmp_path):
    uri = f"file://{tmp_path}/b/runs/r"
    build("running", open_store(uri), tmp_path / "build")
    full = status.read_status(uri)
    listed = status.read_status(uri, checkpoint_marker=False)
    assert (full.checkpoint.step, listed.checkpoint.step) == (100, 100)
    assert full.checkpoint.created is not None and listed.checkpoint.created is None


def test_the_signature_of_several_inputs_and_odd_shapes():
    end = {"signature": {"inputs": {"a": {"dtype": "int64", "shape": [None]}, "b": {"dtype": "string", "shape": "x"},
                                    "c": "not a spec"}, "outputs": "not specs"}}
    assert status.signature_lines(end) == [("model", "SavedModel endpoint serve(a int64[?], b string[])"),
                                           ("returns", "")]


def test_the_dashboards_reading_fetches_the_checkpoints_marker(tmp_path):
    uri = f"file://{tmp_path}/b/runs/r"
    build("running", open_store(uri), tmp_path / "build")
    facts = status.read_facts(open_store(uri), uri)  # as ops/dashboard/data.py reads a run
    assert facts.checkpoint_step == 100 and facts.checkpoint_marker
