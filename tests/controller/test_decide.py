"""The controller's decision, pure: when a run moves, where to, and when it stays."""

from __future__ import annotations

import pytest

from controller.config import parse
from controller.decide import (
    CAPACITY,
    FINISH,
    MOVE,
    OTHER,
    PRICE,
    QUOTA,
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
