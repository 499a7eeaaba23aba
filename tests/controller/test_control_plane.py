"""The controller when events do not come one at a time: a move inside a tick, an active group found
below ``nodes``, the run's deadline. A run folder on disk (file://) and groups in memory."""

from __future__ import annotations

import json

import pytest

from controller import record as records
from controller.config import parse
from controller.decide import LAUNCH_MARGIN_S, STAY, TIME_UP, GroupState
from controller.tick import MoveError, move, read_run, tick
from runfolder import layout
from runfolder.storage import open_store
from tests.controller.helpers import FakeGroups, trained

NOW = 1_800_000_000.0


def _config(run_uri: str, *, nodes: int = 1, max_runtime_s: int | None = None):
    return parse({"run_uri": run_uri, "nodes": nodes, "wait_minutes": 15, "max_runtime_s": max_runtime_s,
                  "placements": [{"cloud": "aws", "region": f"r-{i}", "group": f"g{i}"} for i in range(3)]})


def _groups(config, sizes):
    return FakeGroups({p.group: n for p, n in zip(config.placements, sizes, strict=True)},
                      state=lambda p: GroupState(running=0, desired=None))


class MoveInside:
    """A store that lets ``ops move`` run to its end right after the tick's first read of placement.json."""

    def __init__(self, store, during) -> None:
        self._store, self._during, self.moved = store, during, False

    def __getattr__(self, name):
        return getattr(self._store, name)

    def get_versioned(self, key):
        got = self._store.get_versioned(key)
        if key == layout.PLACEMENT_KEY and not self.moved:
            self.moved = True
            self._during()
        return got


def test_a_tick_that_read_the_record_before_a_move_does_not_zero_the_placement_moved_to(tmp_path):
    config = _config(f"file://{tmp_path}")
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW - 60)  # a released lease: the move completes at once
    records.write(store, records.Record(active=0, since=records.iso(NOW - 600)), None)
    groups = _groups(config, [1, 0, 0])
    inside = MoveInside(store, lambda: move(config, groups, config.placements[1], "asked: ops move", store=store,
                                            clock=lambda: NOW))

    result = tick(config, groups, NOW, store=inside)

    assert inside.moved and records.read(store)[0].active == 1
    assert groups.sizes == {"g0": 0, "g1": 1, "g2": 0}, result  # with the stale record it zeroed g1
    assert result.action == STAY and "changed" in result.reason


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_an_active_group_found_below_nodes_is_sized_back(tmp_path, nodes):
    config = _config(f"file://{tmp_path}", nodes=nodes)
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW - 60)
    groups = FakeGroups({"g0": nodes - 1, "g1": 0, "g2": 0},
                        state=lambda p: GroupState(running=0, desired=groups.sizes[p.group]))

    result = tick(config, groups, NOW, store=store)

    assert groups.sizes == {"g0": nodes, "g1": 0, "g2": 0}
    assert result.action == STAY and f"sized back to {nodes}" in result.reason


def test_a_run_asked_to_stop_is_not_sized_back(tmp_path):
    config = _config(f"file://{tmp_path}", nodes=2)
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW - 60)
    store.put_bytes(layout.STOP_KEY, b'{"reason": "asked"}')
    groups = FakeGroups({"g0": 0, "g1": 0, "g2": 0}, state=lambda p: GroupState(running=0, desired=0))

    tick(config, groups, NOW, store=store)

    assert groups.calls == []


def test_the_first_tick_writes_the_deadline_the_machines_read(tmp_path):
    config = _config(f"file://{tmp_path}", max_runtime_s=7200)
    store = open_store(config.run_uri)
    groups = _groups(config, [1, 0, 0])

    tick(config, groups, NOW, store=store)
    store.put_bytes(layout.DEADLINE_KEY, b"1\n")  # a later write (a machine's) is the run's, not overwritten
    tick(config, groups, NOW + 60, store=store)

    assert store.get_bytes(layout.DEADLINE_KEY) == b"1\n"
    fresh = open_store(f"file://{tmp_path}/other")
    tick(_config(fresh.uri, max_runtime_s=7200), groups, NOW, store=fresh)
    assert fresh.get_bytes(layout.DEADLINE_KEY) == f"{int(NOW) + 7200}\n".encode()  # as supervise.sh writes it


def test_past_the_deadline_the_controller_ends_the_run_timed_out(tmp_path):
    config = _config(f"file://{tmp_path}", nodes=2)
    store = open_store(config.run_uri)
    trained(store, step=40, last_beat=NOW - 600)
    store.append_line(layout.EVENTS_KEY, json.dumps({layout.EVENT: layout.STARTED, layout.TIME: "x", layout.ATTEMPT: 1}))
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) - 1}\n".encode())
    groups = _groups(config, [2, 1, 0])
    with pytest.raises(MoveError, match="deadline .* has passed"):
        move(config, groups, config.placements[1], "asked", store=store, clock=lambda: NOW)

    result = tick(config, groups, NOW, store=store)

    assert result.action == TIME_UP and "deadline" in result.reason
    assert groups.sizes == {"g0": 0, "g1": 0, "g2": 0}
    marker = json.loads(store.get_bytes(layout.TIMED_OUT))
    # The shape finish.sh writes: outcome, reason, instance, time, step, attempts.
    assert set(marker) == {"outcome", layout.MARKER_REASON, "instance", layout.TIME, layout.MARKER_STEP,
                           layout.MARKER_ATTEMPTS}
    assert (marker["outcome"], marker["instance"], marker["step"], marker["attempts"]) == (
        layout.TIMED_OUT, "controller", 40, 1)
    assert "deadline" in marker[layout.MARKER_REASON]
    assert read_run(store).ended == layout.TIMED_OUT
    assert not store.exists(layout.PLACEMENT_KEY)  # the refused move recorded nothing


def test_no_group_is_sized_up_near_the_deadline(tmp_path):
    config = _config(f"file://{tmp_path}", nodes=1)
    store = open_store(config.run_uri)
    trained(store, step=40, last_beat=NOW - 60)
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) + LAUNCH_MARGIN_S - 60}\n".encode())
    groups = FakeGroups({"g0": 0, "g1": 0, "g2": 0}, state=lambda p: GroupState(running=0, desired=0))

    result = tick(config, groups, NOW, store=store)

    assert groups.calls == [] and "no machine is started" in result.reason
    with pytest.raises(MoveError, match="min away"):
        move(config, groups, config.placements[1], "asked", store=store, clock=lambda: NOW)
    assert not store.exists(layout.PLACEMENT_KEY)


def test_a_tick_that_ran_past_the_launch_margin_does_not_size_up(tmp_path):
    config = _config(f"file://{tmp_path}", nodes=1)
    store = open_store(config.run_uri)
    trained(store, step=40, last_beat=NOW - 60)
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) + LAUNCH_MARGIN_S + 30}\n".encode())
    groups = FakeGroups({"g0": 0, "g1": 0, "g2": 0}, state=lambda p: GroupState(running=0, desired=0))

    tick(config, groups, NOW, store=store, clock=lambda: NOW + 60)  # it started in time and sized a minute on

    assert groups.calls == []


def _failing(config, minutes: int):
    from controller.decide import LaunchFailure

    words = "We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested."
    return FakeGroups({p.group: 1 if p.index == 0 else 0 for p in config.placements},
                      state=lambda p: GroupState(running=0, desired=1,
                                                 failures=(LaunchFailure(NOW - minutes * 60, words),)))


def test_a_run_that_cannot_train_anywhere_says_so_in_ops_status_once(tmp_path):
    from rich.console import Console

    from ops.status import read_status, render

    config = _config(f"file://{tmp_path}")
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW - 20 * 60)
    # Placements 1 and 2 failed minutes ago: none may be tried yet, and home cannot launch.
    records.write(store, records.Record(active=0, failed_at={"1": NOW - 60, "2": NOW - 120}), None)
    groups = _failing(config, 16)

    first = tick(config, groups, NOW, store=store)
    tick(config, groups, NOW + 60, store=store)

    assert first.action == STAY and "no other placement may be tried" in first.reason
    waits = [e for e in records.read_events(store)[0] if e[layout.EVENT] == layout.CONTROLLER_WAITING]
    assert [w["reason"] for w in waits] == [first.reason]  # once, not each minute
    st = read_status(config.run_uri, store=store, now=NOW + 90)
    assert st.waiting == first.reason
    console = Console(width=300, record=True)
    console.print(render(st))
    assert "the run cannot train anywhere now" in console.export_text()


def test_a_run_that_trains_again_is_no_longer_said_to_wait(tmp_path):
    from ops.status import read_status

    config = _config(f"file://{tmp_path}")
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW - 20 * 60)
    records.write(store, records.Record(active=0, failed_at={"1": NOW - 60, "2": NOW - 120}), None)
    tick(config, _failing(config, 16), NOW, store=store)
    trained(store, step=30, last_beat=NOW + 300)

    assert read_status(config.run_uri, store=store, now=NOW + 310).waiting == ""


def test_ops_status_says_the_controller_ended_the_run_timed_out(tmp_path):
    from ops.status import read_status

    config = _config(f"file://{tmp_path}")
    store = open_store(config.run_uri)
    trained(store, step=40, last_beat=NOW - 600)
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) - 1}\n".encode())
    tick(config, _groups(config, [1, 0, 0]), NOW, store=store)

    st = read_status(config.run_uri, store=store, now=NOW + 60)

    assert st.state == layout.TIMED_OUT and "deadline" in st.detail and st.step == 40


class _Refusing(FakeGroups):
    """Groups in memory of which ``refused`` (placement indexes) answer every call with a refusal."""

    def __init__(self, config, sizes, refused, state=None) -> None:
        super().__init__({p.group: n for p, n in zip(config.placements, sizes, strict=True)},
                         state=state or (lambda p: GroupState(running=0, desired=self.sizes[p.group])))
        self.refused = set(refused)

    def _check(self, p):
        from controller.clouds import CloudError

        if p.index in self.refused:
            raise CloudError(f"placement {p.index} ({p.label}): AccessDenied")

    def desired(self, p):
        self._check(p)
        return super().desired(p)

    def set_size(self, p, n):
        self._check(p)
        super().set_size(p, n)

    def state(self, p):
        self._check(p)
        return super().state(p)


def test_a_broken_placement_keeps_no_other_duty_of_the_tick_from_being_done(tmp_path):
    from controller.clouds import CloudError

    config = _config(f"file://{tmp_path}")
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW - 20 * 60)
    # Home stands at 0 (a person put it there) and cannot launch; 1 and 2 failed a minute ago; 1 refuses every call.
    records.write(store, records.Record(active=0, failed_at={"1": NOW - 60, "2": NOW - 60}), None)
    words = "We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested."
    from controller.decide import LaunchFailure

    groups = _Refusing(config, [0, 1, 1], refused={1}, state=lambda p: GroupState(
        running=0, desired=groups.sizes[p.group], failures=(LaunchFailure(NOW - 16 * 60, words),) if p.index == 0
        else ()))

    with pytest.raises(CloudError, match=r"^placement 1 \(aws r-1\): AccessDenied$") as raised:
        tick(config, groups, NOW, store=store)

    assert groups.sizes == {"g0": 1, "g1": 1, "g2": 0}  # 2 zeroed, home sized back: the broken one held nothing up
    waits = [e for e in records.read_events(store)[0] if e[layout.EVENT] == layout.CONTROLLER_WAITING]
    assert [w["key"] for w in waits] == ["0:capacity:nowhere"]
    assert raised.value.result.errors == ["placement 1 (aws r-1): AccessDenied"]


def _tick_quietly(config, groups, store, now):
    from controller.clouds import CloudError

    try:
        return tick(config, groups, now, store=store)
    except CloudError as e:
        return e.result


def test_a_placement_broken_for_its_ticks_is_marked_failed_named_once_and_forgiven_when_it_answers(tmp_path):
    from controller.decide import BROKEN_S, BROKEN_TICKS

    config = _config(f"file://{tmp_path}")
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW)
    groups = _Refusing(config, [1, 0, 0], refused={2}, state=lambda p: GroupState(running=1, desired=1))

    for k in range(BROKEN_TICKS + 3):
        _tick_quietly(config, groups, store, NOW + k * BROKEN_S / (BROKEN_TICKS - 1))

    rec = records.read(store)[0]
    assert rec.broken["2"]["ticks"] == BROKEN_TICKS + 3 and rec.broken["2"]["said"]
    assert "2" in rec.failed_at and "1" not in rec.broken
    waits = [e for e in records.read_events(store)[0] if e[layout.EVENT] == layout.CONTROLLER_WAITING]
    assert [(w["key"], w["placement"]) for w in waits] == [("2:broken", "aws r-2")]
    assert "AccessDenied" in waits[0]["reason"]

    groups.refused.clear()
    tick(config, groups, NOW + 2 * BROKEN_S, store=store)
    assert records.read(store)[0].broken == {}


def test_a_move_to_a_broken_placement_is_abandoned_and_the_run_moves_on_elsewhere(tmp_path):
    from controller.decide import BROKEN_S, BROKEN_TICKS, MOVE

    config = _config(f"file://{tmp_path}")
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW - 60 * 60)
    # An operator's move to 1 whose new group could not be sized: it stays under way.
    records.write(store, records.Record(active=1, since=records.iso(NOW), moves=[
        {"from": 0, "to": 1, "reason": "asked: ops move", "step": 20, "time": records.iso(NOW), "done": False}]), None)
    groups = _Refusing(config, [0, 0, 0], refused={1})

    results = [_tick_quietly(config, groups, store, NOW + k * 60) for k in range(BROKEN_S // 60 + 2)]

    rec = records.read(store)[0]
    assert rec.pending is None and "abandoned" in rec.moves[0] and "1" in rec.failed_at
    assert any("abandoned" in r.reason for r in results)
    assert len([r for r in results if "abandoned" in r.reason]) == 1
    assert len(results) >= BROKEN_TICKS
    # The run, in a placement that cannot be reached, moves on after the wait; never back to 1.
    later = _tick_quietly(config, groups, store, NOW + 16 * 60)
    assert later.action == MOVE and later.move["to"] in (0, 2) and groups.sizes[config.placements[later.move["to"]].group] == 1


def test_machines_up_without_progress_are_replaced_by_cycling_their_group_once(tmp_path):
    from controller.decide import HUNG_S, REPLACE

    config = _config(f"file://{tmp_path}", nodes=2)
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW - 3 * HUNG_S)
    records.write(store, records.Record(active=0, since=records.iso(NOW - 4 * HUNG_S),
                                        seen={"0": {"ids": ["i-1", "i-2"], "at": NOW - 2 * HUNG_S}}), None)
    groups = FakeGroups({"g0": 2, "g1": 0, "g2": 0},
                        state=lambda p: GroupState(running=2, desired=2, machines=("i-1", "i-2")))

    result = tick(config, groups, NOW, store=store)
    again = tick(config, groups, NOW + 60, store=store)

    assert result.action == REPLACE and "no progress" in result.reason
    assert groups.calls == [("g0", 0), ("g0", 2)]  # to zero and back: fresh machines, within the grants
    assert records.read(store)[0].hung == {"0": [NOW]}
    assert again.action == STAY and groups.calls == [("g0", 0), ("g0", 2)]  # the replacement counts as a sign


def test_machines_the_controller_has_not_seen_before_are_given_their_boot(tmp_path):
    from controller.decide import HUNG_S

    config = _config(f"file://{tmp_path}")
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW - 3 * HUNG_S)  # the machine before hung, then was taken back
    records.write(store, records.Record(active=0, since=records.iso(NOW - 4 * HUNG_S),
                                        seen={"0": {"ids": ["i-old"], "at": NOW - 3 * HUNG_S}}), None)
    groups = FakeGroups({"g0": 1, "g1": 0, "g2": 0},
                        state=lambda p: GroupState(running=1, desired=1, machines=("i-new",)))

    assert tick(config, groups, NOW, store=store).action == STAY
    assert tick(config, groups, NOW + HUNG_S - 60, store=store).action == STAY  # still within its own bound
    assert records.read(store)[0].seen["0"] == {"ids": ["i-new"], "at": NOW}
    assert groups.calls == []


def test_after_an_operators_move_the_controller_weighs_the_groups_own_failed_launches(tmp_path):
    from controller.decide import MOVE, LaunchFailure

    config = _config(f"file://{tmp_path}")
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW - 30 * 60)
    words = "We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested."
    # The operator moved 0 -> 2 twenty minutes ago, away from 0's failing group: the record marks nothing failed.
    records.write(store, records.Record(active=2, since=records.iso(NOW - 20 * 60), moves=[
        {"from": 0, "to": 2, "reason": "asked: ops move", "step": 20, "time": records.iso(NOW - 20 * 60),
         "done": True}]), None)
    failed = {0: (LaunchFailure(NOW - 21 * 60, words),), 1: (), 2: (LaunchFailure(NOW - 60, words),)}
    groups = FakeGroups({"g0": 0, "g1": 0, "g2": 1}, state=lambda p: GroupState(
        running=0, desired=groups.sizes[p.group], failures=failed[p.index]))

    result = tick(config, groups, NOW, store=store)

    assert result.action == MOVE and result.move["to"] == 1  # not back to 0 as "never tried"
    assert groups.sizes == {"g0": 0, "g1": 1, "g2": 0}


@pytest.mark.parametrize(("lease_held", "asked_ago", "ends"), [
    (False, 0, True),  # no trainer holds the lease: none trains, none would heed it
    (True, 5 * 60, False),  # a trainer holds it: it sees STOP within a step and commits
    (True, 31 * 60, True),  # it holds it and nothing progressed since the stop was asked: it hangs
])
def test_a_stop_no_trainer_heeds_is_ended_by_the_controller_with_every_group_at_zero(tmp_path, lease_held, asked_ago,
                                                                                     ends):
    from controller.decide import FINISH

    config = _config(f"file://{tmp_path}")
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW - 40 * 60, lease_released=not lease_held, lease_until=NOW + 60)
    store.put_bytes(layout.STOP_KEY, json.dumps({"requested": records.iso(NOW - asked_ago)}).encode())
    groups = _groups(config, [1, 0, 1])

    result = tick(config, groups, NOW, store=store)

    if not ends:
        assert not store.exists(layout.CANCELLED) and result.action == STAY
        return
    marker = json.loads(store.get_bytes(layout.CANCELLED))
    assert (result.action, marker["outcome"], marker["instance"], marker["step"]) == (
        FINISH, layout.CANCELLED, "controller", 20)
    assert "stop was asked" in marker["reason"] and groups.sizes == {"g0": 0, "g1": 0, "g2": 0}


def test_a_run_held_again_by_the_same_cause_after_it_trained_is_said_to_wait_again(tmp_path):
    config = _config(f"file://{tmp_path}")
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=NOW - 20 * 60)
    records.write(store, records.Record(active=0, failed_at={"1": NOW - 60, "2": NOW - 120}), None)
    tick(config, _failing(config, 16), NOW, store=store)
    trained(store, step=30, last_beat=NOW + 600)  # it trained again, then lost its machine to the same cause
    records.write(store, records.Record(active=0, failed_at={"1": NOW + 1500, "2": NOW + 1500}),
                  records.read(store)[1])

    tick(config, _failing(config, -25), NOW + 1560, store=store)  # failing since NOW + 25 min

    waits = [e for e in records.read_events(store)[0] if e[layout.EVENT] == layout.CONTROLLER_WAITING]
    assert len(waits) == 2 and waits[0]["key"] == waits[1]["key"]
