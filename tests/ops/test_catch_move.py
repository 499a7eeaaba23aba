"""`ops move` over a run folder on disk and groups kept in memory: what the operator sees.

`tests/ops/test_move.py` moves runs between moto_server's Auto Scaling groups; here the same
command runs in this process with `controller.clouds.Clouds` given in-memory groups, so each
line it prints, each exit status and each group's size can be checked in milliseconds (and
the mutation run, which leaves the emulators out, can score `ops/move.py`).
"""

from __future__ import annotations

import getpass
import json
import socket
import time

import pytest

from controller import clouds as clouds_module
from controller import record as records
from controller.clouds import CloudError
from controller.record import iso
from controller.tick import CLOCK_SKEW_S
from ops import move as ops_move
from ops.__main__ import main
from runfolder.storage import PreconditionFailed, open_store
from tests.controller.helpers import FakeGroups, moved_events, trained
from tests.ops.test_status import fake_pulumi

GROUPS = {"ts-east": 1, "ts-west": 0, "ts-gcp": 0}


def _document(run_uri: str) -> dict:
    return {"run_uri": run_uri, "nodes": 2, "wait_minutes": 15, "placements": [
        {"cloud": "aws", "region": "us-east-1", "project": None, "group": "ts-east"},
        {"cloud": "aws", "region": "us-west-2", "project": None, "group": "ts-west"},
        {"cloud": "gcp", "region": "us-central1", "project": "ts-proj", "group": "ts-gcp",
         "access": {"gcp_audience": "//iam.googleapis.com/projects/987654321/locations/global/"
                                    "workloadIdentityPools/ts-pool/providers/aws-controller",
                    "service_account": "ts-controller@ts-proj.iam.gserviceaccount.com"}}]}


class Groups(FakeGroups):
    """Both clouds' groups in one dict; each call records the placement it was given."""

    def __init__(self, sizes: dict[str, int]) -> None:
        super().__init__(sizes)
        self.seen = []

    def desired(self, p) -> int:
        self.seen.append(p)
        return super().desired(p)


@pytest.fixture
def groups(monkeypatch) -> Groups:
    """The groups `ops move` reaches: `Clouds(...)` as the command builds it, over memory."""
    groups = Groups(GROUPS)
    made = []
    real = clouds_module.Clouds

    def clouds(*, federate: bool = True):
        made.append(federate)
        return real(aws=groups, gcp=groups, federate=federate)

    monkeypatch.setattr(clouds_module, "Clouds", clouds)
    monkeypatch.setattr(getpass, "getuser", lambda: "ana")
    monkeypatch.setattr(socket, "gethostname", lambda: "laptop")
    groups.made = made
    return groups


@pytest.fixture
def run(tmp_path):
    """A run trained to step 30 on placement 0, preempted (its lease released), and its config file."""
    uri = f"file://{tmp_path}/bucket/runs/r"
    store = open_store(uri)
    trained(store, step=30, last_beat=time.time() - 5)
    config = tmp_path / "placements.json"
    config.write_text(json.dumps(_document(uri)))
    return uri, store, config


def test_move_by_region_sizes_the_groups_records_the_move_and_says_where(groups, run, capsys):
    uri, store, config = run
    rc = main(["move", "--config", str(config), "--to", "us-west-2", "--reason", "cheaper there"])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    assert out == (f"moved {uri} from 0 (aws us-east-1) to 1 (aws us-west-2); it resumes from step 30\n")
    assert groups.sizes == {"ts-east": 0, "ts-west": 2, "ts-gcp": 0}  # nodes: 2
    [event] = moved_events(store)
    assert (event["reason"], event["step"]) == ("asked by ana@laptop (ops move): cheaper there", 30)
    # The operator's own credentials reach every placement: never the function's federation.
    assert groups.made == [False]


def test_move_without_a_reason_records_who_asked(groups, run, capsys):
    uri, store, config = run
    assert main(["move", "--config", str(config), "--to", "1"]) == 0
    [event] = moved_events(store)
    assert event["reason"] == "asked by ana@laptop (ops move)"


def test_move_to_the_other_cloud_reaches_it_without_the_functions_access(groups, run, capsys):
    uri, store, config = run
    assert main(["move", "--config", str(config), "--to", "gcp:us-central1"]) == 0
    assert capsys.readouterr().out.startswith(f"moved {uri} from 0 (aws us-east-1) to 2 (gcp us-central1);")
    assert groups.sizes == {"ts-east": 0, "ts-west": 0, "ts-gcp": 2}
    gcp = [p for p in groups.seen if p.group == "ts-gcp"]
    assert gcp and all(p.access is None for p in gcp)


def test_a_second_move_names_the_placement_it_left(groups, run, capsys):
    uri, store, config = run
    assert main(["move", "--config", str(config), "--to", "1"]) == 0
    capsys.readouterr()
    assert main(["move", "--config", str(config), "--to", "aws:us-east-1"]) == 0
    assert capsys.readouterr().out == (
        f"moved {uri} from 1 (aws us-west-2) to 0 (aws us-east-1); it resumes from step 30\n")
    assert groups.sizes == {"ts-east": 2, "ts-west": 0, "ts-gcp": 0}


def test_a_run_with_no_checkpoint_resumes_from_the_start(groups, tmp_path, capsys):
    uri = f"file://{tmp_path}/bucket/runs/fresh"
    open_store(uri).put_bytes("events.jsonl", b"")
    config = tmp_path / "placements.json"
    config.write_text(json.dumps(_document(uri)))
    assert main(["move", "--config", str(config), "--to", "1"]) == 0
    assert capsys.readouterr().out == (
        f"moved {uri} from 0 (aws us-east-1) to 1 (aws us-west-2); it resumes from the start "
        "(no checkpoint committed yet)\n")


def test_a_live_lease_leaves_the_move_recorded_and_exits_1(groups, run, capsys):
    uri, store, config = run
    until = float(int(time.time()) + 300)  # whole seconds: the lease keeps its expiry to the millisecond
    trained(store, step=30, last_beat=time.time(), lease_released=False, lease_until=until)
    start = time.monotonic()
    rc = main(["move", "--config", str(config), "--to", "1", "--wait", "0.3"])
    took = time.monotonic() - start
    out = capsys.readouterr().out
    assert rc == 1, out
    assert out == (f"the move from 0 (aws us-east-1) to 1 (aws us-west-2) is recorded; the run's lease is held by "
                   f"i-0aaa/1 until {iso(until + CLOCK_SKEW_S)}; aws us-west-2's group starts once it has expired.\n"
                   "  the controller's next tick (or this command again) finishes it\n")
    assert groups.sizes == {"ts-east": 0, "ts-west": 0, "ts-gcp": 0}
    assert records.read(store)[0].pending is not None and moved_events(store) == []
    assert 0.3 <= took < 5  # it waited --wait, not the default 90 s


@pytest.mark.parametrize(("argv", "message"), [
    (["--to", "eu-west-1"], "ops move: no placement is 'eu-west-1'; the placements: 0 (aws us-east-1), "
                            "1 (aws us-west-2), 2 (gcp us-central1) (give the index or cloud:region)"),
    (["--to", "us-east-1"], "ops move: the run is already in placement 0 (aws us-east-1)"),
    (["--to", "0"], "ops move: the run is already in placement 0 (aws us-east-1)"),
])
def test_move_refuses_in_one_line_and_sizes_nothing(groups, run, capsys, argv, message):
    uri, store, config = run
    assert main(["move", "--config", str(config), *argv]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", message + "\n")
    assert groups.sizes == GROUPS and groups.calls == []


def test_move_refuses_an_ended_run(groups, run, capsys):
    uri, store, config = run
    store.put_bytes("COMPLETE", b'{"step": 30}')
    assert main(["move", "--config", str(config), "--to", "1"]) == 2
    assert capsys.readouterr().err == "ops move: the run has ended (COMPLETE); nothing to move\n"
    assert groups.calls == []


def test_a_config_file_that_cannot_be_read_is_named(groups, tmp_path, capsys):
    missing = tmp_path / "nowhere.json"
    assert main(["move", "--config", str(missing), "--to", "1"]) == 2
    assert capsys.readouterr().err == f"ops move: cannot read --config {missing}: No such file or directory\n"


def test_a_config_that_is_not_the_controllers_document_is_refused(groups, tmp_path, capsys):
    bad = tmp_path / "placements.json"
    bad.write_text("[1, 2]")
    assert main(["move", "--config", str(bad), "--to", "1"]) == 2
    assert capsys.readouterr().err == "ops move: TRAINSTACK_PLACEMENTS: expected a JSON object, got list\n"


def test_run_uri_moves_another_run_of_the_stack(groups, run, tmp_path, capsys):
    uri, store, config = run
    other = f"file://{tmp_path}/bucket/runs/otherX"
    trained(open_store(other), step=7, last_beat=time.time() - 5)
    assert main(["move", "--config", str(config), "--run-uri", other + "/", "--to", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"moved {other} from 0 (aws us-east-1) to 1 (aws us-west-2); "
                                              "it resumes from step 7")
    assert moved_events(open_store(other)) and moved_events(store) == []


@pytest.mark.parametrize("as_text", [False, True])
def test_move_through_the_stack_reads_its_placements_output(groups, run, tmp_path, monkeypatch, capsys, as_text):
    uri, store, _config = run
    doc = _document(uri)
    args_file = fake_pulumi(tmp_path / "bin", {"runUri": uri, "placements": json.dumps(doc) if as_text else doc})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{__import__('os').environ['PATH']}")
    assert main(["move", "--stack", "dev", "--to", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"moved {uri} from 0 (aws us-east-1) to 1 (aws us-west-2)")
    assert "--stack\ndev" in args_file.read_text()


def test_a_stack_without_placements_is_refused_in_one_line(groups, tmp_path, monkeypatch, capsys):
    fake_pulumi(tmp_path / "bin", {"runUri": "s3://b/runs/r", "placements": ""})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{__import__('os').environ['PATH']}")
    assert main(["move", "--stack", "dev", "--to", "1"]) == 2
    assert capsys.readouterr().err == ("ops move: stack dev has no placements output: it has one placement, or run "
                                       "`pulumi up` for it first\n")


def test_a_stack_that_pulumi_cannot_read_is_one_line(groups, tmp_path, monkeypatch, capsys):
    fake_pulumi(tmp_path / "bin", None, rc=255, stderr="error: no stack named 'dev' found")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{__import__('os').environ['PATH']}")
    assert main(["move", "--stack", "dev", "--to", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ops move: ") and "no stack named 'dev' found" in err and len(err.splitlines()) == 1


def test_a_group_that_cannot_be_reached_is_one_line(groups, run, monkeypatch, capsys):
    uri, store, config = run

    def refused(p, n):
        raise CloudError(f"placement {p.index} ({p.label}): AccessDenied")

    monkeypatch.setattr(groups, "set_size", refused)
    assert main(["move", "--config", str(config), "--to", "1"]) == 2
    assert capsys.readouterr().err == "ops move: placement 0 (aws us-east-1): AccessDenied\n"


@pytest.mark.parametrize(("raised", "rc", "err"), [
    (PreconditionFailed("placement.json"), 2, "ops move: the controller moved the run meanwhile; "
                                              "see python -m ops status\n"),
    (KeyboardInterrupt(), 130, ""),
])
def test_a_move_the_controller_overtook_or_ctrl_c_ends_with_its_status(groups, run, monkeypatch, capsys, raised, rc,
                                                                      err):
    from controller import tick

    uri, store, config = run

    def overtaken(*_a, **_k):
        raise raised

    monkeypatch.setattr(tick, "move", overtaken)
    assert main(["move", "--config", str(config), "--to", "1"]) == rc
    assert capsys.readouterr() == ("", err)


def test_the_wait_and_reason_reach_the_controllers_move(groups, run, monkeypatch):
    from controller import tick

    uri, store, config = run
    calls = []

    def recorded(config, clouds, to, reason, **kw):
        calls.append((to.index, reason, kw))
        return tick.TickResult(tick.MOVE, reason, move={"from": 0, "to": to.index, "step": 3})

    monkeypatch.setattr(tick, "move", recorded)
    assert main(["move", "--config", str(config), "--to", "2"]) == 0
    assert main(["move", "--config", str(config), "--to", "1", "--wait", "12.5", "--reason", "why"]) == 0
    assert calls == [(2, "asked by ana@laptop (ops move)", {"wait_s": ops_move.DEFAULT_WAIT_S}),
                     (1, "asked by ana@laptop (ops move): why", {"wait_s": 12.5})]
    assert ops_move.DEFAULT_WAIT_S == 90.0


@pytest.mark.parametrize(("argv", "error"), [
    (["--to", "1"], "one of the arguments --stack --config is required"),
    (["--stack", "dev", "--config", "x.json", "--to", "1"], "argument --config: not allowed with argument --stack"),
    (["--config", "x.json"], "the following arguments are required: --to"),
    (["--config", "x.json", "--to", "1", "--wait", "0"], "argument --wait: '0': must be more than 0"),
])
def test_move_arguments_are_checked_before_anything_is_read(groups, capsys, argv, error):
    with pytest.raises(SystemExit) as e:
        main(["move", *argv])
    assert e.value.code == 2
    assert error in capsys.readouterr().err
    assert groups.made == []


def test_move_help_says_what_each_flag_does(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line per flag: argparse wraps at hyphens
    with pytest.raises(SystemExit):
        main(["--help"])
    assert " move the run to another placement of its stack (region or cloud) " in " ".join(capsys.readouterr().out.split()) + " "
    with pytest.raises(SystemExit):
        main(["move", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for line in ["--stack STACK stack name: the placements come from its outputs (pulumi CLI)",
                 "--config CONFIG the controller's configuration document (JSON file)",
                 "--to TO the placement: its index, region, or cloud:region",
                 "--run-uri RUN_URI another run of the stack (default: the configuration's run)",
                 "--reason REASON why, recorded with the move",
                 "--wait WAIT seconds to wait for the old placement's lease to expire (default: 90.0)"]:
        assert line in text, line
