"""Tags: every taggable AWS resource carries project, stack and run; GCP labels are filtered."""

import pytest

from components.tags import aws_tags, gcp_labels
from tests.components.aws.helpers import SSH_KEY, synth_raw

EXPECTED = {"trainstack-project": "trainstack", "trainstack-stack": "tagged", "trainstack-run": "exp-7"}
TAGGABLE = {
    "aws:s3/bucket:Bucket", "aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile",
    "aws:ecr/repository:Repository", "aws:ec2/securityGroup:SecurityGroup",
    "aws:ec2/launchTemplate:LaunchTemplate", "aws:s3/bucketObjectv2:BucketObjectv2",
    "aws:ec2/keyPair:KeyPair", "aws:autoscaling/group:Group",
}


def tag_map(resource):
    tags = resource["inputs"].get("tags") or {}
    if isinstance(tags, list):  # the Auto Scaling group's tags are a list of {key, value}
        return {t["key"]: t["value"] for t in tags}
    return tags


def test_every_taggable_resource_is_tagged_with_project_stack_and_run():
    r = synth_raw({"access": {"sshPublicKey": SSH_KEY}}, stack="tagged")
    taggable = [x for x in r.resources if x["type"] in TAGGABLE]
    assert sorted({x["type"] for x in taggable}) == sorted(TAGGABLE)
    missing = [x["name"] for x in taggable if not EXPECTED.items() <= tag_map(x).items()]
    assert missing == []
    lt = r.of_type("aws:ec2/launchTemplate:LaunchTemplate")[0]
    specs = lt["inputs"]["tagSpecifications"]
    assert len(specs) == 2 and all(EXPECTED.items() <= s["tags"].items() for s in specs)


def test_aws_tags_keep_case_and_name():
    tags = aws_tags(project="trainstack", stack="Prod.EU", run_id="r1", name="box")
    assert tags["trainstack-stack"] == "Prod.EU" and tags["Name"] == "box"


@pytest.mark.parametrize(
    ("stack", "expected"),
    [("dev", "dev"), ("Prod-EU", "prod-eu"), ("prod.eu", None), ("x" * 64, None)],
)
def test_gcp_labels_are_lowercased_and_invalid_ones_dropped(stack, expected):
    labels = gcp_labels(project="trainstack", stack=stack, run_id="run-1")
    assert labels["trainstack-run"] == "run-1"
    assert labels.get("trainstack-stack") == expected
    assert all(k == k.lower() and v == v.lower() for k, v in labels.items())
