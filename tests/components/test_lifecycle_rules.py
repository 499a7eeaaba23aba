"""The buckets' rendered lifecycle rules, applied by tests/fixtures/lifecycle.py as each cloud documents them.

Both clouds: a pruned checkpoint's version (marked by the trainer: an S3 tag, a GCS Custom-Time)
stops billing within 2 days of being pruned; any other version keeps `storage.noncurrentDays`;
a live version is never touched. The S3 midnight rounding and the GCS soft-delete retention
are what make the difference between the two.
"""

from datetime import UTC, datetime, timedelta

import pytest

from runfolder import layout
from tests.components.aws import helpers as aws_helpers
from tests.components.gcp import helpers as gcp_helpers
from tests.fixtures import lifecycle

NAME = "runs/exp-7/checkpoints/ckpt-100/ckpt.data-00000-of-00001"
T0 = datetime(2026, 1, 1, 8, 0, tzinfo=UTC)


def _remover(cloud: str, overrides: dict | None = None):
    if cloud == "aws":
        config = aws_helpers.one(aws_helpers.synth_raw(overrides),
                             "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
        rules = config["inputs"]["rules"]
        return lambda v: lifecycle.s3_removal(v, rules)
    bucket = gcp_helpers.one(gcp_helpers.gcp(overrides), "gcp:storage/bucket:Bucket")["inputs"]
    return lambda v: lifecycle.gcs_removal(v, bucket["lifecycleRules"], lifecycle.gcs_soft_delete(bucket))


def _version(cloud: str, name: str, *, pruned_at: datetime | None, marked: bool) -> lifecycle.Version:
    mark = {"tags": {layout.CHECKPOINT_TAG_KEY: layout.CHECKPOINT_TAG_VALUE}} if cloud == "aws" else {"custom_time": T0}
    return lifecycle.Version(name=name, size=10, created=T0, noncurrent_since=pruned_at, **(mark if marked else {}))


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
@pytest.mark.parametrize("hour", [0, 12, 23])
def test_a_pruned_checkpoint_stops_billing_within_two_days(cloud, hour):
    pruned = datetime(2026, 1, 2, hour, 30, tzinfo=UTC)
    removal = _remover(cloud)(_version(cloud, NAME, pruned_at=pruned, marked=True))
    days = removal.days_after(pruned)
    if cloud == "aws":
        # 1 day after, rounded up to the next midnight UTC.
        assert removal.rule == "expire-noncurrent-checkpoints"
        assert removal.billed_until == datetime(2026, 1, 4, tzinfo=UTC)
        assert 1 < days <= 2
    else:
        assert "daysSinceCustomTime=1" in removal.rule
        assert days == 1


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_other_versions_keep_the_noncurrent_window(cloud):
    remove = _remover(cloud, {"storage": {"noncurrentDays": 12}})
    pruned = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
    # Unmarked: the model, events, logs (and a checkpoint written before the trainer marked them).
    for name in ("runs/exp-7/model/saved_model.pb", NAME):
        days = remove(_version(cloud, name, pruned_at=pruned, marked=False)).days_after(pruned)
        assert 12 <= days <= 13
    assert remove(_version(cloud, NAME, pruned_at=None, marked=True)) is None  # live: never removed


def test_the_old_rules_kept_pruned_checkpoints_for_weeks():
    """The rules before checkpoints had their own (one noncurrent rule, GCS soft delete on): 30 and 37 days."""
    pruned = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
    v = lifecycle.Version(name=NAME, size=10, created=T0, noncurrent_since=pruned, custom_time=T0,
                          tags={layout.CHECKPOINT_TAG_KEY: layout.CHECKPOINT_TAG_VALUE})
    s3_old = [{"id": "expire-noncurrent-versions", "status": "Enabled", "filter": {"prefix": ""},
               "noncurrentVersionExpiration": {"noncurrentDays": 30}}]
    gcs_old = [{"action": {"type": "Delete"}, "condition": {"daysSinceNoncurrentTime": 30, "withState": "ARCHIVED"}}]
    assert lifecycle.s3_removal(v, s3_old).days_after(pruned) == 30.5
    assert lifecycle.gcs_removal(v, gcs_old, lifecycle.gcs_soft_delete({})).days_after(pruned) == 37
    assert lifecycle.byte_days([v], [None]) == float("inf")


def test_the_evaluator_refuses_rules_it_cannot_read():
    v = lifecycle.Version(name=NAME, size=1, created=T0, noncurrent_since=T0 + timedelta(days=1))
    with pytest.raises(ValueError, match="objectSizeGreaterThan"):
        lifecycle.s3_removal(v, [{"id": "x", "status": "Enabled", "filter": {"objectSizeGreaterThan": 5},
                                  "noncurrentVersionExpiration": {"noncurrentDays": 1}}])
    with pytest.raises(ValueError, match="noncurrentTimeBefore"):
        lifecycle.gcs_removal(v, [{"action": {"type": "Delete"}, "condition": {"noncurrentTimeBefore": "2026-01-01"}}])
