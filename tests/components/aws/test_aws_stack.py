"""The whole AWS stack from the real stack files and from `__main__.py`'s own checks."""

from collections import Counter
from pathlib import Path

import pytest
import yaml

from components import registry
from components.code import boot_key, pack_boot_scripts
from ops import synth

ROOT = Path(__file__).resolve().parents[3]
ALL_STACK_FILES = sorted((ROOT / "stacks").glob("Pulumi.*.yaml"))


def _cloud(path: Path, key: str = "cloud", default: str = "aws") -> str:
    return (yaml.safe_load(path.read_text())["config"] or {}).get(f"trainstack:{key}", default)


# The AWS stacks of spot groups; a SageMaker stack's are in test_aws_job.py, a kubernetes
# stack makes a Job, no group (tests/components/kubernetes/).
STACK_FILES = [p for p in ALL_STACK_FILES if _cloud(p) == "aws" and _cloud(p, "scheduler", "groups") == "groups"]
EXPORTS = {"bucketName", "runUri", "imageRef", "groupName", "region", "watchCommand", "codeUri"}
EXPECTED_TYPES = {
    "trainstack:aws:TrainingStack": 1, "trainstack:aws:TrainingBucket": 1, "trainstack:aws:InstanceIdentity": 1,
    "trainstack:aws:ImageRepository": 1, "trainstack:aws:TrainerCode": 1, "trainstack:aws:SpotGroup": 1,
    "pulumi:providers:aws": 1, "aws:s3/bucket:Bucket": 1, "aws:s3/bucketVersioning:BucketVersioning": 1,
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": 1,
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": 1,
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls": 1, "aws:s3/bucketPolicy:BucketPolicy": 1,
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": 1, "aws:iam/role:Role": 1,
    "aws:iam/rolePolicy:RolePolicy": 1, "aws:iam/instanceProfile:InstanceProfile": 1,
    "aws:ecr/repository:Repository": 1, "aws:ecr/lifecyclePolicy:LifecyclePolicy": 1,
    "aws:s3/bucketObjectv2:BucketObjectv2": 2, "aws:ec2/securityGroup:SecurityGroup": 1,
    "aws:ec2/launchTemplate:LaunchTemplate": 1, "aws:autoscaling/group:Group": 1,
    "aws:autoscaling/schedule:Schedule": 1,
}

# What each placement has of its own: its region's provider and group.
PER_PLACEMENT = {"pulumi:providers:aws", "trainstack:aws:SpotGroup", "aws:ec2/securityGroup:SecurityGroup",
                 "aws:ec2/launchTemplate:LaunchTemplate", "aws:autoscaling/group:Group",
                 "aws:autoscaling/schedule:Schedule", "aws:ec2/placementGroup:PlacementGroup"}
# The placement controller, for two placements or more.
CONTROLLER_TYPES = {
    "trainstack:aws:PlacementController": 1, "aws:iam/role:Role": 2, "aws:iam/rolePolicy:RolePolicy": 3,
    "aws:cloudwatch/logGroup:LogGroup": 1, "aws:lambda/function:Function": 1,
    "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig": 1, "aws:scheduler/schedule:Schedule": 1,
}


def stack_config(path: Path) -> dict:
    cfg = yaml.safe_load(path.read_text())["config"]
    return {k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith("trainstack:")}


def test_both_example_stacks_exist_and_are_aws():
    names = [p.name for p in STACK_FILES]
    assert {"Pulumi.dev.yaml", "Pulumi.large.yaml", "Pulumi.multinode.yaml"} <= set(names)


@pytest.mark.parametrize("path", STACK_FILES, ids=lambda p: p.name)
def test_stack_file_synthesizes_the_whole_stack_with_its_outputs(path):
    cfg = stack_config(path)
    stack = path.name.removeprefix("Pulumi.").removesuffix(".yaml")
    run_id = cfg["run"].get("id") or stack
    r = synth.synthesize(path)
    # Several machines share a cluster placement group.
    expected = EXPECTED_TYPES | ({"aws:ec2/placementGroup:PlacementGroup": 1} if cfg["compute"]["nodes"] > 1 else {})
    # Several placements: a group (and its provider) per placement, and the controller at home.
    places = len(cfg.get("placements") or [None])
    expected = {k: v * places if k in PER_PLACEMENT else v for k, v in expected.items()}
    if places > 1:
        expected = dict(Counter(expected) + Counter(CONTROLLER_TYPES))
    assert dict(Counter(x["type"] for x in r.resources)) == expected
    assert set(r.outputs) == EXPORTS | ({"placements"} if places > 1 else set())
    bucket = r.outputs["bucketName"]
    assert r.outputs["runUri"] == f"s3://{bucket}/runs/{run_id}"
    assert r.outputs["codeUri"].startswith(f"s3://{bucket}/code/trainer-")
    assert r.outputs["region"] == cfg["region"]
    assert r.outputs["groupName"] == (f"trainstack-{stack}-gpu" if run_id == stack else f"trainstack-{stack}--{run_id}-gpu")
    # Pinned by the tag's digest (synth's stand-in for what `pulumi up` resolves).
    image = cfg["image"]
    assert r.outputs["imageRef"] == f"{image['repository']}@{registry.stand_in(image['repository'], image['tag'])}"
    assert r.outputs["watchCommand"] == f"python -m ops status --stack {stack}"
    asg = r.named("trainstack-group-asg")["inputs"]
    assert asg["maxSize"] == cfg["compute"]["nodes"]
    overrides = asg["mixedInstancesPolicy"]["launchTemplate"]["overrides"]
    home_types = cfg["compute"].get("instanceTypes") or cfg["placements"][0]["instanceTypes"]
    assert [o["instanceType"] for o in overrides] == home_types
    volume = r.named("trainstack-group-lt")["inputs"]["blockDeviceMappings"][0]["ebs"]
    assert volume["volumeSize"] == cfg["compute"]["rootDiskGb"]
    assert len(r.user_data) == places
    # The boot scripts' archive, packed from this checkout, is what every placement's env file names.
    boot = [x["inputs"]["key"] for x in r.of_type("aws:s3/bucketObjectv2:BucketObjectv2")
            if x["inputs"]["key"].startswith("code/boot-")]
    assert boot == [boot_key(pack_boot_scripts())]
    for user_data in r.user_data.values():
        assert f"TRAINSTACK_RUN_URI='{r.outputs['runUri']}'" in user_data
        assert f"TRAINSTACK_BOOT_URI='s3://{bucket}/{boot[0]}'" in user_data


def test_parents_form_one_tree_under_the_training_stack():
    r = synth.synthesize(ROOT / "stacks" / "Pulumi.dev.yaml")
    names = {x["name"] for x in r.resources}
    tops = [x for x in r.resources if x["parent"] is None]
    assert [(x["type"], x["name"]) for x in tops] == [("trainstack:aws:TrainingStack", "trainstack")]
    orphans = [x["name"] for x in r.resources if x["parent"] is not None and x["parent"] not in names]
    assert orphans == []
    children = [x["name"] for x in r.resources if x["parent"] == "trainstack"]
    assert len(children) == 6  # provider + five components


def test_invalid_config_stops_the_program_before_any_resource():
    bad = {"trainstack:region": "us-east-1", "trainstack:run": '{"synthetic": true, "stepz": 3}'}
    with pytest.raises(synth.ProgramError) as err:
        synth.run_program(bad, stack="bad", region="us-east-1")
    assert str(err.value) == "trainstack:run.stepz: unknown key; did you mean 'steps'?"
    assert type(err.value.__cause__).__name__ == "RunError"
    assert err.value.resources == []
