"""The controller with more than one machine a run, and a lease inside the clock-skew margin.

A run of `nodes` machines trains only with all of them (the trainers wait for each other), so a
group with some but not all of its machines is as stuck as an empty one. And a lease whose
`expires` is behind the controller's clock by less than the margin the trainers allow for
(`runfolder.lease.CLOCK_SKEW_S`) may still be held by a trainer whose clock runs late: the move
waits for it. Pure decisions, and ticks over a `file://` run folder with groups kept in memory.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from controller import record as records
from controller.clouds import Clouds
from controller.config import parse
from controller.decide import MOVE, STAY, GroupState, LaunchFailure, RunView, decide
from controller.record import Record, iso
from controller.tick import lease_gone, move, tick
from runfolder import layout
from runfolder.lease import CLOCK_SKEW_S, LeaseRecord
from runfolder.storage import open_store
from tests.controller.helpers import FakeGroups, moved_events, trained

NOW = 1_800_000_000.0
NO_CAPACITY = ("We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested "
               "(us-east-1a). Launching EC2 instance failed.")
WAIT_MINUTES = 15


def _config(nodes: int, run_uri: str = "s3://b/runs/r"):
    return parse({"run_uri": run_uri, "nodes": nodes, "wait_minutes": WAIT_MINUTES, "placements": [
        {"cloud": "aws", "region": r, "group": f"g{i}"} for i, r in enumerate(("us-east-1", "us-west-2"))]})


def _stuck(running: int, nodes: int) -> GroupState:
    """A group asked for `nodes` machines with `running` of them, failing for capacity a minute ago."""
    return GroupState(running, nodes, (LaunchFailure(NOW - 60, NO_CAPACITY),))


@pytest.mark.parametrize(("nodes", "running", "action"), [
    (1, 0, MOVE), (1, 1, STAY),
    (2, 0, MOVE), (2, 1, MOVE), (2, 2, STAY), (2, 3, STAY),
    (3, 1, MOVE), (3, 2, MOVE), (3, 3, STAY),
])
def test_a_group_short_of_the_runs_machines_moves_like_an_empty_one(nodes, running, action):
    run = RunView(heartbeat=NOW - (WAIT_MINUTES + 1) * 60)

    d = decide(_config(nodes), Record(active=0), run, _stuck(running, nodes), NOW)

    assert d.action == action, d
    if action == STAY:
        assert f"{running} machine(s) running" in d.reason
    else:
        assert d.to == 1 and "capacity" in d.reason


DECIDED: list[tuple[int, int, str]] = []


@given(nodes=st.integers(1, 3), running=st.integers(0, 4), idle_minutes=st.floats(0, 120),
       movable=st.booleans())
@example(nodes=3, running=2, idle_minutes=30.0, movable=True).via("two of three machines, for capacity")
@example(nodes=2, running=1, idle_minutes=5.0, movable=True).via("one of two, not yet the wait")
def test_the_run_stays_whenever_all_its_machines_run_and_moves_only_short_of_them(nodes, running, idle_minutes,
                                                                                 movable):
    message = NO_CAPACITY if movable else "The image id '[ami-1]' does not exist. Launching EC2 instance failed."
    group = GroupState(running, nodes, (LaunchFailure(NOW - 60, message),))
    run = RunView(heartbeat=NOW - idle_minutes * 60)

    d = decide(_config(nodes), Record(active=0), run, group, NOW)

    short = running < nodes
    waited = idle_minutes * 60 >= WAIT_MINUTES * 60
    assert (d.action == MOVE) == (short and waited and movable), (d, nodes, running)
    if not short:
        assert d.action == STAY and "running" in d.reason
    DECIDED.append((nodes, running, d.action))


def test_the_property_sees_partial_groups_move():
    # Its explicit examples alone reach a group short of machines on both sides of the wait.
    DECIDED.clear()
    test_the_run_stays_whenever_all_its_machines_run_and_moves_only_short_of_them()
    assert (3, 2, MOVE) in DECIDED and (2, 1, STAY) in DECIDED


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_tick_moves_a_run_whose_group_lacks_one_machine_and_sizes_the_next_to_nodes(tmp_path, nodes):
    config = _config(nodes, f"file://{tmp_path}/runs/r")
    store = open_store(config.run_uri)
    trained(store, step=40, last_beat=NOW - (WAIT_MINUTES + 1) * 60)
    groups = FakeGroups({"g0": nodes, "g1": 0},
                        state=lambda p: _stuck(nodes - 1, nodes) if p.index == 0 else GroupState(0, 0))

    result = tick(config, Clouds(aws=groups), NOW)

    assert result.action == MOVE, result
    assert groups.sizes == {"g0": 0, "g1": nodes}
    rec, _ = records.read(store)
    assert rec.active == 1 and rec.moves[0]["step"] == 40 and rec.moves[0]["done"]
    assert len(moved_events(store)) == 1


def _lease(store, expires: float, *, released: bool = False) -> None:
    store.put_bytes(layout.LEASE_KEY, LeaseRecord(holder="i-0late/2", token="t", epoch=2, ttl_s=60.0,
                                                  expires=expires, released=released, nonce="n").dump())


@pytest.mark.parametrize(("behind_s", "held"), [
    (-30.0, True),  # not expired at all
    (1.0, True), (CLOCK_SKEW_S / 2, True), (CLOCK_SKEW_S - 0.5, True),  # inside the margin: maybe held
    (CLOCK_SKEW_S + 0.5, False), (CLOCK_SKEW_S + 600, False),  # past it: nobody can hold it
])
def test_a_lease_is_gone_only_past_the_clock_skew_margin(tmp_path, behind_s, held):
    store = open_store(f"file://{tmp_path}/runs/r")
    _lease(store, NOW - behind_s)

    said = lease_gone(store, NOW)

    assert (said is not None) == held, said
    if held:
        assert "i-0late/2" in said and iso(NOW - behind_s + CLOCK_SKEW_S) in said


def test_a_released_or_missing_lease_is_gone_at_once(tmp_path):
    store = open_store(f"file://{tmp_path}/runs/r")
    assert lease_gone(store, NOW) is None
    _lease(store, NOW + 600, released=True)
    assert lease_gone(store, NOW) is None
    _lease(store, NOW + 600)
    assert lease_gone(store, NOW) is not None  # the same lease, not released: held


@pytest.mark.parametrize("nodes", [1, 3])
def test_a_move_waits_while_the_old_lease_is_inside_the_margin_then_starts_the_next_group(tmp_path, nodes):
    config = _config(nodes, f"file://{tmp_path}/runs/r")
    store = open_store(config.run_uri)
    trained(store, step=40, last_beat=NOW - 3600)
    expires = NOW - CLOCK_SKEW_S + 5  # expired 10 s ago by our clock: a late trainer may still hold it
    _lease(store, expires)
    groups = FakeGroups({"g0": nodes, "g1": 0}, state=lambda p: _stuck(0, nodes))

    waiting = move(config, Clouds(aws=groups), config.placements[1], "operator", store=store, clock=lambda: NOW)

    assert waiting.waiting and "i-0late/2" in waiting.waiting, waiting
    assert groups.sizes == {"g0": 0, "g1": 0} and moved_events(store) == []

    later = tick(config, Clouds(aws=groups), expires + CLOCK_SKEW_S + 1)  # the margin has passed

    assert later.waiting is None and groups.sizes == {"g0": 0, "g1": nodes}
    [event] = moved_events(store)
    assert (event["from"], event["to"], event["step"]) == (0, 1, 40)
    assert json.loads(store.get_bytes(layout.PLACEMENT_KEY))["active"] == 1
