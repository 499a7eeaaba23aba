"""The controller's tick on the emulators: S3 (moto_server) for the run folder, moto's Auto Scaling
for the two placements' groups, a gate in front of it playing a region with no spot capacity as
AWS reports it (a failed scaling activity per try, no instance)."""

from __future__ import annotations

import time

import pytest

from controller import record as records
from controller.clouds import AwsGroups, CloudError, Clouds
from controller.decide import MOVE, STAY
from controller.tick import MoveError, move, tick
from runfolder import layout
from runfolder.storage import open_store
from tests.controller.helpers import FakeGroups, moved_events, race, sizes, trained
from tests.fixtures.no_capacity import insufficient_capacity

pytestmark = pytest.mark.slow

NO_CAPACITY = insufficient_capacity("g5.xlarge", "us-east-1a")


def test_a_run_whose_region_cannot_launch_moves_after_the_wait(placements):
    now = time.time()
    store = open_store(placements.run.uri)
    trained(store, step=20, last_beat=now - 16 * 60)
    placements.no_capacity_at_home(NO_CAPACITY, now)

    result = tick(placements.config, Clouds(aws=AwsGroups()), now)

    assert result.action == MOVE, result
    assert "capacity" in result.reason and "us-east-1" in result.reason
    assert sizes(placements.config) == [0, 1]
    rec, _ = records.read(store)
    assert rec.active == 1
    assert [(m["from"], m["to"], m["step"], m["done"]) for m in rec.moves] == [(0, 1, 20, True)]
    assert str(0) in rec.failed_at
    [event] = moved_events(store)
    assert (event["from"], event["to"], event["step"], event["move"]) == (0, 1, 20, 1)
    assert event["reason"] == rec.moves[0]["reason"]
    # The gate answered the controller's reads: the failure came from the API's answer.
    assert {a for _r, a, _g in placements.gate.answered} == {"DescribeScalingActivities", "DescribeAutoScalingGroups"}

    again = tick(placements.config, Clouds(aws=AwsGroups()), now + 60)  # idempotent: nothing more
    assert again.action == STAY and again.resized == []
    assert len(moved_events(store)) == 1 and sizes(placements.config) == [0, 1]


@pytest.mark.parametrize(("minutes_ago", "message", "why"), [
    (5, NO_CAPACITY, "min ago"),  # not yet waitMinutes without a machine
    (16, "The image id '[ami-12c6146b]' does not exist. Launching EC2 instance failed.", "another reason"),
])
def test_no_move_before_the_wait_or_for_a_failure_another_region_cannot_fix(placements, minutes_ago, message, why):
    now = time.time()
    store = open_store(placements.run.uri)
    trained(store, step=20, last_beat=now - minutes_ago * 60)
    placements.no_capacity_at_home(message, now)

    result = tick(placements.config, Clouds(aws=AwsGroups()), now)

    assert result.action == STAY and why in result.reason, result
    assert sizes(placements.config) == [1, 0]
    assert not store.exists(layout.PLACEMENT_KEY)


def test_a_group_that_launches_is_left_alone(placements):
    now = time.time()
    store = open_store(placements.run.uri)
    trained(store, step=20, last_beat=now - 60 * 60)  # an old heartbeat, but the group has its machine

    result = tick(placements.config, Clouds(aws=AwsGroups()), now)

    assert result.action == STAY and "running" in result.reason
    assert sizes(placements.config) == [1, 0]


def test_an_ended_run_puts_every_group_to_zero(placements):
    now = time.time()
    store = open_store(placements.run.uri)
    trained(store, step=40, last_beat=now)
    store.put_bytes(layout.COMPLETE, b'{"step": 40}')
    groups = AwsGroups()
    groups.set_size(placements.config.placements[1], 1)  # a group left up by hand

    result = tick(placements.config, Clouds(aws=groups), now)

    assert result.action == "finish"
    assert sorted(r["placement"] for r in result.resized) == [0, 1]
    assert sizes(placements.config) == [0, 0]
    assert tick(placements.config, Clouds(aws=groups), now).resized == []


def test_a_move_waits_for_the_old_lease_and_the_next_tick_finishes_it(placements):
    now = time.time()
    store = open_store(placements.run.uri)
    trained(store, step=20, last_beat=now, lease_released=False, lease_until=now + 60)
    to = placements.config.placements[1]

    first = move(placements.config, Clouds(aws=AwsGroups()), to, "asked: ops move", wait_s=0)

    assert first.waiting and "lease" in first.waiting
    assert sizes(placements.config) == [0, 0]  # the old group is down, the new one waits for the lease
    assert moved_events(store) == []
    rec, _ = records.read(store)
    assert rec.active == 1 and rec.pending is not None and rec.failed_at == {}

    later = tick(placements.config, Clouds(aws=AwsGroups()), now + 60 + 16)  # the lease has expired

    assert later.waiting is None and sizes(placements.config) == [0, 1]
    assert [e["reason"] for e in moved_events(store)] == ["asked: ops move"]
    assert records.read(store)[0].pending is None
    with pytest.raises(MoveError, match="already"):
        move(placements.config, Clouds(aws=AwsGroups()), to, "again")


def test_transient_failures_of_the_clouds_are_retried(placements):
    now = time.time()
    store = open_store(placements.run.uri)
    trained(store, step=20, last_beat=now - 16 * 60)
    placements.no_capacity_at_home(NO_CAPACITY, now)
    placements.proxy.fail_next(3, "503")

    result = tick(placements.config, Clouds(aws=AwsGroups()), now)

    assert placements.proxy.failed == 3
    assert result.action == MOVE and sizes(placements.config) == [0, 1]


class _FailsOnce:
    """Groups whose first resize of ``group`` to a non-zero size fails (after the retries)."""

    def __init__(self, inner, group: str) -> None:
        self.inner, self.group, self.failed = inner, group, False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def set_size(self, p, n):
        if p.group == self.group and n and not self.failed:
            self.failed = True
            raise CloudError(f"resize of {p.group} failed: ServiceUnavailable")
        self.inner.set_size(p, n)


def test_a_tick_that_fails_midway_leaves_a_move_the_next_tick_finishes(placements):
    now = time.time()
    store = open_store(placements.run.uri)
    trained(store, step=20, last_beat=now - 16 * 60)
    placements.no_capacity_at_home(NO_CAPACITY, now)
    flaky = _FailsOnce(AwsGroups(), placements.config.placements[1].group)

    with pytest.raises(CloudError):
        tick(placements.config, Clouds(aws=flaky), now)
    assert flaky.failed and sizes(placements.config) == [0, 0]
    assert records.read(store)[0].pending is not None

    result = tick(placements.config, Clouds(aws=flaky), now + 60)

    assert result.action == MOVE and sizes(placements.config) == [0, 1]
    assert len(moved_events(store)) == 1 and records.read(store)[0].pending is None


def test_two_ticks_at_once_move_once_on_s3(placements):
    now = time.time()
    store = open_store(placements.run.uri)
    trained(store, step=20, last_beat=now - 16 * 60)
    placements.no_capacity_at_home(NO_CAPACITY, now)

    meeting, results = race(placements.config, Clouds(aws=AwsGroups()), store, now)

    assert meeting.refused == 1  # both wrote from the same version; S3 accepted one
    assert sorted(r.action for r in results) == [MOVE, STAY]
    assert sizes(placements.config) == [0, 1]
    rec, _ = records.read(store)
    assert len(rec.moves) == 1 and rec.moves[0]["done"]
    assert len(moved_events(store)) == 1


def test_two_ticks_at_once_move_once_on_gcs(gs_run_enforced):
    from controller.decide import GroupState, LaunchFailure
    from tests.controller.helpers import aws_config

    now = time.time()
    config = aws_config(gs_run_enforced.uri, ["home-gpu", "west-gpu"])
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=now - 16 * 60)
    groups = FakeGroups({"home-gpu": 1, "west-gpu": 0},
                        state=lambda p: GroupState(0, 1, (LaunchFailure(now - 30, NO_CAPACITY),)) if p.index == 0
                        else GroupState(0, 0))

    meeting, results = race(config, Clouds(aws=groups), store, now)

    assert meeting.refused == 1
    assert any(d[4] for d in gs_run_enforced.proxy.gate.decisions)  # GCS's precondition refused one
    assert sorted(r.action for r in results) == [MOVE, STAY]
    assert groups.sizes == {"home-gpu": 0, "west-gpu": 1}
    assert groups.calls.count(("west-gpu", 1)) == 1
    rec, _ = records.read(store)
    assert len(rec.moves) == 1 and rec.moves[0]["done"] and len(moved_events(store)) == 1


class _Unreachable(FakeGroups):
    """Groups of which one cannot be reached (its cloud refuses the controller's credential)."""

    def __init__(self, sizes, refused: str, **kw) -> None:
        super().__init__(sizes, **kw)
        self.refused = refused

    def desired(self, p) -> int:
        if p.group == self.refused:
            raise CloudError(f"placement {p.index} ({p.label}): Google refused this function's AWS identity")
        return super().desired(p)


@pytest.mark.parametrize("ended", [True, False])
def test_a_group_that_cannot_be_reached_does_not_keep_the_others_up(file_run, ended):
    from controller.config import parse
    from controller.decide import GroupState

    now = time.time()
    config = parse({"run_uri": file_run.uri, "nodes": 1, "wait_minutes": 15, "placements": [
        {"cloud": "aws", "region": region, "group": group}
        for region, group in (("us-east-1", "home-gpu"), ("us-west-2", "west-gpu"), ("eu-west-1", "eu-gpu"))]})
    store = open_store(config.run_uri)
    trained(store, step=20, last_beat=now)
    if ended:
        store.put_bytes(layout.COMPLETE, b'{"step": 20}')
    groups = _Unreachable({"home-gpu": 1, "west-gpu": 0, "eu-gpu": 1}, refused="west-gpu",
                          state=lambda p: GroupState(1, 1, ()))

    with pytest.raises(CloudError, match=r"^placement 1 \(aws us-west-2\): Google refused"):
        tick(config, Clouds(aws=groups), now)

    assert groups.sizes == {"home-gpu": 0 if ended else 1, "west-gpu": 0, "eu-gpu": 0}  # the others were zeroed
