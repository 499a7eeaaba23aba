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

from controller import record as records
from controller.clouds import CloudError, Clouds
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
from controller.tick import (
    MoveError,
    end_timed_out,
    ensure_deadline,
    finish_move,
    lease_gone,
    move,
    read_deadline,
    read_run,
    start_move,
    tick,
)
from runfolder import layout
from runfolder.lease import CLOCK_SKEW_S, LeaseRecord
from runfolder.storage import PreconditionFailed, open_store
from tests.controller.helpers import FakeGroups, trained

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
                                      deadline=1_800_007_200.0, attempts=2, progress_at=NOW - 300, progress_step=30)

    store.put_bytes(layout.PROGRESS_KEY, json.dumps({"step": 31, "updated": iso(NOW - 10)}).encode())
    _lease(store, NOW + 45, released=True)
    store.put_bytes(layout.CANCELLED, b"{}")
    store.put_bytes(layout.FAILED, b"{}")

    # The newest of progress and events; a released lease holds nothing; the end markers in their order.
    assert read_run(store) == RunView(ended=layout.FAILED, heartbeat=NOW - 10, lease_until=None, step=30, stop=True,
                                      deadline=1_800_007_200.0, attempts=2, progress_at=NOW - 10, progress_step=31)


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


def _failing_groups(config, nodes: int, message: str = NO_CAPACITY, ago: float = 60) -> FakeGroups:
    """Groups in memory, home at ``nodes``, short a machine and failing for ``message``; the others at zero,
    never tried."""
    return FakeGroups({p.group: nodes if p.index == 0 else 0 for p in config.placements},
                      state=lambda p: _short(nodes, (NOW - ago, message)) if p.index == 0 else GroupState(0, 0))


def _trained(store, last_beat: float) -> None:
    trained(store, step=40, last_beat=last_beat)  # a released lease: nothing holds a move


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_a_ticks_move_is_recorded_carried_out_and_said_once_whole(file_run, nodes):
    config = _config(nodes, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 16 * 60)
    groups = _failing_groups(config, nodes)
    now = NOW + 0.1234  # the record keeps the failure's time to the millisecond
    reason = f"no training machine in {HOME} for 16 min; its group cannot launch (capacity): {NO_CAPACITY}"

    result = tick(config, Clouds(aws=groups), now)

    move = {"from": 0, "to": 1, "from_placement": HOME, "to_placement": WEST, "reason": reason, "step": 40,
            "time": iso(now), "done": True, "done_time": iso(now)}
    assert result.to_json() == {"action": MOVE, "reason": reason, "move": move, "waiting": None, "resized": [
        {"placement": 0, "group": "g0", "size": 0}, {"placement": 1, "group": "g1", "size": nodes}]}
    assert groups.calls == [("g0", 0), ("g1", nodes)]
    rec, _ = records.read(store)
    assert (rec.active, rec.since, rec.moves, rec.failed_at) == (1, iso(now), [move], {"0": round(NOW + 0.123, 3)})
    assert records.read_events(store)[0] == [{
        layout.EVENT: layout.MOVED, layout.TIME: iso(now), layout.ATTEMPT: None, "move": 1, "from": 0, "to": 1,
        "from_placement": HOME, "to_placement": WEST, "reason": reason, "step": 40}]

    groups.calls.clear()
    again = tick(config, Clouds(aws=groups), now + 60)  # the new placement: nothing is running there yet

    assert (again.action, again.resized, again.move, groups.calls) == (STAY, [], None, [])


@pytest.mark.parametrize("nodes", [1, 3])
def test_ops_move_waits_for_the_old_lease_polling_and_then_moves(file_run, nodes):
    config = _config(nodes, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    _lease(store, NOW + 100)  # held until NOW + 115 with the clock-skew margin
    groups = _failing_groups(config, nodes)
    clock, slept = [NOW], []

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s

    result = move(config, Clouds(aws=groups), config.placements[2], "asked", store=store, wait_s=300, poll_s=60,
                  clock=lambda: clock[0], sleep=sleep)

    assert slept == [60, 60] and result.waiting is None, result
    assert groups.sizes == {"g0": 0, "g1": 0, "g2": nodes}
    assert result.move == {"from": 0, "to": 2, "from_placement": HOME, "to_placement": "aws eu-west-1",
                           "reason": "asked", "step": 40, "time": iso(NOW), "done": True, "done_time": iso(NOW + 120)}
    rec, _ = records.read(store)
    assert (rec.active, rec.failed_at) == (2, {})  # an operator's move is not a failure of home


def test_ops_move_gives_up_waiting_at_its_limit_and_says_who_holds_the_lease(file_run):
    config = _config(2, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    _lease(store, NOW + 100)
    groups = _failing_groups(config, 2)
    clock, slept = [NOW], []

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s

    result = move(config, Clouds(aws=groups), config.placements[1], "asked", store=store, wait_s=90, poll_s=60,
                  clock=lambda: clock[0], sleep=sleep)

    assert slept == [60, 30]
    assert result.waiting == (f"the run's lease is held by i-0b/2 until {iso(NOW + 115)}; {WEST}'s group starts once "
                              "it has expired")
    assert result.resized == [] and groups.sizes == {"g0": 0, "g1": 0, "g2": 0}  # home was zeroed by the first try
    assert records.read(store)[0].pending["to"] == 1


def test_ops_move_returns_the_move_a_tick_finished_while_it_waited(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    _lease(store, NOW + 100)
    groups = _failing_groups(config, 1)
    clock = [NOW]

    def sleep(s: float) -> None:  # a tick runs while ops move sleeps, after the lease has gone
        clock[0] += s
        tick(config, Clouds(aws=groups), clock[0] + 60)

    result = move(config, Clouds(aws=groups), config.placements[1], "asked", store=store, wait_s=300, poll_s=60,
                  clock=lambda: clock[0], sleep=sleep)

    assert (result.action, result.reason, result.waiting) == (MOVE, "asked", None)
    assert result.move["done"] and result.move["done_time"] == iso(NOW + 120)
    assert groups.sizes == {"g0": 0, "g1": 1, "g2": 0}


def test_a_move_recorded_near_the_deadline_does_not_start_the_next_group(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 16 * 60)
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) + LAUNCH_MARGIN_S + 10}\n".encode())
    groups = _failing_groups(config, 1)

    result = tick(config, Clouds(aws=groups), NOW, clock=lambda: NOW + 10)  # the margin came while it ran

    assert result.action == MOVE
    assert result.waiting == f"the run's deadline is less than 15 min away: {WEST}'s group is not started"
    assert groups.calls == [("g0", 0)] and records.read_events(store)[0] == []
    assert records.read(store)[0].pending is not None


@pytest.mark.parametrize(("step", "marker_step"), [(None, -1), (40, 40)])
def test_the_controllers_timed_out_marker_is_the_one_a_machine_writes(file_run, step, marker_step):
    config = _config(2, run_uri=file_run.uri, max_runtime_s=3600)
    store = open_store(config.run_uri)
    if step is not None:
        _trained(store, NOW - 600)
    store.put_bytes(layout.EVENTS_KEY, "\n".join(
        _event(layout.STARTED, NOW - 3000 + 10 * a, a) for a in (1, 2, 3)).encode())
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) - 1}\n".encode())
    groups = FakeGroups({"g0": 2, "g1": 0, "g2": 1})

    result = tick(config, Clouds(aws=groups), NOW + 0.5)

    reason = time_up_reason(NOW - 1)
    assert result.to_json() == {
        "action": TIME_UP, "reason": f"{reason}: the controller ended it TIMED_OUT; every group at zero", "move": None,
        "waiting": None, "resized": [{"placement": 0, "group": "g0", "size": 0}, {"placement": 2, "group": "g2", "size": 0}]}
    assert json.loads(store.get_bytes(layout.TIMED_OUT)) == {
        "outcome": layout.TIMED_OUT, layout.MARKER_REASON: reason, "instance": "controller", layout.TIME: iso(NOW + 0.5),
        layout.MARKER_STEP: marker_step, layout.MARKER_ATTEMPTS: 3}
    assert store.get_bytes(layout.DEADLINE_KEY) == f"{int(NOW) - 1}\n".encode()  # the machines' deadline stands


def test_a_timed_out_run_whose_machine_wrote_its_marker_first_keeps_it(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) - 1}\n".encode())
    run = RunView(deadline=NOW - 1)
    groups = FakeGroups({"g0": 1, "g1": 0, "g2": 0})
    store.put_bytes(layout.TIMED_OUT, b'{"instance": "i-0a"}')  # written between the tick's read and its write

    result = end_timed_out(config, Clouds(aws=groups), store, run, "why", NOW)

    assert store.get_bytes(layout.TIMED_OUT) == b'{"instance": "i-0a"}'
    assert result.action == TIME_UP and groups.sizes == {"g0": 0, "g1": 0, "g2": 0}


def test_the_first_tick_writes_the_deadline_only_with_a_cap_and_reads_it_back(file_run):
    store = open_store(file_run.uri)
    uncapped = ensure_deadline(_config(1, run_uri=file_run.uri), store, RunView(step=3), NOW + 0.9)
    assert uncapped == RunView(step=3) and not store.exists(layout.DEADLINE_KEY)

    capped = ensure_deadline(_config(1, run_uri=file_run.uri, max_runtime_s=7200), store, RunView(step=3), NOW + 0.9)

    assert capped == RunView(step=3, deadline=NOW + 7200)
    assert store.get_bytes(layout.DEADLINE_KEY) == f"{int(NOW) + 7200}\n".encode()
    known = RunView(deadline=NOW + 60)
    assert ensure_deadline(_config(1, run_uri=file_run.uri, max_runtime_s=9), store, known, NOW) is known


def test_groups_that_cannot_be_reached_are_each_named_after_the_others_are_zeroed(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    store.put_bytes(layout.COMPLETE, b"{}")

    class Refusing(FakeGroups):
        def desired(self, p) -> int:
            if p.index != 1:
                raise CloudError(f"placement {p.index} refused")
            return super().desired(p)

    groups = Refusing({"g0": 1, "g1": 1, "g2": 1})

    with pytest.raises(CloudError) as e:
        tick(config, Clouds(aws=groups), NOW)

    assert str(e.value) == "placement 0 refused; placement 2 refused"
    assert groups.calls == [("g1", 0)]


class Hooked:
    """A store that calls ``during(n)`` after its n-th read of placement.json (from 1), and ``on_write``
    before each conditional write of it (which may raise in place of the store)."""

    def __init__(self, store, during=None, on_write=None) -> None:
        self._store, self.during, self.on_write, self.reads, self.writes = store, during, on_write, 0, 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    def get_versioned(self, key):
        got = self._store.get_versioned(key)
        if key == layout.PLACEMENT_KEY:
            self.reads += 1
            if self.during:
                self.during(self.reads)
        return got

    def put_bytes_if(self, key, data, *, version):
        if key == layout.PLACEMENT_KEY:
            self.writes += 1
            if self.on_write:
                self.on_write(self.writes, data, version)
        return self._store.put_bytes_if(key, data, version=version)


STALE = (f"{layout.PLACEMENT_KEY} changed (a move) or the run ended while this tick read the run: the next tick "
         "acts on it")
LEFT = f"{layout.PLACEMENT_KEY} changed meanwhile (another move, or the run ended): left to its writer"


@pytest.mark.parametrize("meanwhile", ["ended", "rewritten"])
def test_a_tick_whose_record_changed_while_it_read_sizes_nothing(file_run, meanwhile):
    config = _config(2, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    records.write(store, Record(), None)
    groups = FakeGroups({"g0": 1, "g1": 2, "g2": 0}, state=lambda p: GroupState(1, 1))

    def during(n: int) -> None:
        if n == 1 and meanwhile == "ended":
            store.put_bytes(layout.COMPLETE, b"{}")
        elif n == 1:
            records.write(store, Record(), records.read(store)[1])  # the same record, written again: another version

    result = tick(config, Clouds(aws=groups), NOW, store=Hooked(store, during))

    assert (result.action, result.reason, result.resized, groups.calls) == (STAY, STALE, [], [])


def test_a_tick_whose_move_another_tick_recorded_first_does_nothing_more(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 16 * 60)
    records.write(store, Record(), None)
    groups = _failing_groups(config, 1)

    def first(n: int) -> None:
        if n == 1:
            records.write(store, Record(active=2, since=iso(NOW)), records.read(store)[1])

    result = tick(config, Clouds(aws=groups), NOW, store=Hooked(store, first))

    assert result.to_json() == {"action": STAY, "move": None, "waiting": None, "resized": [],
                                "reason": f"another tick changed {layout.PLACEMENT_KEY} first: it moves the run"}
    assert groups.calls == [] and records.read(store)[0].active == 2


def _pending(config, store, to: int = 1) -> tuple[Record, str]:
    return start_move(config, store, *records.read(store), to, "asked", 40, NOW, failed=False)


def test_a_move_overtaken_after_its_first_steps_does_not_size_its_new_group_up(file_run):
    # finish_move reads placement.json twice: before it zeroes the old group, and again right before the one
    # step that starts machines. Another move recorded between the two must keep the new group at zero.
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)  # a released lease: nothing holds the move between its steps
    groups = FakeGroups({"g0": 1, "g1": 0, "g2": 0})
    rec, version = _pending(config, store)  # 0 -> 1 recorded, not carried out
    reads = []

    def during(n: int) -> None:
        reads.append(n)
        if n == 1:  # right after the first read: an operator's move 1 -> 2 lands
            current, current_version = records.read(store)
            moves = [*current.moves, {"from": 1, "to": 2, "reason": "asked", "step": 40, "time": iso(NOW),
                                      "done": False}]
            records.write(store, Record(active=2, since=iso(NOW), moves=moves), current_version)

    result = finish_move(config, Clouds(aws=groups), Hooked(store, during), rec, version, NOW)

    assert reads == [1, 2]  # the second read is the one right before the new group would be sized up
    assert result.reason == LEFT and ("g1", 1) not in groups.calls and groups.sizes["g1"] == 0
    assert groups.calls == [("g0", 0)] and records.read(store)[0].active == 2


def test_a_recorded_move_another_move_or_the_end_overtook_is_left_to_its_writer(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    groups = FakeGroups({"g0": 1, "g1": 0, "g2": 0})
    rec, version = _pending(config, store)
    _pending(config, store, to=2)  # another move from the same record came after (ops move again)

    result = finish_move(config, Clouds(aws=groups), store, rec, version, NOW)

    assert (result.action, result.reason, result.resized, result.move["to"]) == (MOVE, LEFT, [], 1)
    assert groups.calls == [] and records.read_events(store)[0] == []


def test_a_move_whose_run_ended_while_the_old_group_went_down_starts_nothing(file_run):
    config = _config(2, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    rec, version = _pending(config, store)

    class EndingGroups(FakeGroups):
        def set_size(self, p, n):
            super().set_size(p, n)
            store.put_bytes(layout.COMPLETE, b"{}")  # the old machine's finish path wrote COMPLETE meanwhile

    groups = EndingGroups({"g0": 2, "g1": 0, "g2": 0})

    result = finish_move(config, Clouds(aws=groups), store, rec, version, NOW)

    assert (result.reason, result.waiting) == (LEFT, None)
    assert groups.calls == [("g0", 0)] and records.read_events(store)[0] == []
    assert records.read(store)[0].pending is not None


def test_a_tick_finishes_a_move_another_left_half_done(file_run):
    config = _config(3, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    _pending(config, store, to=2)
    groups = FakeGroups({"g0": 3, "g1": 0, "g2": 0}, state=lambda p: pytest.fail("no decision is asked"))

    result = tick(config, Clouds(aws=groups), NOW + 30)

    assert (result.action, result.reason, result.move["done"], result.move["done_time"]) == (MOVE, "asked", True,
                                                                                              iso(NOW + 30))
    assert groups.calls == [("g0", 0), ("g2", 3)]
    assert [e["move"] for e in records.read_events(store)[0]] == [1]


def test_a_move_marked_done_after_another_writer_touched_the_record_is_marked_once(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    rec, version = _pending(config, store)

    def touch(n: int, data: bytes, at) -> None:
        if n == 1:  # another tick wrote the same pending record (its own nonce) just before us
            records.write(store, records.read(store)[0], at)

    hooked = Hooked(store, on_write=touch)
    result = finish_move(config, Clouds(aws=FakeGroups({"g0": 1, "g1": 0, "g2": 0})), hooked, rec, version, NOW)

    assert hooked.writes == 2 and result.move["done"] and result.move["done_time"] == iso(NOW)
    assert records.read(store)[0].moves == [result.move]


def test_a_move_another_tick_marked_done_first_is_theirs(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    rec, version = _pending(config, store)

    def theirs(n: int, data: bytes, at) -> None:
        if n == 1:
            done, _ = records.read(store)
            done.moves[-1] = {**done.moves[-1], "done": True, "done_time": "theirs"}
            records.write(store, done, at)

    hooked = Hooked(store, on_write=theirs)
    result = finish_move(config, Clouds(aws=FakeGroups({"g0": 1, "g1": 0, "g2": 0})), hooked, rec, version, NOW)

    assert hooked.writes == 1 and result.move["done_time"] == "theirs"
    assert records.read(store)[0].moves == [result.move]


def test_a_record_that_keeps_changing_fails_the_tick_after_the_move_is_carried_out(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    rec, version = _pending(config, store)

    def touch(n: int, data: bytes, at) -> None:
        records.write(store, records.read(store)[0], records.read(store)[1])

    hooked = Hooked(store, on_write=touch)
    groups = FakeGroups({"g0": 1, "g1": 0, "g2": 0})

    with pytest.raises(PreconditionFailed, match=f"^{layout.PLACEMENT_KEY} kept changing while the move was marked "
                                                 "done$"):
        finish_move(config, Clouds(aws=groups), hooked, rec, version, NOW)

    assert hooked.writes == records.CONFLICT_TRIES and groups.sizes == {"g0": 0, "g1": 1, "g2": 0}
    assert records.read(store)[0].pending is not None  # the next tick marks it


def test_the_run_waiting_is_said_with_the_placement_and_its_cause(file_run):
    config = _config(2, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60 * 60)
    records.write(store, Record(active=1, since=iso(NOW - 60 * 60)), None)
    groups = FakeGroups({"g0": 0, "g1": 1, "g2": 0}, state=lambda p: GroupState(0, 1, (LaunchFailure(NOW, NO_IMAGE),)))

    result = tick(config, Clouds(aws=groups), NOW)

    assert result.reason == (f"{WEST}: no training machine for 60 min, but its launches fail for another reason: "
                             f"{NO_IMAGE}; its group stood at 1 of 2: sized back to 2")
    assert groups.calls == [("g1", 2)]  # sized back to nodes; the others stay at zero
    assert records.read_events(store)[0] == [{layout.EVENT: layout.CONTROLLER_WAITING, layout.TIME: iso(NOW),
                                              layout.ATTEMPT: None, "reason": result.reason, "placement": WEST,
                                              "key": "1:other"}]


def test_a_record_naming_a_placement_the_stack_lost_touches_no_group(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    records.write(store, Record(active=3), None)
    groups = FakeGroups({"g0": 1, "g1": 0, "g2": 0}, state=lambda p: pytest.fail("no group is read"))

    result = tick(config, Clouds(aws=groups), NOW)

    assert (result.action, result.reason, groups.calls) == (
        STAY, f"{layout.PLACEMENT_KEY} names placement 3, which the stack does not have", [])


@pytest.mark.parametrize(("setup", "to", "says"), [
    ("ended", 1, "the run has ended (CANCELLED); nothing to move"),
    ("past", 1, f"the run's deadline ({iso(NOW)}) has passed: the controller's next tick ends the run TIMED_OUT; "
                "nothing to move"),
    ("near", 1, f"the run's deadline ({iso(NOW + 600)}) is less than 15 min away: a machine started now would be "
                "stopped by the cap before it trained; nothing to move"),
    ("here", 0, "the run is already in placement 0 (aws us-east-1)"),
    ("under way", 1, "a move to placement 2 is under way; run this again once it is done"),
])
def test_ops_move_refuses_what_it_cannot_do_and_says_why(file_run, setup, to, says):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    if setup == "ended":
        store.put_bytes(layout.CANCELLED, b"{}")
    if setup in ("past", "near"):
        store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) + (0 if setup == 'past' else 600)}\n".encode())
    if setup == "under way":
        _pending(config, store, to=2)
    before = store.exists(layout.PLACEMENT_KEY) and records.read(store)
    groups = FakeGroups({"g0": 1, "g1": 0, "g2": 0})

    with pytest.raises(MoveError) as e:
        move(config, Clouds(aws=groups), config.placements[to], "asked", store=store, clock=lambda: NOW)

    assert str(e.value) == says and groups.calls == []
    assert (store.exists(layout.PLACEMENT_KEY) and records.read(store)) == before


class WrittenFirst:
    """A store on which a machine writes ``key`` (``theirs``) right before the controller's own
    conditional write of it, as a machine's finish path or first boot does between a tick's read and write."""

    def __init__(self, store, key: str, theirs: bytes) -> None:
        self._store, self.key, self.theirs = store, key, theirs

    def __getattr__(self, name):
        return getattr(self._store, name)

    def put_bytes_if(self, key, data, *, version):
        if key == self.key:
            self._store.put_bytes(key, self.theirs)
        return self._store.put_bytes_if(key, data, version=version)


def test_a_marker_a_machine_wrote_between_the_ticks_read_and_write_stands(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = WrittenFirst(open_store(config.run_uri), layout.TIMED_OUT, b'{"instance": "i-0a"}')
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW)}\n".encode())
    groups = FakeGroups({"g0": 1, "g1": 0, "g2": 0})

    result = tick(config, Clouds(aws=groups), NOW, store=store)  # at the deadline to the second: timed out

    assert result.action == TIME_UP and store.get_bytes(layout.TIMED_OUT) == b'{"instance": "i-0a"}'
    assert groups.sizes == {"g0": 0, "g1": 0, "g2": 0}


def test_a_deadline_a_machine_wrote_between_the_ticks_read_and_write_is_the_runs(file_run):
    store = WrittenFirst(open_store(file_run.uri), layout.DEADLINE_KEY, b"1800000900\n")

    run = ensure_deadline(_config(1, run_uri=file_run.uri, max_runtime_s=7200), store, RunView(), NOW)

    assert run.deadline == 1_800_000_900.0 and store.get_bytes(layout.DEADLINE_KEY) == b"1800000900\n"


def test_an_ended_runs_tick_says_so_and_zeroes_every_group(file_run):
    config = _config(2, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    store.put_bytes(layout.COMPLETE, b"{}")
    groups = FakeGroups({"g0": 2, "g1": 0, "g2": 1}, state=lambda p: pytest.fail("no group is read"))

    result = tick(config, Clouds(aws=groups), NOW)

    assert result.to_json() == {"action": FINISH, "reason": "the run ended (COMPLETE): every group at zero",
                                "move": None, "waiting": None, "resized": [
                                    {"placement": 0, "group": "g0", "size": 0},
                                    {"placement": 2, "group": "g2", "size": 0}]}


def test_a_lease_is_still_held_at_the_very_end_of_the_margin_as_the_trainers_count_it(file_run):
    store = open_store(file_run.uri)
    _lease(store, NOW - CLOCK_SKEW_S)

    assert lease_gone(store, NOW) == f"the run's lease is held by i-0b/2 until {iso(NOW)}"
    assert lease_gone(store, NOW + 0.001) is None


def test_bytes_a_machine_cut_mid_character_do_not_hide_the_deadline_or_the_events(file_run):
    store = open_store(file_run.uri)
    store.put_bytes(layout.DEADLINE_KEY, b"1800007200\n\xe2\x82")
    store.put_bytes(layout.EVENTS_KEY, "\n".join([
        _event(layout.STARTED, NOW - 900), '{"event": "fail', _event(layout.STARTED, NOW - 60, 2)]).encode()
        + b'\n{"event": "checkpoint", "note": "\xe2\x82')

    run = read_run(store)

    assert (run.deadline, run.attempts, run.heartbeat) == (1_800_007_200.0, 2, NOW - 60)


def test_ops_move_opens_the_run_folder_itself_and_polls_every_five_seconds(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    _lease(store, NOW + 100)
    groups = _failing_groups(config, 1)
    clock, slept = [NOW], []

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s

    result = move(config, Clouds(aws=groups), config.placements[1], "asked", wait_s=10.5, clock=lambda: clock[0],
                  sleep=sleep)

    assert slept == [5, 5, 0.5] and result.waiting and records.read(store)[0].pending["to"] == 1


def _ticking(start: float, step: float = 10.0):
    """A clock that moves ``step`` seconds each time it is read (a slow store, a slow cloud)."""
    now = [start - step]

    def read() -> float:
        now[0] += step
        return now[0]

    return read


def test_ops_move_reads_the_clock_again_before_it_starts_a_machine(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    # ops move reads the clock at NOW (the margin check), +10 (the record), +20 (its wait), +30 (the try)
    # and +40 (right before it starts the next group): the margin begins at +35.
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) + 35 + LAUNCH_MARGIN_S}\n".encode())
    groups = _failing_groups(config, 1)

    result = move(config, Clouds(aws=groups), config.placements[1], "asked", store=store, clock=_ticking(NOW))

    assert result.waiting == f"the run's deadline is less than 15 min away: {WEST}'s group is not started"
    assert groups.sizes == {"g0": 0, "g1": 0, "g2": 0}


@pytest.mark.parametrize("decided", [True, False])
def test_a_tick_reads_the_clock_again_before_it_starts_a_machine(file_run, decided):
    # `decided`: the tick records the move itself; else it finishes one recorded before.
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 16 * 60)
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) + 5 + LAUNCH_MARGIN_S}\n".encode())
    if not decided:
        _pending(config, store)
    groups = _failing_groups(config, 1)

    result = tick(config, Clouds(aws=groups), NOW, clock=_ticking(NOW + 10))  # it started in time, ran long

    assert result.action == MOVE and result.waiting.startswith("the run's deadline is less than 15 min away")
    assert groups.sizes == {"g0": 0, "g1": 0, "g2": 0}


def test_a_tick_given_no_clock_sizes_back_by_its_start_time(file_run):
    config = _config(2, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) + 7200}\n".encode())
    groups = FakeGroups({"g0": 1, "g1": 0, "g2": 0}, state=lambda p: GroupState(1, 1))

    tick(config, Clouds(aws=groups), NOW)

    assert groups.calls == [("g0", 2)]


def test_a_move_finished_with_the_runs_deadline_and_no_clock_counts_from_its_start(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    rec, version = _pending(config, store)
    groups = FakeGroups({"g0": 1, "g1": 0, "g2": 0})

    near = finish_move(config, Clouds(aws=groups), store, rec, version, NOW, RunView(deadline=NOW + 600))
    assert near.waiting and groups.calls == [("g0", 0)]

    done = finish_move(config, Clouds(aws=groups), store, rec, version, NOW, RunView(deadline=NOW + 7200))
    assert done.waiting is None and groups.calls == [("g0", 0), ("g1", 1)]


def test_a_second_move_reports_itself_not_the_first(file_run):
    config = _config(2, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    groups = FakeGroups({"g0": 2, "g1": 0, "g2": 0})
    first = move(config, Clouds(aws=groups), config.placements[1], "first", store=store, clock=lambda: NOW)

    second = move(config, Clouds(aws=groups), config.placements[2], "second", store=store, clock=lambda: NOW + 60)

    assert (first.move["to"], second.move["from"], second.move["to"], second.move["reason"]) == (1, 1, 2, "second")
    assert [e["move"] for e in records.read_events(store)[0]] == [1, 2]


def test_a_move_that_came_back_to_the_same_placement_meanwhile_is_left_to_its_writer(file_run):
    config = _config(1, run_uri=file_run.uri)
    store = open_store(config.run_uri)
    _trained(store, NOW - 60)
    rec, version = _pending(config, store)
    # Meanwhile: another writer finished it, moved the run on to 2 and back to 1: the same active placement.
    back = Record(active=1, since=iso(NOW), moves=[{**m, "done": True} for m in (
        rec.moves[0], {"from": 1, "to": 2, "reason": "r", "step": 40}, {"from": 2, "to": 1, "reason": "r", "step": 40})])
    records.write(store, back, version)
    groups = FakeGroups({"g0": 0, "g1": 1, "g2": 0})

    result = finish_move(config, Clouds(aws=groups), store, rec, version, NOW)

    assert result.reason == LEFT and groups.calls == []
