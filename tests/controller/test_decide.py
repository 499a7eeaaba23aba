"""The controller's decision, pure: when a run moves, where to, and when it stays."""

from __future__ import annotations

import pytest

from controller.config import parse
from controller.decide import (
    CAPACITY,
    FINISH,
    HUNG_S,
    MOVE,
    OTHER,
    PRICE,
    QUOTA,
    REPLACE,
    STAY,
    GroupState,
    LaunchFailure,
    RunView,
    candidates,
    decide,
    failure_kind,
)
from controller.record import Record, iso

NOW = 1_800_000_000.0
CONFIG = parse({"run_uri": "s3://b/runs/r", "nodes": 1, "wait_minutes": 15, "placements": [
    {"cloud": "aws", "region": r, "group": f"g{i}"} for i, r in enumerate(("us-east-1", "us-west-2", "eu-west-1"))]})
NO_CAPACITY = ("We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested "
               "(us-east-1a). Launching EC2 instance failed.")


@pytest.mark.parametrize(("message", "kind"), [
    (NO_CAPACITY, CAPACITY),
    ("There is no Spot capacity available that matches your request. Launching EC2 instance failed.", CAPACITY),
    ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: The zone 'projects/p/zones/us-central1-a' does not have enough "
     "resources available to fulfill the request.", CAPACITY),
    ("You have requested more vCPU capacity than your current vCPU limit of 0 allows for the instance bucket that "
     "the specified instance type belongs to. Launching EC2 instance failed.", QUOTA),
    ("QUOTA_EXCEEDED: Quota 'PREEMPTIBLE_NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1.", QUOTA),
    ("Max spot instance count exceeded. Launching EC2 instance failed.", QUOTA),
    ("Your Spot request price of 0.1 is lower than the minimum required Spot request fulfillment price of 0.4.",
     PRICE),
    ("The image id '[ami-1]' does not exist. Launching EC2 instance failed.", OTHER),
])
def test_launch_failures_are_told_apart_by_the_clouds_words(message, kind):
    assert failure_kind(message) == kind


def _group(*failures_ago: float, message: str = NO_CAPACITY, running: int = 0) -> GroupState:
    return GroupState(running, 1, tuple(LaunchFailure(NOW - s, message) for s in failures_ago))


@pytest.mark.parametrize(("run", "group", "action"), [
    (RunView(heartbeat=NOW - 16 * 60), _group(60), MOVE),
    (RunView(heartbeat=NOW - 14 * 60), _group(60), STAY),  # not waitMinutes yet
    (RunView(heartbeat=NOW - 16 * 60, lease_until=NOW - 60), _group(60), STAY),  # a lease was renewed 1 min ago
    (RunView(heartbeat=NOW - 16 * 60), _group(), STAY),  # no failed launch
    (RunView(heartbeat=NOW - 16 * 60), _group(17 * 60), STAY),  # the failure is older than the last machine
    (RunView(heartbeat=NOW - 16 * 60), _group(60, running=1), STAY),
    (RunView(heartbeat=NOW - 16 * 60), _group(60, message="InvalidParameterValue"), STAY),
    (RunView(), _group(16 * 60, 60), MOVE),  # never started: failing for 16 min
    (RunView(), _group(10 * 60, 60), STAY),
    (RunView(ended="COMPLETE", heartbeat=NOW - 16 * 60), _group(60), FINISH),
])
def test_a_run_moves_only_after_the_wait_with_failed_launches(run, group, action):
    assert decide(CONFIG, Record(), run, group, NOW).action == action


def test_the_wait_starts_again_when_a_placement_becomes_active():
    rec = Record(active=1, since=iso(NOW - 10 * 60))
    assert decide(CONFIG, rec, RunView(heartbeat=NOW - 60 * 60), _group(60), NOW).action == STAY
    rec.since = iso(NOW - 16 * 60)
    moved = decide(CONFIG, rec, RunView(heartbeat=NOW - 60 * 60), _group(60), NOW)
    assert (moved.action, moved.to) == (MOVE, 2)


def test_a_failed_placement_comes_after_the_others_and_not_before_twice_the_wait():
    wait = CONFIG.wait_s
    assert candidates(CONFIG, Record(active=0), NOW) == [1, 2]
    assert candidates(CONFIG, Record(active=1), NOW) == [2, 0]
    # 0 failed just now: not a candidate; 2 failed long ago: after the never-failed ones.
    assert candidates(CONFIG, Record(active=1, failed_at={"0": NOW - 60}), NOW) == [2]
    assert candidates(CONFIG, Record(active=1, failed_at={"0": NOW - 2 * wait + 1}), NOW) == [2]
    assert candidates(CONFIG, Record(active=1, failed_at={"0": NOW - 2 * wait}), NOW) == [2, 0]
    assert candidates(CONFIG, Record(active=0, failed_at={"1": NOW - 3 * wait, "2": NOW - 4 * wait}), NOW) == [2, 1]
    assert candidates(CONFIG, Record(active=2, failed_at={"0": NOW - 3 * wait}), NOW) == [1, 0]


def test_with_nowhere_to_go_the_run_stays_and_says_why():
    rec = Record(active=1, since=iso(NOW - 60 * 60), failed_at={"0": NOW - 60, "2": NOW - 60})
    stay = decide(CONFIG, rec, RunView(), _group(16 * 60), NOW)
    assert stay.action == STAY and "30 min" in stay.reason


def _up(n: int = 1, launched: float | None = None) -> GroupState:
    return GroupState(n, n, (), launched=launched)


@pytest.mark.parametrize(("run", "group", "rec", "action"), [
    (RunView(progress_at=NOW - HUNG_S - 60), _up(), Record(), REPLACE),  # all machines up, no progress for the bound
    (RunView(progress_at=NOW - HUNG_S + 60), _up(), Record(), STAY),  # progress within the bound
    (RunView(progress_at=NOW - 3 * HUNG_S), _up(launched=NOW - 20 * 60), Record(), STAY),  # a fresh machine boots
    (RunView(progress_at=NOW - 3 * HUNG_S, finishing=True), _up(), Record(), STAY),  # the export after the last step
    (RunView(progress_at=NOW - 3 * HUNG_S, stop=True), _up(), Record(), STAY),  # a stop is asked: not a machine's fault
    (RunView(progress_at=NOW - 3 * HUNG_S, deadline=NOW + 600), _up(), Record(), STAY),  # inside the launch margin
    (RunView(progress_at=NOW - 3 * HUNG_S), _up(), Record(since=iso(NOW - 30 * 60)), STAY),  # active for 30 min only
    (RunView(), _up(), Record(), STAY),  # nothing known: no age to judge by
])
def test_machines_up_without_progress_are_replaced_only_past_every_legitimate_silence(run, group, rec, action):
    assert decide(CONFIG, rec, run, group, NOW).action == action


def test_a_placement_that_hangs_again_after_its_machines_were_replaced_counts_as_failed():
    rec = Record(active=0, since=iso(NOW - 5 * HUNG_S), hung={"0": [NOW - 2 * HUNG_S]})
    run = RunView(progress_at=NOW - 3 * HUNG_S)

    moved = decide(CONFIG, rec, run, _up(), NOW)

    assert (moved.action, moved.to) == (MOVE, 1) and "again after its machines were replaced" in moved.reason
    # With nowhere to go, its machines are replaced again, and the controller says why it waits.
    stuck = decide(CONFIG, Record(**{**rec.__dict__, "failed_at": {"1": NOW, "2": NOW}}), run, _up(), NOW)
    assert (stuck.action, stuck.stuck) == (REPLACE, "0:hung:nowhere")


def test_the_controllers_bound_waits_out_the_machines_own_watch_and_a_slow_boot():
    from ops.runstate import QUIET_PHASE_S

    # userdata/progress.sh: 3600 s from the trainer's start to its first progress; a boot takes up to 15 min.
    assert HUNG_S > 3600 + 15 * 60 and HUNG_S > QUIET_PHASE_S + 15 * 60


def test_a_placement_whose_own_group_failed_lately_waits_like_one_the_run_left_whoever_moved_it():
    wait = CONFIG.wait_s
    # An operator moved the run 0 -> 1 (no failed_at), away from 0's failing group; now 1 cannot launch.
    rec = Record(active=1, since=iso(NOW - 20 * 60))
    assert candidates(CONFIG, rec, NOW) == [2, 0]
    assert candidates(CONFIG, rec, NOW, {0: NOW - 5 * 60}) == [2]  # its own activity: failed 5 min ago
    assert candidates(CONFIG, rec, NOW, {0: NOW - 2 * wait}) == [2, 0]  # and tried again after twice the wait
    assert candidates(CONFIG, Record(active=1, failed_at={"2": NOW - 3 * wait}), NOW, {0: NOW - 3 * wait + 60}) == [2, 0]

    moved = decide(CONFIG, rec, RunView(progress_at=NOW - 20 * 60), _group(60), NOW, {0: NOW - 5 * 60})
    assert (moved.action, moved.to) == (MOVE, 2)
