"""The controller's whole answers at 1-3 machines a run: each decision with its reason, where to, the
size it puts the group back to and what holds the run; a tick's writes to the run folder and the
calls it makes on the groups. What `ops status` and the controller's log show comes from these
words, and the boundaries (the wait, the deadline, the launch margin, which failures count since the
last sign of a machine) are where a run moves, ends or stays.

Pure decisions, and ticks over a `file://` run folder with groups kept in memory.
"""

from __future__ import annotations

import json

import pytest

from controller.config import parse
from controller.decide import (
    FINISH,
    LAUNCH_MARGIN_S,
    MOVE,
    STAY,
    TIME_UP,
    Decision,
    GroupState,
    LaunchFailure,
    RunView,
    decide,
    may_launch,
    time_up_reason,
)
from controller.record import Record, iso
from controller.tick import read_deadline, read_run
from runfolder import layout
from runfolder.lease import LeaseRecord
from runfolder.storage import open_store

NOW = 1_800_000_000.0
NO_CAPACITY = ("We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested "
               "(us-east-1a). Launching EC2 instance failed.")
NO_IMAGE = "The image id '[ami-1]' does not exist. Launching EC2 instance failed."
HOME = "aws us-east-1"
WEST = "aws us-west-2"


def _config(nodes: int, *, wait_minutes: int = 15, run_uri: str = "s3://b/runs/r", max_runtime_s: int | None = None):
    return parse({"run_uri": run_uri, "nodes": nodes, "wait_minutes": wait_minutes, "max_runtime_s": max_runtime_s,
                  "placements": [{"cloud": "aws", "region": r, "group": f"g{i}"}
                                 for i, r in enumerate(("us-east-1", "us-west-2", "eu-west-1"))]})


def _short(nodes: int, *failures: tuple[float, str]) -> GroupState:
    """A group asked for ``nodes`` machines with one fewer running, and these failed launches (time, words)."""
    return GroupState(nodes - 1, nodes, tuple(LaunchFailure(t, m) for t, m in failures))


HOUR_AGO = NOW - 3600  # idle 60 min: "60 min" (a wrong unit says 59 or 216000)


@pytest.mark.parametrize("nodes", [1, 2, 3])
@pytest.mark.parametrize(("case", "run", "failures", "wait", "expected"), [
    ("ended", RunView(ended="COMPLETE", heartbeat=HOUR_AGO), [(NOW - 60, NO_CAPACITY)], 15,
     Decision(FINISH, "the run ended (COMPLETE): every group goes to zero")),
    ("deadline now", RunView(heartbeat=HOUR_AGO, deadline=NOW), [(NOW - 60, NO_CAPACITY)], 15,
     Decision(TIME_UP, f"the run's deadline ({iso(NOW)}, its first start + maxRuntimeHours) passed and no machine "
                       "ended it")),
    ("margin now", RunView(heartbeat=HOUR_AGO, deadline=NOW + LAUNCH_MARGIN_S), [(NOW - 60, NO_CAPACITY)], 15,
     Decision(STAY, f"the run's deadline ({iso(NOW + LAUNCH_MARGIN_S)}) is less than 15 min away: no machine is "
                    "started any more")),
    ("nothing yet", RunView(), [], 15, Decision(STAY, f"{HOME}: no machine yet and no failed launch")),
    ("inside the wait", RunView(heartbeat=HOUR_AGO), [(NOW - 60, NO_CAPACITY)], 90,
     Decision(STAY, f"{HOME}: last sign of a training machine 60 min ago (moves after 90 min without one)")),
    ("the wait to the second", RunView(heartbeat=NOW - 15 * 60), [(NOW - 60, NO_CAPACITY)], 15,
     Decision(MOVE, f"no training machine in {HOME} for 15 min; its group cannot launch (capacity): {NO_CAPACITY}",
              to=1)),
    ("moves", RunView(heartbeat=HOUR_AGO), [(NOW - 60, NO_CAPACITY)], 15,
     Decision(MOVE, f"no training machine in {HOME} for 60 min; its group cannot launch (capacity): {NO_CAPACITY}",
              to=1)),
    ("a failure a second before the last sign counts", RunView(heartbeat=HOUR_AGO), [(HOUR_AGO - 1, NO_CAPACITY)], 15,
     Decision(MOVE, f"no training machine in {HOME} for 60 min; its group cannot launch (capacity): {NO_CAPACITY}",
              to=1)),
    ("a failure 1.5 s before it does not", RunView(heartbeat=HOUR_AGO), [(HOUR_AGO - 1.5, NO_CAPACITY)], 15,
     Decision(STAY, f"{HOME}: no training machine for 60 min, but no failed launch")),
    ("another reason", RunView(heartbeat=HOUR_AGO), [(NOW - 60, NO_IMAGE)], 15,
     Decision(STAY, f"{HOME}: no training machine for 60 min, but its launches fail for another reason: {NO_IMAGE}",
              stuck="0:other")),
])
def test_each_decision_says_what_where_and_why(nodes, case, run, failures, wait, expected):
    d = decide(_config(nodes, wait_minutes=wait), Record(), run, _short(nodes, *failures), NOW)

    assert d == expected, case


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_a_placement_the_stack_does_not_have_is_named_and_nothing_moves(nodes):
    run = RunView(heartbeat=HOUR_AGO)

    for active in (3, 4):  # one past the last placement, and further
        d = decide(_config(nodes), Record(active=active), run, _short(nodes, (NOW - 60, NO_CAPACITY)), NOW)

        assert d == Decision(STAY, f"placement.json names placement {active}, which the stack does not have")


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_a_group_sized_back_keeps_saying_what_holds_the_run(nodes):
    # The group stands at none of its machines and fails for a reason no other placement fixes: it
    # is put back to `nodes` and the run is still said to wait.
    group = GroupState(0, 0, (LaunchFailure(NOW - 60, NO_IMAGE),))
    rec = Record(active=1, since=iso(HOUR_AGO))

    d = decide(_config(nodes), rec, RunView(), group, NOW)

    assert d == Decision(STAY, f"{WEST}: no training machine for 60 min, but its launches fail for another reason: "
                               f"{NO_IMAGE}; its group stood at 0 of {nodes}: sized back to {nodes}",
                         size=nodes, stuck="1:other")


def test_no_machine_is_started_from_the_launch_margin_on():
    deadline = NOW + 3600
    assert may_launch(RunView(), NOW) and may_launch(RunView(deadline=deadline), deadline - LAUNCH_MARGIN_S - 1)
    assert not may_launch(RunView(deadline=deadline), deadline - LAUNCH_MARGIN_S)
    assert time_up_reason(deadline).startswith(f"the run's deadline ({iso(deadline)},")


def _event(name: str, at: float, attempt: int = 1, **more) -> str:
    return json.dumps({layout.EVENT: name, layout.TIME: iso(at), layout.ATTEMPT: attempt, **more})


def _lease(store, expires: float, *, released: bool = False) -> None:
    store.put_bytes(layout.LEASE_KEY, LeaseRecord(holder="i-0b/2", token="t", epoch=2, ttl_s=60.0, expires=expires,
                                                  released=released, nonce="n").dump())


def test_the_run_folder_reads_as_its_newest_sign_lease_step_stop_deadline_and_attempts(file_run):
    store = open_store(file_run.uri)
    assert read_run(store) == RunView()  # nothing written yet

    store.put_bytes(layout.PROGRESS_KEY, json.dumps({"step": 30, "updated": iso(NOW - 300)}).encode())
    store.put_bytes(layout.EVENTS_KEY, "\n".join([
        _event(layout.STARTED, NOW - 900), _event(layout.PREEMPTED, NOW - 800, step=20),
        _event(layout.STARTED, NOW - 700, 2), _event(layout.CHECKPOINT, NOW - 120, 2, step=30),
        '{"event": "checkpo']).encode())  # the last line cut short by a machine taken mid-write
    for step in (10, 30):
        store.put_bytes(layout.committed_key(step), b"{}")
    store.put_bytes(f"{layout.checkpoint_dir(50)}/weights.h5", b"...")  # no COMMITTED yet: not a step
    _lease(store, NOW + 45)
    store.put_bytes(layout.STOP_KEY, b'{"reason": "asked"}')
    store.put_bytes(layout.DEADLINE_KEY, b"1800007200\n")

    assert read_run(store) == RunView(ended=None, heartbeat=NOW - 120, lease_until=NOW + 45, step=30, stop=True,
                                      deadline=1_800_007_200.0, attempts=2)

    store.put_bytes(layout.PROGRESS_KEY, json.dumps({"step": 31, "updated": iso(NOW - 10)}).encode())
    _lease(store, NOW + 45, released=True)
    store.put_bytes(layout.CANCELLED, b"{}")
    store.put_bytes(layout.FAILED, b"{}")

    # The newest of progress and events; a released lease holds nothing; the end markers in their order.
    assert read_run(store) == RunView(ended=layout.FAILED, heartbeat=NOW - 10, lease_until=None, step=30, stop=True,
                                      deadline=1_800_007_200.0, attempts=2)


@pytest.mark.parametrize(("progress", "events", "heartbeat", "attempts"), [
    (b"[1, 2]", _event(layout.STARTED, NOW - 60), NOW - 60, 1),  # progress that is not an object: no sign
    (b"{not json", _event(layout.STARTED, NOW - 60), NOW - 60, 1),
    (json.dumps({"updated": iso(NOW - 30)}).encode(), "[1]\n\n" + _event(layout.RESUMED, NOW - 90, step=3), NOW - 30, 0),
    (json.dumps({"updated": "not a time"}).encode(), '"a string"', None, 0),
])
def test_what_a_machine_left_half_written_does_not_hide_the_rest(file_run, progress, events, heartbeat, attempts):
    store = open_store(file_run.uri)
    store.put_bytes(layout.PROGRESS_KEY, progress)
    store.put_bytes(layout.EVENTS_KEY, events.encode())

    run = read_run(store)

    assert (run.heartbeat, run.attempts) == (heartbeat, attempts)


@pytest.mark.parametrize(("text", "deadline"), [
    (b"1800007200\n", 1_800_007_200.0), (b" 1800007200 ", 1_800_007_200.0), (b"\n", None), (b"", None)])
def test_the_deadline_file_reads_as_epoch_seconds(file_run, text, deadline):
    store = open_store(file_run.uri)
    assert read_deadline(store) is None
    store.put_bytes(layout.DEADLINE_KEY, text)

    assert read_deadline(store) == deadline
