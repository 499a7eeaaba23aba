"""A second run on the same stack: a new `run.id` and `pulumi up` start it; the old run stays put.

After a run ends its group is at zero and Pulumi ignores the group's size, and AWS has deleted the
fired runtime-cap action. So the run id is part of the group's name: a new id is a new group
(launched at `nodes`, with a runtime cap computed anew), the old run's group (at zero) is
deleted, the bucket and the old run's folder are kept. The same id again changes nothing.
"""

from __future__ import annotations

import pytest

from components.aws.naming import group_name as aws_group_name
from components.gcp.naming import group_name as gcp_group_name
from tests.components.aws.helpers import synth_raw
from tests.components.gcp.helpers import gcp

GROUP = {"aws": "aws:autoscaling/group:Group", "gcp": "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager"}
CAP = {"aws": "aws:autoscaling/schedule:Schedule", "gcp": "gcp:cloudscheduler/job:Job"}
BUCKET = {"aws": "aws:s3/bucket:Bucket", "gcp": "gcp:storage/bucket:Bucket"}


def _synth(cloud: str, run_id: str):
    run = {"id": run_id, "synthetic": True, "steps": 100}
    return synth_raw({"run": run, "compute": {"nodes": 2, "instanceTypes": ["g5.12xlarge"], "gpusPerNode": 4}}) \
        if cloud == "aws" else gcp({"run": run, "compute": {"nodes": 2}})


def _only(result, token: str) -> dict:
    (r,) = result.of_type(token)
    return r["inputs"]


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_a_new_run_id_is_a_new_group_at_full_size_with_a_fresh_cap_and_the_same_bucket(cloud):
    first, second = _synth(cloud, "exp-7"), _synth(cloud, "exp-8")
    g1, g2 = _only(first, GROUP[cloud]), _only(second, GROUP[cloud])
    assert g1["name"] != g2["name"]  # a new physical name: Pulumi replaces the group
    assert g2["name"].endswith("--exp-8-gpu") and g1["name"].endswith("--exp-7-gpu")
    size = "desiredCapacity" if cloud == "aws" else "targetSize"
    assert g1[size] == g2[size] == 2
    cap1, cap2 = _only(first, CAP[cloud]), _only(second, CAP[cloud])
    name_key = "scheduledActionName" if cloud == "aws" else "name"
    assert cap1[name_key] != cap2[name_key] and g2["name"] in cap2[name_key]  # a new cap, computed at this up
    # The bucket (and so the old run's folder) stays: only its run tag/label is updated in place.
    untagged = [{k: v for k, v in _only(r, BUCKET[cloud]).items() if k not in ("tags", "labels")}
                for r in (first, second)]
    assert untagged[0] == untagged[1] and untagged[0]
    assert first.outputs["runUri"].endswith("/runs/exp-7") and second.outputs["runUri"].endswith("/runs/exp-8")
    (text,) = second.user_data.values()
    assert "runs/exp-8" in text and "runs/exp-7" not in text  # nothing of the old run restarts


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_same_run_id_again_changes_no_group(cloud):
    a, b = _synth(cloud, "exp-7"), _synth(cloud, "exp-7")
    assert _only(a, GROUP[cloud])["name"] == _only(b, GROUP[cloud])["name"]


@pytest.mark.parametrize("group_name", [aws_group_name, gcp_group_name])
def test_group_names_keep_runs_and_stacks_apart(group_name):
    # The default run id (the stack's name) keeps the name a stack always had.
    assert group_name(project="trainstack", stack="dev", run_id="dev") == group_name(project="trainstack", stack="dev")
    # Stack dev running x is not stack dev-x running its default run.
    assert group_name(project="trainstack", stack="dev", run_id="x") != group_name(project="trainstack", stack="dev-x")
    names = {group_name(project="trainstack", stack="dev", run_id=f"exp-{i}") for i in range(50)}
    assert len(names) == 50


def test_gcp_group_name_fits_with_a_long_run_id():
    long_run = "a-very-long-run-identifier-for-the-transformer-sweep-number-0"  # 61 characters
    names = {gcp_group_name(project="trainstack", stack="research-team-stack", run_id=f"{long_run}{i}")
             for i in range(3)}
    assert len(names) == 3 and all(len(n) <= 54 for n in names)


def test_aws_group_name_stays_within_the_limit_with_long_stack_and_run():
    name = aws_group_name(project="p" * 40, stack="s" * 160, run_id="r" * 63)
    assert len(name + "-placement") <= 255 and "--" in name
    assert name != aws_group_name(project="p" * 40, stack="s" * 160, run_id="r" * 62)
