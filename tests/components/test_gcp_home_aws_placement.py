"""A GCP-home stack with an AWS placement, under the mocks (`ops synth` of the real `__main__.py` on
stacks/Pulumi.gcp-aws.yaml, and on a variant reading its data from GCS).

The AWS placement's Auto Scaling group is made in its region, through a provider of that region, at size
zero, its machines running as a role that may set that group to zero and nothing else (nothing in S3: the
run folder is in home's GCS bucket). In home's project a workload identity pool's AWS provider trusts the
placement's AWS account and admits that role's sessions only; they may impersonate one service account,
granted on home's bucket what home's machines get there. The machines' env file names the provider and the
account. Home's controller reaches the AWS group through a role trusting its service account's Google ID
tokens for one audience; `controller_config` tells it which.
"""

from __future__ import annotations

import json
import re
from functools import cache

import yaml

from components import registry, userdata
from components.aws.federation import GOOGLE, controller_audience, controller_role_name
from components.aws.naming import group_name as aws_group_name
from components.gcp.federation import AWS_ATTRIBUTE_MAPPING, MACHINES_PROVIDER_ID
from components.machine import ENV_FILE
from components.project import USERDATA_DIR
from components.settings import load_stack_file
from controller import config as controller_config
from controller.grants import aws_group_policy
from ops import synth
from ops.fakes.common import fake_hex

STACK_FILE = synth.STACKS_DIR / "Pulumi.gcp-aws.yaml"
PROJECT = "my-project-123"
REGION = "us-east-1"
RUN_ID = "gcp-aws"
HOME_ASG = aws_group_name(project="trainstack", stack="gcp-aws", run_id=RUN_ID)
GROUP = f"{HOME_ASG}-p1"
MIG = "trainstack-gcp-aws-gpu"
# The same placements, the data in GCS: the account's grants reach the data bucket too.
WITH_DATA = {
    "cloud": "gcp", "region": "us-central1", "project": PROJECT,
    "run": {"id": "exp-7", "dataUri": "gs://my-data/train/", "steps": 100},
    "placements": [{"cloud": "gcp", "region": "us-central1", "project": PROJECT, "instanceTypes": ["g2-standard-4"]},
                   {"cloud": "aws", "region": REGION, "instanceTypes": ["g5.xlarge", "g6.xlarge"],
                    "zones": ["us-east-1a", "us-east-1b"]}],
}


@cache
def synthesized(which: str = "example") -> synth.Result:
    return synth.synthesize(STACK_FILE) if which == "example" else synth.synthesize(WITH_DATA, stack="data")


def _unique_id(resource_name: str) -> str:
    """The fake cloud's unique id of a service account (ops/fakes/gcp.py: from the resource's fake hex)."""
    return str(int(fake_hex("gcp:serviceaccount/account:Account", resource_name)[:15], 16))


def _generated(r: synth.Result, resource_name: str) -> str:
    """A role's generated name, as the fake cloud makes it (ops/fakes/aws.py)."""
    return f"{resource_name}-{fake_hex('aws:iam/role:Role', resource_name)[:7]}"


def _env(text: str) -> dict[str, str]:
    (content,) = [f["content"] for f in yaml.safe_load(text)["write_files"] if f["path"] == ENV_FILE]
    return {k: v.strip("'") for k, v in (line.split("=", 1) for line in content.splitlines())}


def _providers(r: synth.Result) -> dict[str, dict]:
    return {x["name"]: x["inputs"] for x in r.resources if x["type"].startswith("pulumi:providers:")}


def _machine_account(r: synth.Result) -> dict:
    (account,) = [a for a in r.of_type("gcp:serviceaccount/account:Account")
                  if a["parent"] == "trainstack-machine-access-p1"]
    return account


def _email(account: dict) -> str:
    return f"{account['inputs']['accountId']}@{PROJECT}.iam.gserviceaccount.com"


def _assumed(r: synth.Result) -> str:
    return f"arn:aws:sts::{synth.FAKE_ACCOUNT}:assumed-role/{_generated(r, 'trainstack-identity-p1-role')}"


def test_the_aws_group_is_in_its_region_at_zero_with_imdsv2_the_container_reaches():
    r = synthesized()
    (asg,) = r.of_type("aws:autoscaling/group:Group")
    inputs = asg["inputs"]
    assert inputs["name"] == GROUP and (inputs["minSize"], inputs["maxSize"], inputs["desiredCapacity"]) == (0, 1, 0)
    assert _providers(r)[asg["options"]["provider"]]["region"] == REGION
    distribution = inputs["mixedInstancesPolicy"]["instancesDistribution"]
    # Spot, with no maximum price: EC2 caps it at the on-demand price.
    assert distribution["onDemandPercentageAboveBaseCapacity"] == 0 and "spotMaxPrice" not in distribution
    assert [o["instanceType"] for o in inputs["mixedInstancesPolicy"]["launchTemplate"]["overrides"]] == \
        ["g5.xlarge", "g6.xlarge"]
    (lt,) = r.of_type(synth.LAUNCH_TEMPLATE)
    options = lt["inputs"]["metadataOptions"]
    assert (options["httpTokens"], options["httpEndpoint"]) == ("required", "enabled")
    # Hop limit 1 holds because the trainer's container (whose google-auth reads the role's credentials
    # from IMDS) and the boot's share the host's network: behind a bridge they would need 2.
    assert options["httpPutResponseHopLimit"] == 1
    runs = [line for name in ("supervise.sh", "bootstrap.sh") for line in (USERDATA_DIR / name).read_text().splitlines()
            if not line.lstrip().startswith("#") and re.search(r"\bdocker run\b|args=\(run ", line)]
    assert len(runs) == 2 and all("--network host" in line for line in runs), runs
    (schedule,) = r.of_type("aws:autoscaling/schedule:Schedule")
    assert schedule["inputs"]["scheduledActionName"] == f"{GROUP}-runtime-cap"
    assert (schedule["inputs"]["minSize"], schedule["inputs"]["maxSize"]) == (0, 0)
    # A machine waits for its role's policy, the pool's provider and every grant of its account.
    grants = {m["name"] for m in r.resources if m["parent"] == "trainstack-machine-access-p1"
              and m["type"] in ("gcp:storage/bucketIAMMember:BucketIAMMember", "gcp:serviceaccount/iAMMember:IAMMember")}
    assert len(grants) == 5
    assert {"trainstack-identity-p1-policy", "trainstack-machine-access-p1-provider", *grants} <= \
        set(asg["options"]["dependsOn"])


def test_the_group_takes_its_regions_default_vpc_narrowed_to_the_placements_zones():
    r = synthesized("data")
    aws_calls = [c for c in r.invokes if c["token"].startswith("aws:")]
    assert aws_calls and {c["provider"] for c in aws_calls} == {"trainstack-aws-p1"}
    (vpc,) = [c for c in aws_calls if c["token"] == "aws:ec2/getVpc:getVpc"]
    (subnets,) = [c for c in aws_calls if c["token"] == "aws:ec2/getSubnets:getSubnets"]
    assert vpc["args"] == {"default": True}
    assert {"name": "availability-zone", "values": ["us-east-1a", "us-east-1b"]} in subnets["args"]["filters"]
    (asg,) = r.of_type("aws:autoscaling/group:Group")
    assert asg["inputs"]["vpcZoneIdentifiers"]
    # The public image of the Deep Learning AMI: no AMI of home's (GCP) choosing.
    (ami,) = [c for c in aws_calls if c["token"] == "aws:ec2/getAmi:getAmi"]
    assert ami["args"]["owners"] == ["amazon"]


def test_the_aws_machines_user_data_names_the_gcs_store_the_provider_and_the_account():
    r = synthesized()
    (lt,) = r.of_type(synth.LAUNCH_TEMPLATE)
    text = userdata.decode_user_data(lt["inputs"]["userData"])
    env = _env(text)
    (provider,) = r.of_type("gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider")
    (pool,) = r.of_type("gcp:iam/workloadIdentityPool:WorkloadIdentityPool")
    assert (env["TRAINSTACK_CLOUD"], env["TRAINSTACK_REGION"], env["TRAINSTACK_GROUP"]) == ("aws", REGION, GROUP)
    assert env["TRAINSTACK_RUN_URI"] == r.outputs["runUri"] and env["TRAINSTACK_RUN_URI"].startswith("gs://")
    assert env["TRAINSTACK_IMAGE"] == f"tensorflow/tensorflow@{registry.stand_in('tensorflow/tensorflow', '2.21.0-gpu')}"
    assert env["TRAINSTACK_STORE_CLOUD"] == "gcp"
    assert re.fullmatch(r"//iam\.googleapis\.com/projects/\d+/locations/global/workloadIdentityPools/"
                        + re.escape(pool["inputs"]["workloadIdentityPoolId"]) + "/providers/" + MACHINES_PROVIDER_ID,
                        env["TRAINSTACK_GCP_AUDIENCE"])
    assert provider["inputs"]["workloadIdentityPoolProviderId"] == MACHINES_PROVIDER_ID
    assert env["TRAINSTACK_GCP_SERVICE_ACCOUNT"] == _email(_machine_account(r))
    # No AWS store: the run folder is home's.
    assert not {"AWS_ROLE_ARN", "TRAINSTACK_STORE_REGION", "TRAINSTACK_TOKEN_AUDIENCE"} & set(env)
    paths = [f["path"] for f in yaml.safe_load(text)["write_files"]]
    assert "/opt/trainstack/bin/federation-gcp.sh" in paths
    # Home's GCE machines read their own store: no federation there.
    (template,) = r.of_type(synth.INSTANCE_TEMPLATE)
    home = r.user_data[template["name"]]
    assert "TRAINSTACK_STORE_CLOUD" not in _env(home)
    assert "/opt/trainstack/bin/federation-gcp.sh" not in [f["path"] for f in yaml.safe_load(home)["write_files"]]


def test_the_machine_role_may_set_its_own_group_to_zero_and_nothing_else():
    r = synthesized()
    (role,) = [x for x in r.of_type("aws:iam/role:Role") if x["parent"] == "trainstack-identity-p1"]
    trust = json.loads(role["inputs"]["assumeRolePolicy"])
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}]
    (policy,) = [x for x in r.of_type("aws:iam/rolePolicy:RolePolicy") if x["parent"] == "trainstack-identity-p1"]
    statements = json.loads(policy["inputs"]["policy"])["Statement"]
    assert statements == [{
        "Sid": "ScaleOwnGroup", "Effect": "Allow", "Action": ["autoscaling:UpdateAutoScalingGroup"],
        "Resource": f"arn:aws:autoscaling:{REGION}:{synth.FAKE_ACCOUNT}:autoScalingGroup:*:autoScalingGroupName/{GROUP}",
        "Condition": {"NumericEquals": {"autoscaling:MinSize": "0", "autoscaling:MaxSize": "0"}}}]
    (profile,) = r.of_type("aws:iam/instanceProfile:InstanceProfile")
    (lt,) = r.of_type(synth.LAUNCH_TEMPLATE)
    assert lt["inputs"]["iamInstanceProfile"]["arn"].endswith(f"/{profile['name']}-" +
                                                              fake_hex("aws:iam/instanceProfile:InstanceProfile",
                                                                       profile["name"])[:7])
    # Nothing of S3 or ECR anywhere in the stack.
    assert not [x for x in r.resources if x["type"].startswith(("aws:s3", "aws:ecr"))]


def test_the_pool_trusts_the_placements_account_and_admits_the_machine_role_only():
    r = synthesized()
    (pool,) = r.of_type("gcp:iam/workloadIdentityPool:WorkloadIdentityPool")
    (provider,) = r.of_type("gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider")
    assert pool["inputs"]["project"] == provider["inputs"]["project"] == PROJECT
    assert _providers(r)[provider["options"]["provider"]]["project"] == PROJECT
    assert provider["inputs"]["aws"] == {"accountId": synth.FAKE_ACCOUNT}
    assert provider["inputs"]["attributeMapping"] == AWS_ATTRIBUTE_MAPPING
    assert provider["inputs"]["attributeCondition"] == f'attribute.aws_role == "{_assumed(r)}"'
    pool_id = pool["inputs"]["workloadIdentityPoolId"]
    assert 4 <= len(pool_id) <= 32 and not pool_id.startswith("gcp-") and re.fullmatch(r"[a-z0-9-]+", pool_id)
    # The token exchange and the impersonation go through home's project: their APIs are on.
    services = {s["inputs"]["service"] for s in r.of_type("gcp:projects/service:Service")}
    assert {"sts.googleapis.com", "iamcredentials.googleapis.com"} <= services


def test_only_that_principal_set_may_impersonate_the_machines_account():
    r = synthesized()
    (pool,) = r.of_type("gcp:iam/workloadIdentityPool:WorkloadIdentityPool")
    (binding,) = r.of_type("gcp:serviceaccount/iAMMember:IAMMember")
    account = _machine_account(r)
    assert binding["inputs"]["role"] == "roles/iam.workloadIdentityUser"
    pool_name = f"projects/{_pool_number(r)}/locations/global/workloadIdentityPools/{pool['inputs']['workloadIdentityPoolId']}"
    assert binding["inputs"]["member"] == f"principalSet://iam.googleapis.com/{pool_name}/attribute.aws_role/{_assumed(r)}"
    assert binding["inputs"]["serviceAccountId"].endswith(f"/serviceAccounts/{_email(account)}")
    assert account["inputs"]["project"] == PROJECT


def _pool_number(r: synth.Result) -> str:
    (lt,) = r.of_type(synth.LAUNCH_TEMPLATE)
    audience = _env(userdata.decode_user_data(lt["inputs"]["userData"]))["TRAINSTACK_GCP_AUDIENCE"]
    return audience.split("/")[4]


def _grants(r: synth.Result, member: str) -> dict[str, tuple[str, str, str | None]]:
    """BucketIAMMember grants to `member`, by the part of the name after the component's: (bucket, role, condition)."""
    return {m["name"].rsplit("-", 2)[-2] + "-" + m["name"].rsplit("-", 2)[-1]:
            (m["inputs"]["bucket"], m["inputs"]["role"], (m["inputs"].get("condition") or {}).get("expression"))
            for m in r.of_type("gcp:storage/bucketIAMMember:BucketIAMMember") if m["inputs"]["member"] == member}


def test_the_machines_account_gets_on_homes_bucket_exactly_what_homes_machines_get():
    for which, run_id, data in (("example", RUN_ID, False), ("data", "exp-7", True)):
        r = synthesized(which)
        (home_account,) = [a for a in r.of_type("gcp:serviceaccount/account:Account")
                           if a["parent"] == "trainstack-identity"]
        away = _grants(r, f"serviceAccount:{_email(_machine_account(r))}")
        home = _grants(r, f"serviceAccount:{_email(home_account)}")
        assert away == home, which
        bucket = r.outputs["bucketName"]
        assert away["run-objects"] == (bucket, "roles/storage.objectUser",
                                       'resource.type == "storage.googleapis.com/Bucket" || resource.name.startsWith('
                                       f'"projects/_/buckets/{bucket}/objects/runs/{run_id}/")')
        assert sorted(away) == sorted(["run-objects", "code-read", "cache-read", "cache-write"]
                                      + (["data-read"] if data else []))
        if data:
            assert away["data-read"] == ("my-data", "roles/storage.objectViewer", None)


def test_the_controllers_aws_role_trusts_its_service_account_for_one_audience_and_sizes_that_group_only():
    r = synthesized()
    (role,) = [x for x in r.of_type("aws:iam/role:Role") if x["parent"] == "trainstack-controller-aws"]
    assert role["inputs"]["name"] == controller_role_name(HOME_ASG) and len(role["inputs"]["name"]) <= 64
    uid = _unique_id("trainstack-controller-sa")
    trust = json.loads(role["inputs"]["assumeRolePolicy"])
    assert trust["Statement"] == [{
        "Effect": "Allow", "Principal": {"Federated": GOOGLE}, "Action": "sts:AssumeRoleWithWebIdentity",
        "Condition": {"StringEquals": {"accounts.google.com:sub": uid, "accounts.google.com:aud": uid,
                                       "accounts.google.com:oaud": controller_audience(MIG)}}}]
    assert uid.isdigit()
    (policy,) = [x for x in r.of_type("aws:iam/rolePolicy:RolePolicy") if x["parent"] == "trainstack-controller-aws"]
    assert json.loads(policy["inputs"]["policy"]) == aws_group_policy(groups=[(REGION, GROUP)], nodes=1,
                                                                      account_id=synth.FAKE_ACCOUNT)
    # The controller's GCP grants name home's group only; its function carries boto3.
    (grant,) = [m for m in r.of_type("gcp:projects/iAMMember:IAMMember") if m["name"] == "trainstack-controller-groups"]
    assert GROUP not in grant["inputs"]["condition"]["expression"] and MIG in grant["inputs"]["condition"]["expression"]


def test_controller_config_gives_the_aws_placement_its_access_and_the_controller_accepts_it():
    r = synthesized()
    raw = json.loads(r.outputs["placements"])
    home, away = raw["placements"]
    assert "access" not in home and home["group"] == MIG
    assert (away["cloud"], away["region"], away["project"], away["group"]) == ("aws", REGION, None, GROUP)
    assert away["access"] == {
        "aws_role_arn": f"arn:aws:iam::{synth.FAKE_ACCOUNT}:role/{controller_role_name(HOME_ASG)}",
        "audience": controller_audience(MIG)}
    parsed = controller_config.parse(r.outputs["placements"])
    assert [p.access for p in parsed.placements] == [None, away["access"]]
    assert parsed.run_uri == r.outputs["runUri"]


def test_the_plan_prices_the_aws_placement_and_a_restore_from_gcs():
    r = synthesized()
    text = synth.plan(r, load_stack_file(STACK_FILE), ask_prices=False)
    # The placements' own lines (the first launch's table below them names placement 1 too, indented further).
    (line,) = [ln for ln in text.splitlines() if ln.startswith("  1 aws us-east-1")]
    assert f"group {GROUP}" in line and "spot estimate" in line
    assert re.search(r"\$\d+\.\d+-\$\d+\.\d+/h", line), line  # g5.xlarge and g6.xlarge, both priced
    # A restore reads GCS out to the internet at Google's price per GiB: 1 GiB (the assumed size) costs $0.12.
    assert "internet at $0.12/GiB: $0.12;" in line, line
    # Its checkpoint writes leave AWS for GCS at AWS's internet egress: 1 GiB every 10 min at $0.09/GB.
    assert line.endswith("; checkpoint writes: $0.58/h at the 1.0 GiB assumed size, one every 600 s internet "
                         "at $0.09/GB"), line
