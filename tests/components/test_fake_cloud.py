"""The month test's fake cloud keeps the rules its docstring names, and its engine diffs like Pulumi's.

Each rule is checked on its own (tests/fixtures/fake_cloud.py), so the month test's verdicts
rest on rules that are known to hold: a role id reserved 7 to 37 days after delete, bucket
names taken after a kept destroy, noncurrent versions billed until a rule in force removes them.
"""

from __future__ import annotations

import math
import uuid

import pytest

from tests.fixtures.fake_cloud import GCP_ROLE, Bucket, Engine, FakeCloud, Refused, Version

RAW = {
    "aws": {"cloud": "aws", "region": "eu-west-1", "run": {"id": "exp-1", "synthetic": True, "steps": 10},
            "compute": {"instanceTypes": ["g5.xlarge"]}},
    "gcp": {"cloud": "gcp", "region": "us-central1", "project": "my-proj-123",
            "run": {"id": "exp-1", "synthetic": True, "steps": 10}, "compute": {"instanceTypes": ["g2-standard-8"]}},
}


def test_a_deleted_custom_role_is_undeleted_within_7_days_and_its_id_reserved_until_day_37():
    cloud = FakeCloud("gcp", "us-central1", "http://127.0.0.1:9", project="p")
    role = {"roleId": "r_resize", "project": "p"}
    outcomes = []
    for deleted_on, created_on in [(0, 6.9), (10, 17.5), (20, 56.9), (60, 97.1)]:
        cloud.advance_to(deleted_on)
        if cloud.roles.get("r_resize", "absent") == "absent":
            cloud.create(GCP_ROLE, "x", role)
        cloud.delete(GCP_ROLE, "x", role, retain=False)
        cloud.advance_to(created_on)
        try:
            cloud.create(GCP_ROLE, "x", role)
            outcomes.append("created")
        except Refused as e:
            assert "You can't create a role_id (r_resize) which has been marked for deletion." in str(e)
            assert "Error 400" in str(e) and "failedPrecondition" in str(e)
            outcomes.append("refused")
            cloud.roles["r_resize"] = None  # as if created in the end, so the next round deletes it again
    assert outcomes == ["created", "refused", "refused", "created"]


@pytest.mark.parametrize(("kind", "region", "refused"), [("aws", "eu-west-1", "BucketAlreadyOwnedByYou"),
                                                          ("aws", "us-east-1", None),
                                                          ("gcp", "us-central1", "Error 409")])
def test_a_bucket_name_is_taken_once_created_except_by_s3_us_east_1(kind, region, refused, moto_server):
    cloud = FakeCloud(kind, region, moto_server, project="p")
    typ = "aws:s3/bucket:Bucket" if kind == "aws" else "gcp:storage/bucket:Bucket"
    name = f"month-{uuid.uuid4().hex[:12]}"
    cloud.create(typ, name, {"bucket": name, "name": name})
    cloud.delete(typ, name, {}, retain=True)  # `destroy` keeps it: the name stays taken
    if refused is None:
        cloud.create(typ, name, {"bucket": name, "name": name})  # legacy: 200 OK, no change
        assert list(cloud.buckets) == [name]
        return
    with pytest.raises(Refused, match=refused) as e:
        cloud.create(typ, name, {"bucket": name, "name": name})
    assert "Your previous request to create the named bucket succeeded and you already own it." in str(e.value)


def _version(noncurrent_since: float | None, key: str = "runs/r/checkpoints/ckpt-10/ckpt.index", newer: int = 1):
    return Version(key=key, size=100, created=0.2, noncurrent_since=noncurrent_since, newer=newer)


def test_s3_removes_a_noncurrent_version_at_the_midnight_after_its_noncurrent_days():
    cloud = FakeCloud("aws", "eu-west-1", "http://127.0.0.1:9")
    rule = {"id": "c", "status": "Enabled", "filter": {"prefix": "runs/r/checkpoints/"},
            "noncurrentVersionExpiration": {"noncurrentDays": 1}}
    bucket = Bucket("b", versioning=True, configs=[(0.0, [rule], 0.0)])
    assert cloud.billed_until(bucket, _version(1.5)) == 3.0  # day 2.5, rounded up to the next midnight
    assert cloud.billed_until(bucket, _version(None)) == math.inf  # the live version stays
    assert cloud.billed_until(bucket, _version(1.5, key="runs/r/events.jsonl")) == math.inf  # another prefix
    # A rule that arrives later removes what is already eligible on the day it arrives.
    late = Bucket("b", versioning=True, configs=[(0.0, [], 0.0), (5.0, [rule], 0.0)])
    assert cloud.billed_until(late, _version(1.5)) == 5.0
    # A rule removed before the version is eligible never removes it.
    gone = Bucket("b", versioning=True, configs=[(0.0, [rule], 0.0), (2.0, [], 0.0)])
    assert cloud.billed_until(gone, _version(1.5)) == math.inf


def test_gcs_keeps_a_removed_version_soft_deleted_for_the_retention():
    cloud = FakeCloud("gcp", "us-central1", "http://127.0.0.1:9")
    rule = {"action": {"type": "Delete"}, "condition": {"daysSinceNoncurrentTime": 1, "withState": "ARCHIVED",
                                                         "matchesPrefixes": ["runs/r/checkpoints/"]}}
    default = Bucket("b", versioning=True, configs=[(0.0, [rule], 7 * 86_400.0)])
    assert cloud.billed_until(default, _version(1.5)) == pytest.approx(2.5 + 7)
    none = Bucket("b", versioning=True, configs=[(0.0, [rule], 0.0)])
    assert cloud.billed_until(none, _version(1.5)) == pytest.approx(2.5)
    with pytest.raises(NotImplementedError, match="deletes live objects"):
        cloud.billed_until(Bucket("b", configs=[(0.0, [{"action": {"type": "Delete"}, "condition": {"age": 3}}], 0.0)]),
                           _version(1.5))


@pytest.mark.parametrize("kind", ["aws", "gcp"])
def test_the_engine_changes_nothing_on_the_same_up_and_keeps_an_ignored_size(kind, moto_server):
    base = RAW[kind]
    cloud = FakeCloud(kind, base["region"], moto_server, project=base.get("project", ""))
    engine = Engine(cloud, f"month-{uuid.uuid4().hex[:6]}")
    first = engine.up(base)
    creates = [u for op, u in first.steps if op == "create"]
    assert len(creates) >= 10 and cloud.machines() == 1
    (group,) = cloud.groups
    cloud.resize(group, 0)  # the run's finish
    again = engine.up(base)
    assert {op for op, _ in again.steps} == {"same"} and len(again.steps) == len(first.steps)
    assert cloud.machines() == 0  # the size is ignored: a finished run is not relaunched
    # Without adoption, the kept bucket's name is taken: the cloud refuses the create.
    gone = engine.destroy()
    assert sum(op == "forget" for op, _ in gone) >= 1 and cloud.groups == {}
    with pytest.raises(Refused, match="409"):
        engine.up(base)


def test_s3_tag_filters_and_gcs_custom_time_match_only_marked_versions():
    marked = Version(key="runs/r/checkpoints/ckpt-10/ckpt.index", size=1, created=0.2, noncurrent_since=1.5, newer=1,
                     tags={"trainstack-kind": "checkpoint"}, custom_time=0.2)
    plain = Version(key="runs/r/events.jsonl", size=1, created=0.2, noncurrent_since=1.5, newer=1)
    aws = FakeCloud("aws", "eu-west-1", "http://127.0.0.1:9")
    tagged = {"id": "c", "status": "Enabled", "filter": {"tag": {"key": "trainstack-kind", "value": "checkpoint"}},
              "noncurrentVersionExpiration": {"noncurrentDays": 1}}
    s3 = Bucket("b", versioning=True, configs=[(0.0, [tagged], 0.0)])
    assert [aws.billed_until(s3, v) for v in (marked, plain)] == [3.0, math.inf]
    gcp = FakeCloud("gcp", "us-central1", "http://127.0.0.1:9")
    custom = {"action": {"type": "Delete"}, "condition": {"daysSinceNoncurrentTime": 1, "daysSinceCustomTime": 1,
                                                           "withState": "ARCHIVED"}}
    gcs = Bucket("b", versioning=True, configs=[(0.0, [custom], 0.0)])
    # Both conditions hold a day after the later of the two times (noncurrent on day 1.5).
    assert [gcp.billed_until(gcs, v) for v in (marked, plain)] == [pytest.approx(2.5), math.inf]
