"""components/multicloud: the placement list walked once, one floor above the two clouds.

The resources it builds are checked under the mocks by test_cross_cloud_placements.py (an AWS home's GCP
placement) and test_gcp_home_aws_placement.py (a GCP home's AWS placement); here, the plan itself.
"""

import pytest

from components import multicloud, placement
from components.common import Placements
from components.multicloud.aws_placements import AwsPlacements
from components.multicloud.gcp_placements import GcpPlacements
from components.settings import load_settings

PROJECT = "my-gpus-42"
# Long enough that GCE's name (at most 63 characters, RFC 1035) is not AWS's.
STACK = "a-very-long-stack-name-for-placements-that-goes-on"
AWS_HOME = f"trainstack-{STACK}--exp-7-gpu"
GCE_HOME = "trainstack-a-very-long-stack-name-for-pl--cfd4a3a3-gpu"
RAW = {
    "cloud": "aws", "region": "us-east-1", "run": {"id": "exp-7", "synthetic": True, "steps": 100},
    "placements": [{"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge"]},
                   {"cloud": "aws", "region": "us-west-2", "instanceTypes": ["g5.xlarge"]},
                   {"cloud": "gcp", "region": "us-central1", "project": PROJECT, "instanceTypes": ["g2-standard-4"]}],
}


def test_the_plan_names_each_group_as_its_cloud_does_and_moves_the_settings_to_each_placement():
    s = load_settings(RAW, stack=STACK)
    plan = multicloud.plan(s, "trainstack")
    # An AWS group name for the AWS placements, a GCE one for the GCP one.
    assert plan.groups == [AWS_HOME, f"{AWS_HOME}-p1", f"{GCE_HOME}-p2"]
    assert [(p.cloud, p.region, p.compute.instance_types) for p in plan.settings] == [
        ("aws", "us-east-1", ["g5.xlarge"]), ("aws", "us-west-2", ["g5.xlarge"]),
        ("gcp", "us-central1", ["g2-standard-4"])]
    assert plan.settings[0] is s and plan.settings[2].project == PROJECT
    assert isinstance(plan.other_cloud, GcpPlacements)
    # The controller's document names the same groups, and `access` for the other cloud's placement only.
    doc = placement.controller_config(s, "s3://b/runs/exp-7", plan.groups, {2: {"k": "v"}})
    assert [p["group"] for p in doc["placements"]] == plan.groups
    assert plan.config("s3://b/runs/exp-7", {2: {"k": "v"}}).count('"access"') == 1


def test_a_gcp_home_gets_the_aws_builder_and_one_cloud_none():
    gcp_home = load_settings({"cloud": "gcp", "project": PROJECT, "region": "us-central1",
                              "run": {"id": "r", "synthetic": True},
                              "placements": [{"cloud": "gcp", "region": "us-central1", "project": PROJECT,
                                              "instanceTypes": ["g2-standard-4"]},
                                             {"cloud": "aws", "region": "us-east-1", "instanceTypes": ["g5.xlarge"]}],
                              "image": {"repository": "tensorflow/tensorflow"}}, stack="mix")
    assert isinstance(multicloud.plan(gcp_home, "trainstack").other_cloud, AwsPlacements)
    one_cloud = load_settings({**RAW, "placements": RAW["placements"][:2]}, stack="places")
    assert multicloud.plan(one_cloud, "trainstack").other_cloud is None


def test_a_stack_of_several_placements_built_without_the_plan_is_refused_naming_what_builds_it():
    s = load_settings(RAW, stack="places")
    with pytest.raises(ValueError, match=r"lists 3 placements: build the stack with components\.multicloud"):
        Placements.alone(s, "g")
    alone = Placements.alone(load_settings({k: v for k, v in RAW.items() if k != "placements"}, stack="one"), "g")
    assert alone.groups == ["g"] and alone.other_cloud is None
