"""A placement's machine identity, enforced: the one role of a stack of two AWS regions, used by a
machine of the second placement.

The role's policy is the synth output's own (`ops.synth` on a stack whose home is eu-west-1 and
whose second placement is us-west-2), made in moto, assumed through STS, and every call is signed
with the session's keys in the machine's own region (us-west-2) through the authorization layer of
tests/fixtures/iam_cloud.py. The machine reaches this run's prefix of the home bucket, pulls the built
image from its own region's repository, and may set its own group (in its region) to zero; it cannot
scale any group up, touch another stack's group or repository in its region, or reach another run. See tests/iam/test_machine_identity.py for the one-placement
machine, whose calls these are.

A GCP home's AWS placement (stacks/Pulumi.gcp-aws.yaml) has a role of its own, evaluated the same way: its
run folder is in GCS, so the role may set its own group to zero and do nothing else, in S3 least of all.
"""

from __future__ import annotations

import json

import boto3
import botocore.exceptions
import pytest

from components import placement
from ops import synth
from tests.fixtures.iam_cloud import ACCOUNT, ADMIN_USER, IMAGE, IamCloud
from tests.iam.policy_eval import Decision

pytestmark = pytest.mark.slow

HOME, AWAY = "eu-west-1", "us-west-2"
RUN_ID = "exp-7"
# A built image: pushed to a repository in each placement's region, pulled there from the machine's own.
RAW = {"cloud": "aws", "region": HOME, "run": {"id": RUN_ID, "synthetic": True, "steps": 100},
       "image": {"build": True},
       "placements": [{"cloud": "aws", "region": HOME, "instanceTypes": ["g5.xlarge"]},
                      {"cloud": "aws", "region": AWAY, "instanceTypes": ["g5.xlarge"]}]}
OTHER_GROUP = "trainstack-other-stack-gpu"
OTHER_REPOSITORY = "trainstack/other-stack"


def _build_group(cloud: IamCloud, region: str, name: str, size: int) -> None:
    ec2 = cloud.admin("ec2", region)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    lt = ec2.create_launch_template(LaunchTemplateName=f"{name}-lt",
                                    LaunchTemplateData={"ImageId": IMAGE, "InstanceType": "t3.micro"})
    cloud.admin("autoscaling", region).create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=size, DesiredCapacity=size, VPCZoneIdentifier=subnet,
        LaunchTemplate={"LaunchTemplateId": lt["LaunchTemplate"]["LaunchTemplateId"], "Version": "$Latest"})


@pytest.fixture(scope="module")
def away(iam_cloud: IamCloud) -> dict:
    """The stack built in moto and the role's session keys, as a machine of placement 1 holds them."""
    result = synth.synthesize(RAW, stack="places")
    (policy,) = [r["inputs"]["policy"] for r in result.of_type("aws:iam/rolePolicy:RolePolicy")
                 if r["parent"] == "trainstack-identity"]
    bucket, home_group = result.outputs["bucketName"], result.outputs["groupName"]
    group = placement.group_name(home_group, 1)
    s3 = iam_cloud.admin("s3", HOME)
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": HOME})
    s3.put_object(Bucket=bucket, Key=f"runs/{RUN_ID}/progress.json", Body=b'{"step": 40}')
    s3.put_object(Bucket=bucket, Key="runs/another-run/COMPLETE", Body=b"{}")
    _build_group(iam_cloud, HOME, home_group, 1)
    _build_group(iam_cloud, AWAY, group, 1)
    _build_group(iam_cloud, AWAY, OTHER_GROUP, 1)
    (repository,) = {r["inputs"]["name"] for r in result.of_type("aws:ecr/repository:Repository")}
    for region, name in ((HOME, repository), (AWAY, repository), (AWAY, OTHER_REPOSITORY)):
        iam_cloud.admin("ecr", region).create_repository(repositoryName=name)
    iam = iam_cloud.admin("iam", HOME)
    # moto fails a trust policy with a Service principal (HTTP 500): trust the admin user instead.
    role = iam.create_role(RoleName="trainstack-placements", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:user/{ADMIN_USER}"}}]}))
    iam.put_role_policy(RoleName="trainstack-placements", PolicyName="machine", PolicyDocument=policy)
    creds = iam_cloud.admin("sts", HOME).assume_role(RoleArn=role["Role"]["Arn"],
                                                     RoleSessionName="i-0away")["Credentials"]
    iam_cloud.proxy.guard(creds["AccessKeyId"], [policy])

    def client(service: str, region: str = AWAY):
        return boto3.session.Session().client(
            service, endpoint_url=iam_cloud.proxy.url, region_name=region, aws_access_key_id=creds["AccessKeyId"],
            aws_secret_access_key=creds["SecretAccessKey"], aws_session_token=creds["SessionToken"])

    return {"client": client, "bucket": bucket, "group": group, "home_group": home_group, "cloud": iam_cloud,
            "key": creds["AccessKeyId"], "repository": repository}


def _code(call) -> str:
    with pytest.raises(botocore.exceptions.ClientError) as info:
        call()
    return info.value.response["Error"]["Code"]


def test_a_machine_away_reads_and_writes_its_run_in_the_home_bucket(away):
    s3 = away["client"]("s3")
    assert json.loads(s3.get_object(Bucket=away["bucket"], Key=f"runs/{RUN_ID}/progress.json")["Body"].read()) == \
        {"step": 40}
    s3.put_object(Bucket=away["bucket"], Key=f"runs/{RUN_ID}/events.jsonl", Body=b"{}")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=away["bucket"], Prefix=f"runs/{RUN_ID}/")["Contents"]] == [
        f"runs/{RUN_ID}/events.jsonl", f"runs/{RUN_ID}/progress.json"]


def test_a_machine_away_sets_its_own_group_to_zero_in_its_region(away):
    asg = away["client"]("autoscaling")
    asg.update_auto_scaling_group(AutoScalingGroupName=away["group"], MinSize=0, MaxSize=0, DesiredCapacity=0)
    (group,) = away["cloud"].admin("autoscaling", AWAY).describe_auto_scaling_groups(
        AutoScalingGroupNames=[away["group"]])["AutoScalingGroups"]
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (0, 0, 0)
    decided = [d for k, a, r, d in away["cloud"].proxy.decisions
               if k == away["key"] and a == "autoscaling:UpdateAutoScalingGroup" and f":{AWAY}:" in r
               and r.endswith(f"/{away['group']}")]
    assert decided and decided[-1] is Decision.ALLOW


REFUSED = {
    "scale its group up": lambda a: a["client"]("autoscaling").update_auto_scaling_group(
        AutoScalingGroupName=a["group"], MinSize=0, MaxSize=4, DesiredCapacity=4),
    "scale the home group up from away": lambda a: a["client"]("autoscaling", HOME).update_auto_scaling_group(
        AutoScalingGroupName=a["home_group"], MinSize=1, MaxSize=1, DesiredCapacity=1),
    "set another stack's group in its region to zero": lambda a: a["client"]("autoscaling").update_auto_scaling_group(
        AutoScalingGroupName=OTHER_GROUP, MinSize=0, MaxSize=0, DesiredCapacity=0),
    "read another run": lambda a: a["client"]("s3").get_object(Bucket=a["bucket"], Key="runs/another-run/COMPLETE"),
    "write another run": lambda a: a["client"]("s3").put_object(Bucket=a["bucket"], Key="runs/another-run/x",
                                                                 Body=b"x"),
    "list every run": lambda a: a["client"]("s3").list_objects_v2(Bucket=a["bucket"], Prefix="runs/"),
}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_a_machine_away_cannot_reach_beyond_its_run_and_groups(away, what):
    before = len(away["cloud"].proxy.decisions)
    assert _code(lambda: REFUSED[what](away)) == "AccessDenied"
    assert any(d is not Decision.ALLOW for *_, d in away["cloud"].proxy.decisions[before:])


def test_a_machine_away_pulls_the_image_from_its_own_regions_repository_and_no_other(away):
    ecr = away["client"]("ecr")
    assert ecr.get_authorization_token()["authorizationData"]
    # An empty repository: the call is authorized, and the image is reported missing.
    answer = ecr.batch_get_image(repositoryName=away["repository"], imageIds=[{"imageTag": "x"}])
    assert answer["images"] == [] and answer["failures"]
    arn = f"arn:aws:ecr:{AWAY}:{ACCOUNT}:repository/{away['repository']}"
    decided = [d for k, a, r, d in away["cloud"].proxy.decisions
               if k == away["key"] and a == "ecr:BatchGetImage" and r == arn]
    assert decided == [Decision.ALLOW]
    before = len(away["cloud"].proxy.decisions)
    with pytest.raises(botocore.exceptions.ClientError) as info:
        ecr.batch_get_image(repositoryName=OTHER_REPOSITORY, imageIds=[{"imageTag": "x"}])
    assert info.value.response["Error"]["Code"] == "AccessDeniedException"
    assert [d for k, a, r, d in away["cloud"].proxy.decisions[before:] if a == "ecr:BatchGetImage"] == [
        Decision.IMPLICIT_DENY]


# -- a GCP home's AWS placement: its machines' role ----------------------------------------------------

GCP_HOME_REGION = "us-east-1"


@pytest.fixture(scope="module")
def gcp_home(iam_cloud: IamCloud) -> dict:
    """The role of stacks/Pulumi.gcp-aws.yaml's AWS machines, made in moto, and its session's keys."""
    result = synth.synthesize(synth.STACKS_DIR / "Pulumi.gcp-aws.yaml")
    (policy,) = [r["inputs"]["policy"] for r in result.of_type("aws:iam/rolePolicy:RolePolicy")
                 if r["parent"] == "trainstack-identity-p1"]
    (group,) = [g["inputs"]["name"] for g in result.of_type("aws:autoscaling/group:Group")]
    _build_group(iam_cloud, GCP_HOME_REGION, group, 1)
    _build_group(iam_cloud, GCP_HOME_REGION, f"{group}-other", 1)
    # Any bucket of the account, with a run's folder in it: the role reaches none.
    s3 = iam_cloud.admin("s3", GCP_HOME_REGION)
    s3.create_bucket(Bucket="trainstack-gcp-aws-any")
    s3.put_object(Bucket="trainstack-gcp-aws-any", Key="runs/gcp-aws/progress.json", Body=b"{}")
    iam = iam_cloud.admin("iam", GCP_HOME_REGION)
    role = iam.create_role(RoleName="trainstack-gcp-aws-machines", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:user/{ADMIN_USER}"}}]}))
    iam.put_role_policy(RoleName="trainstack-gcp-aws-machines", PolicyName="machine", PolicyDocument=policy)
    creds = iam_cloud.admin("sts", GCP_HOME_REGION).assume_role(RoleArn=role["Role"]["Arn"],
                                                                RoleSessionName="i-0gcphome")["Credentials"]
    iam_cloud.proxy.guard(creds["AccessKeyId"], [policy])

    def client(service: str):
        return boto3.session.Session().client(
            service, endpoint_url=iam_cloud.proxy.url, region_name=GCP_HOME_REGION,
            aws_access_key_id=creds["AccessKeyId"], aws_secret_access_key=creds["SecretAccessKey"],
            aws_session_token=creds["SessionToken"])

    return {"client": client, "group": group, "cloud": iam_cloud, "key": creds["AccessKeyId"], "policy": policy}


def test_a_gcp_homes_aws_machine_sets_its_own_group_to_zero(gcp_home):
    gcp_home["client"]("autoscaling").update_auto_scaling_group(
        AutoScalingGroupName=gcp_home["group"], MinSize=0, MaxSize=0, DesiredCapacity=0)
    (group,) = gcp_home["cloud"].admin("autoscaling", GCP_HOME_REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=[gcp_home["group"]])["AutoScalingGroups"]
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (0, 0, 0)
    decided = [d for k, a, r, d in gcp_home["cloud"].proxy.decisions
               if k == gcp_home["key"] and a == "autoscaling:UpdateAutoScalingGroup" and r.endswith(f"/{gcp_home['group']}")]
    assert decided and decided[-1] is Decision.ALLOW
    assert not [s for s in json.loads(gcp_home["policy"])["Statement"]
                if any(str(a).startswith(("s3:", "ecr:")) for a in ([s["Action"]] if isinstance(s["Action"], str)
                                                                     else s["Action"]))]


GCP_HOME_REFUSED = {
    "scale its group up": lambda a: a["client"]("autoscaling").update_auto_scaling_group(
        AutoScalingGroupName=a["group"], MinSize=0, MaxSize=1, DesiredCapacity=1),
    "set another group to zero": lambda a: a["client"]("autoscaling").update_auto_scaling_group(
        AutoScalingGroupName=f"{a['group']}-other", MinSize=0, MaxSize=0, DesiredCapacity=0),
    "read a run in S3": lambda a: a["client"]("s3").get_object(Bucket="trainstack-gcp-aws-any",
                                                               Key="runs/gcp-aws/progress.json"),
    "write a run in S3": lambda a: a["client"]("s3").put_object(Bucket="trainstack-gcp-aws-any",
                                                                Key="runs/gcp-aws/events.jsonl", Body=b"{}"),
    "list a bucket": lambda a: a["client"]("s3").list_objects_v2(Bucket="trainstack-gcp-aws-any", Prefix="runs/"),
    "delete in S3": lambda a: a["client"]("s3").delete_object(Bucket="trainstack-gcp-aws-any",
                                                              Key="runs/gcp-aws/progress.json"),
}


@pytest.mark.parametrize("what", sorted(GCP_HOME_REFUSED))
def test_a_gcp_homes_aws_machine_can_do_nothing_else(gcp_home, what):
    before = len(gcp_home["cloud"].proxy.decisions)
    assert _code(lambda: GCP_HOME_REFUSED[what](gcp_home)) == "AccessDenied"
    assert any(d is not Decision.ALLOW for k, *_, d in gcp_home["cloud"].proxy.decisions[before:]
               if k == gcp_home["key"])
