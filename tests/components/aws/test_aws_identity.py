"""InstanceIdentity: EC2 role, instance profile and a policy scoped to this stack."""

import json

import pytest
from parliament import analyze_policy_string

from runfolder import layout
from tests.components.aws.helpers import one, synth_raw

ROLE = "aws:iam/role:Role"
POLICY = "aws:iam/rolePolicy:RolePolicy"


def statements(result):
    return json.loads(one(result, POLICY)["inputs"]["policy"])["Statement"]


def as_list(value):
    return value if isinstance(value, list) else [value]


def test_role_trusts_only_ec2_and_profile_uses_it():
    r = synth_raw()
    trust = json.loads(one(r, ROLE)["inputs"]["assumeRolePolicy"])
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}]
    assert [s["Action"] for s in trust["Statement"]] == ["sts:AssumeRole"]
    profile = one(r, "aws:iam/instanceProfile:InstanceProfile")
    assert profile["inputs"]["role"].startswith("trainstack-identity-role")
    assert "trainstack-identity-role" in one(r, POLICY)["options"]["dependsOn"]


def test_no_wildcard_action_and_only_ecr_login_on_any_resource():
    r = synth_raw()
    stmts = statements(r)
    assert len(stmts) == 8
    actions = [a for s in stmts for a in as_list(s["Action"])]
    assert len(actions) >= 10
    assert [a for a in actions if "*" in a] == []
    wildcard = [s for s in stmts if "*" in as_list(s["Resource"])]
    assert [as_list(s["Action"]) for s in wildcard] == [["ecr:GetAuthorizationToken"]]
    assert all(s["Effect"] == "Allow" for s in stmts)


def test_s3_access_is_the_run_prefix_and_code_of_this_bucket():
    r = synth_raw({"storage": {"bucketName": "team-ckpts"}, "run": {"id": "exp-7"}})
    by_sid = {s["Sid"]: s for s in statements(r)}
    assert by_sid["ReadWriteRun"]["Resource"] == "arn:aws:s3:::team-ckpts/runs/exp-7/*"
    assert set(by_sid["ReadWriteRun"]["Action"]) >= {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}
    assert by_sid["ListRunPrefix"]["Resource"] == "arn:aws:s3:::team-ckpts"
    assert by_sid["ListRunPrefix"]["Condition"]["StringLike"]["s3:prefix"] == ["runs/exp-7/", "runs/exp-7/*"]
    assert by_sid["ReadTrainerCode"] == {
        "Sid": "ReadTrainerCode", "Effect": "Allow", "Action": "s3:GetObject",
        "Resource": "arn:aws:s3:::team-ckpts/code/*",
    }
    assert by_sid["ListPackageCache"] == {
        "Sid": "ListPackageCache", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::team-ckpts",
        "Condition": {"StringLike": {"s3:prefix": [layout.CACHE_PREFIX + "*"]}},
    }
    assert by_sid["ReadWritePackageCache"] == {
        "Sid": "ReadWritePackageCache", "Effect": "Allow",
        "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
        "Resource": "arn:aws:s3:::team-ckpts/cache/*",
    }
    s3_resources = [res for s in statements(r) if str(s["Action"]).count("s3:") for res in as_list(s["Resource"])]
    assert len(s3_resources) == 5
    assert all(res.startswith("arn:aws:s3:::team-ckpts") for res in s3_resources)


def test_data_uri_adds_read_only_access_to_that_prefix():
    r = synth_raw({"run": {"synthetic": False, "dataUri": "s3://corpus-bucket/lm/shards/"}})
    by_sid = {s["Sid"]: s for s in statements(r)}
    assert by_sid["ReadData"]["Action"] == "s3:GetObject"
    assert by_sid["ReadData"]["Resource"] == "arn:aws:s3:::corpus-bucket/lm/shards/*"
    assert by_sid["ListData"]["Resource"] == "arn:aws:s3:::corpus-bucket"
    assert by_sid["ListData"]["Condition"]["StringLike"]["s3:prefix"] == ["lm/shards/*"]
    synthetic = {s["Sid"] for s in statements(synth_raw())}
    assert len(synthetic) == 8 and not synthetic & {"ReadData", "ListData"}


def test_validation_data_uri_adds_read_only_access_to_its_own_prefix():
    r = synth_raw({"run": {"synthetic": False, "dataUri": "s3://corpus-bucket/train/",
                           "validationDataUri": "s3://held-out/shapes/validation/"}})
    by_sid = {s["Sid"]: s for s in statements(r)}
    assert by_sid["ReadValidationData"]["Action"] == "s3:GetObject"
    assert by_sid["ReadValidationData"]["Resource"] == "arn:aws:s3:::held-out/shapes/validation/*"
    assert by_sid["ListValidationData"]["Condition"]["StringLike"]["s3:prefix"] == ["shapes/validation/*"]
    assert by_sid["ReadData"]["Resource"] == "arn:aws:s3:::corpus-bucket/train/*"


def test_ecr_pull_and_scaling_are_this_stacks_repository_and_group():
    r = synth_raw(stack="scoped")
    by_sid = {s["Sid"]: s for s in statements(r)}
    repo = one(r, "aws:ecr/repository:Repository")["inputs"]["name"]
    assert by_sid["PullStackImage"]["Resource"] == f"arn:aws:ecr:eu-west-1:123456789012:repository/{repo}"
    assert "ecr:PutImage" not in by_sid["PullStackImage"]["Action"]
    group = r.outputs["groupName"]
    assert group == one(r, "aws:autoscaling/group:Group")["inputs"]["name"] == "trainstack-scoped--exp-7-gpu"
    assert by_sid["ScaleOwnGroup"]["Resource"] == (
        f"arn:aws:autoscaling:eu-west-1:123456789012:autoScalingGroup:*:autoScalingGroupName/{group}"
    )
    # Only the call the finish path makes, and only to set the group to zero: code on the
    # machine cannot raise the group's size (a cost attack).
    assert as_list(by_sid["ScaleOwnGroup"]["Action"]) == ["autoscaling:UpdateAutoScalingGroup"]
    assert by_sid["ScaleOwnGroup"]["Condition"] == {
        "NumericEquals": {"autoscaling:MinSize": "0", "autoscaling:MaxSize": "0"},
    }


@pytest.mark.parametrize("overrides", [{}, {"run": {"synthetic": False, "dataUri": "s3://corpus-bucket/x/"}}])
def test_parliament_finds_nothing_in_the_policy(overrides):
    policy = one(synth_raw(overrides), POLICY)["inputs"]["policy"]
    analyzed = analyze_policy_string(policy)
    assert len(json.loads(policy)["Statement"]) >= 6  # the linter saw the real document
    assert [(f.issue, f.detail) for f in analyzed.findings] == []


@pytest.mark.parametrize("nodes", [1, 2])
def test_no_group_may_list_instances(nodes):
    # Several machines find each other under the run folder (userdata/rendezvous.sh): the
    # policy is the same for one machine or many, with no instance listing.
    stmts = statements(synth_raw({"compute": {"nodes": nodes, "instanceTypes": ["g5.xlarge"]}}))
    assert not [s for s in stmts if s.get("Sid") == "FindPeers"]
    wildcard = sorted(a for s in stmts if "*" in as_list(s["Resource"]) for a in as_list(s["Action"]))
    assert wildcard == ["ecr:GetAuthorizationToken"]
    assert not [a for s in stmts for a in as_list(s["Action"]) if a.startswith("ec2:")]


def test_scale_conditions_use_the_documented_numeric_keys_of_the_action():
    # The IAM reference (as parliament ships it) lists MinSize and MaxSize, Numeric, for
    # UpdateAutoScalingGroup, and no DesiredCapacity key; a misspelt key would never match.
    import pathlib

    import parliament

    from components.aws.identity import SCALE_ACTIONS

    definition = json.loads((pathlib.Path(parliament.__file__).parent / "iam_definition.json").read_text())
    (service,) = [s for s in definition if s["prefix"] == "autoscaling"]
    kinds = {c["condition"]: c["type"] for c in service["conditions"]}
    (statement,) = [s for s in statements(synth_raw()) if s["Sid"] == "ScaleOwnGroup"]
    used = statement["Condition"]["NumericEquals"]
    for action in SCALE_ACTIONS:
        (privilege,) = [p for p in service["privileges"] if f"autoscaling:{p['privilege']}" == action]
        keys = {k for rt in privilege["resource_types"] for k in rt["condition_keys"]}
        assert set(used) <= keys, action
    assert {kinds[k] for k in used} == {"Numeric"}
    assert "autoscaling:DesiredCapacity" not in kinds
    # Nothing on the machine calls SetDesiredCapacity; the finish path sets min, max and desired.
    lib = (pathlib.Path(__file__).resolve().parents[3] / "userdata" / "lib.sh").read_text()
    assert "set-desired-capacity" not in lib
    assert "update-auto-scaling-group" in lib and "--min-size 0 --max-size 0 --desired-capacity 0" in lib
