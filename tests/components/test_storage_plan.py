"""The checkpoint storage plan (`components.storage`): what a run keeps in the bucket over time, on both clouds."""

import pytest

from components import storage
from components.settings import load_settings
from tests.components.aws import helpers as aws_helpers
from tests.components.gcp import helpers as gcp_helpers

GB = 10**9
WEEK_H = 168


def _settings(cloud: str, **run) -> object:
    base = aws_helpers.BASE if cloud == "aws" else gcp_helpers.BASE
    return load_settings({**base, "run": {"id": "exp-7", "synthetic": True, **run},
                          "compute": {**base["compute"], "maxRuntimeHours": WEEK_H}}, stack="unit")


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_a_10_gb_model_checkpointed_every_10_minutes_for_a_week(cloud):
    """The issue's case: ~10 TB kept before (every checkpoint for 30 days); now the kept ones plus 2 days at most."""
    s = _settings(cloud, steps=1000, checkpointEverySteps=None, checkpointEverySeconds=600, keepCheckpoints=3)
    plan = storage.storage_plan(s, checkpoint_bytes=10 * GB)
    assert (plan.written_max, plan.per_day, plan.size_assumed) == (1008, 144, False)
    assert plan.kept_bytes == 30 * GB
    if cloud == "aws":
        # Expiry rounds up to the next midnight UTC: up to 2 days of pruned checkpoints.
        assert (plan.billed_days, plan.parts_too) == (2, False)
        assert plan.noncurrent_bytes_max == 288 * 10 * GB
    else:
        # A day of pruned checkpoints and a day of parallel-upload parts (each checkpoint's size again).
        assert (plan.billed_days, plan.parts_too) == (1, True)
        assert plan.noncurrent_bytes_max == (144 + 144) * 10 * GB
    assert plan.peak_bytes == plan.kept_bytes + plan.noncurrent_bytes_max < 3 * 10**12  # was ~10 TB
    # After the run: the pruned ones are gone once billed_days have passed; the kept ones stay.
    assert plan.checkpoint_bytes_left(written=1008, days_after=plan.billed_days) == 30 * GB
    assert plan.checkpoint_bytes_left(written=1008, days_after=30) == 30 * GB
    assert plan.checkpoint_bytes_left(written=1008, days_after=0.5) == plan.peak_bytes
    assert plan.checkpoint_bytes_left(written=2, days_after=0) == 2 * 10 * GB + (2 * 10 * GB if plan.parts_too else 0)


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_without_a_size_the_plan_assumes_one_and_says_so(cloud):
    s = _settings(cloud, steps=20_000, checkpointEverySteps=1000, checkpointEverySeconds=600, keepCheckpoints=3)
    plan = storage.storage_plan(s)
    assert (plan.checkpoint_bytes, plan.size_assumed) == (storage.ASSUMED_CHECKPOINT_BYTES, True)
    assert plan.written_max == 20 + WEEK_H * 6  # step checkpoints plus the time trigger's until the cap
    lines = storage.plan_lines(plan)
    assert lines[0].startswith("Checkpoint storage: one checkpoint 1.0 GiB (assumed; scale every figure")
    assert f"stop billing within {plan.billed_days:g} day(s)" in lines[1]
    assert "kept 30 days (storage.noncurrentDays)" in lines[2]


def test_a_run_checkpointing_by_steps_only_counts_every_pruned_checkpoint():
    s = _settings("aws", steps=5000, checkpointEverySteps=1000, checkpointEverySeconds=None, keepCheckpoints=2)
    plan = storage.storage_plan(s, checkpoint_bytes=GB)
    assert (plan.per_day, plan.written_max) == (None, 5)
    assert plan.noncurrent_bytes_max == 3 * GB
    assert "by steps only" in storage.plan_lines(plan)[0]
