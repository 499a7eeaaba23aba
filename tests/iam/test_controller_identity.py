"""The placement controller's identity, enforced: its real calls, as a role holding `controller.grants.aws_policy`.

The role is made in moto, assumed through STS, and the controller's own code runs with the
session's keys through the authorization layer (tests/fixtures/iam_cloud.py), which evaluates
the policy as AWS does where moto cannot (the `s3:prefix` and `autoscaling:MinSize`/`MaxSize`
conditions, Auto Scaling group ARNs). Two placements' groups in two regions, a group of another
stack and another run beside them: the controller moves the run, zeroes the groups of an ended
run, and can do nothing else.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import boto3
import botocore.exceptions
import pytest

from controller.clouds import AwsGroups, Clouds
from controller.config import Config
from controller.grants import READ_GROUP_ACTIONS, SIZE_GROUP_ACTIONS, aws_policy
from controller.tick import move, tick
from runfolder import layout
from runfolder.storage import open_store
from tests.controller.helpers import aws_config, moved_events, trained
from tests.fixtures.iam_cloud import ACCOUNT, ADMIN_USER, IMAGE, IamCloud
from tests.iam.policy_eval import Decision

pytestmark = pytest.mark.slow

REGIONS = ("us-east-1", "us-west-2")
BUCKET = "trainstack-placements-home"
RUN_ID = "exp-7"
GROUPS = ("trainstack-exp-gpu", "trainstack-exp-gpu-1")
OTHER_GROUP = "trainstack-other-stack-gpu"
NODES = 1


def _build_group(cloud: IamCloud, region: str, name: str, size: int) -> None:
    ec2 = cloud.admin("ec2", region)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    lt = ec2.create_launch_template(LaunchTemplateName=f"{name}-lt",
                                    LaunchTemplateData={"ImageId": IMAGE, "InstanceType": "t3.micro"})
    cloud.admin("autoscaling", region).create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=size, MaxSize=size, DesiredCapacity=size, VPCZoneIdentifier=subnet,
        LaunchTemplate={"LaunchTemplateId": lt["LaunchTemplate"]["LaunchTemplateId"], "Version": "$Latest"})


def _size(cloud: IamCloud, region: str, name: str) -> int:
    return cloud.admin("autoscaling", region).describe_auto_scaling_groups(
        AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["DesiredCapacity"]


@dataclass
class Controller:
    cloud: IamCloud
    keys: dict[str, str]
    policy: str
    config: Config

    def client(self, service: str, region: str = REGIONS[0]):
        return boto3.session.Session().client(
            service, endpoint_url=self.cloud.proxy.url, region_name=region,
            aws_access_key_id=self.keys["AWS_ACCESS_KEY_ID"], aws_secret_access_key=self.keys["AWS_SECRET_ACCESS_KEY"],
            aws_session_token=self.keys["AWS_SESSION_TOKEN"])

    def decisions(self) -> list[tuple[str, str, Decision]]:
        return [(a, r, d) for k, a, r, d in self.cloud.proxy.decisions if k == self.keys["AWS_ACCESS_KEY_ID"]]


@pytest.fixture(scope="module")
def controller(iam_cloud: IamCloud) -> Controller:
    s3 = iam_cloud.admin("s3", REGIONS[0])
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="runs/another-run/progress.json", Body=b"{}")
    for region, name, size in ((REGIONS[0], GROUPS[0], NODES), (REGIONS[1], GROUPS[1], 0),
                               (REGIONS[0], OTHER_GROUP, 1)):
        _build_group(iam_cloud, region, name, size)
    policy = json.dumps(aws_policy(bucket=BUCKET, run_id=RUN_ID, groups=list(zip(REGIONS, GROUPS, strict=True)),
                                   nodes=NODES, account_id=ACCOUNT))
    iam = iam_cloud.admin("iam", REGIONS[0])
    # moto fails a trust policy with a Service principal (HTTP 500): trust the admin user instead.
    role = iam.create_role(RoleName="trainstack-controller", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:user/{ADMIN_USER}"}}]}))
    iam.put_role_policy(RoleName="trainstack-controller", PolicyName="controller", PolicyDocument=policy)
    creds = iam_cloud.admin("sts", REGIONS[0]).assume_role(RoleArn=role["Role"]["Arn"],
                                                           RoleSessionName="controller")["Credentials"]
    iam_cloud.proxy.guard(creds["AccessKeyId"], [policy])
    keys = {"AWS_ACCESS_KEY_ID": creds["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
            "AWS_SESSION_TOKEN": creds["SessionToken"]}
    return Controller(iam_cloud, keys, policy, aws_config(f"s3://{BUCKET}/runs/{RUN_ID}", list(GROUPS), nodes=NODES))


@pytest.fixture
def as_controller(controller: Controller, monkeypatch: pytest.MonkeyPatch) -> Controller:
    import os

    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_ENDPOINT_URL", controller.cloud.proxy.url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGIONS[0])
    for k, v in controller.keys.items():
        monkeypatch.setenv(k, v)
    return controller


def _admin_store(controller: Controller):
    class Admin:
        """The run folder written as the machines write it (the admin's keys, straight to moto)."""

        s3 = controller.cloud.admin("s3", REGIONS[0])

        def put_bytes(self, key, data):
            self.s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN_ID}/{key}", Body=data)

    return Admin()


def test_the_controller_moves_and_finishes_with_its_own_policy_only(as_controller):
    c = as_controller
    now = time.time()
    trained(_admin_store(c), step=20, last_beat=now - 30)
    before = len(c.decisions())

    stay = tick(c.config, Clouds(aws=AwsGroups()), now)  # reads everything, changes nothing
    result = move(c.config, Clouds(aws=AwsGroups()), c.config.placements[1], "asked")
    store = open_store(c.config.run_uri)
    assert stay.action == "stay" and result.waiting is None
    assert (_size(c.cloud, REGIONS[0], GROUPS[0]), _size(c.cloud, REGIONS[1], GROUPS[1])) == (0, NODES)
    assert [e["step"] for e in moved_events(store)] == [20]

    _admin_store(c).put_bytes(layout.COMPLETE, b'{"step": 40}')
    _build_size = c.cloud.admin("autoscaling", REGIONS[0]).update_auto_scaling_group
    _build_size(AutoScalingGroupName=GROUPS[0], MinSize=1, MaxSize=1, DesiredCapacity=1)  # left up by hand
    finished = tick(c.config, Clouds(aws=AwsGroups()), now)
    assert finished.action == "finish"
    assert (_size(c.cloud, REGIONS[0], GROUPS[0]), _size(c.cloud, REGIONS[1], GROUPS[1])) == (0, 0)

    seen = c.decisions()[before:]
    refused = [(a, r) for a, r, d in seen if d is not Decision.ALLOW]
    assert refused == []  # every call the controller made was allowed by its policy alone
    actions = {a for a, _r, _d in seen}
    assert actions >= {*READ_GROUP_ACTIONS, *SIZE_GROUP_ACTIONS, "s3:GetObject", "s3:PutObject", "s3:ListBucket"}
    writes = sorted({r.split(f"runs/{RUN_ID}/", 1)[1] for a, r, _d in seen if a == "s3:PutObject"})
    assert writes == sorted([layout.PLACEMENT_KEY, layout.PLACEMENT_EVENTS_KEY])


def test_the_controller_ends_a_stop_no_trainer_heeds_with_its_own_policy(as_controller):
    c = as_controller
    now = time.time()
    admin = _admin_store(c)
    # The module's run folder is shared: an earlier test's run may have ended it, and its placement moved.
    for key in (*layout.END_MARKERS, layout.PLACEMENT_KEY):
        admin.s3.delete_object(Bucket=BUCKET, Key=f"runs/{RUN_ID}/{key}")
    trained(admin, step=20, last_beat=now - 600)  # its lease released: no trainer runs
    admin.put_bytes(layout.STOP_KEY, b'{"reason": "asked"}')
    before = len(c.decisions())

    result = tick(c.config, Clouds(aws=AwsGroups()), now)

    marker = c.cloud.admin("s3", REGIONS[0]).get_object(Bucket=BUCKET, Key=f"runs/{RUN_ID}/{layout.CANCELLED}")
    assert result.action == "finish", result
    assert json.loads(marker["Body"].read())["instance"] == "controller"
    assert (_size(c.cloud, REGIONS[0], GROUPS[0]), _size(c.cloud, REGIONS[1], GROUPS[1])) == (0, 0)
    seen = c.decisions()[before:]
    assert [(a, r) for a, r, d in seen if d is not Decision.ALLOW] == []
    assert sorted({r.split(f"runs/{RUN_ID}/", 1)[1] for a, r, _d in seen if a == "s3:PutObject"}) == [layout.CANCELLED]


@pytest.mark.parametrize(("what", "call", "code"), [
    ("another stack's group", lambda c: c.client("autoscaling").update_auto_scaling_group(
        AutoScalingGroupName=OTHER_GROUP, MinSize=0, MaxSize=0, DesiredCapacity=0), "AccessDenied"),
    ("its group above the run's size", lambda c: c.client("autoscaling", REGIONS[1]).update_auto_scaling_group(
        AutoScalingGroupName=GROUPS[1], MinSize=NODES + 1, MaxSize=NODES + 1, DesiredCapacity=NODES + 1),
     "AccessDenied"),
    ("its group without the sizes", lambda c: c.client("autoscaling", REGIONS[1]).update_auto_scaling_group(
        AutoScalingGroupName=GROUPS[1], DesiredCapacity=1), "AccessDenied"),
    ("a checkpoint", lambda c: c.client("s3").put_object(
        Bucket=BUCKET, Key=f"runs/{RUN_ID}/{layout.committed_key(99)}", Body=b"{}"), "AccessDenied"),
    ("an end marker", lambda c: c.client("s3").put_object(
        Bucket=BUCKET, Key=f"runs/{RUN_ID}/{layout.COMPLETE}", Body=b"{}"), "AccessDenied"),
    ("another run", lambda c: c.client("s3").get_object(Bucket=BUCKET, Key="runs/another-run/progress.json"),
     "AccessDenied"),
    ("the bucket's other prefixes", lambda c: c.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="runs/"),
     "AccessDenied"),
    ("an EC2 read beside the prices", lambda c: c.client("ec2").describe_instances(), "UnauthorizedOperation"),
    ("prices in a region no placement is in", lambda c: c.client("ec2", "eu-west-1").describe_spot_price_history(
        InstanceTypes=["t3.micro"]), "UnauthorizedOperation"),
    ("an object beside the price cache", lambda c: c.client("s3").put_object(
        Bucket=BUCKET, Key=f"runs/{RUN_ID}/{layout.PRICES_KEY}.tmp", Body=b"{}"), "AccessDenied"),
    ("another run's decisions", lambda c: c.client("s3").put_object(
        Bucket=BUCKET, Key=f"runs/another-run/{layout.decision_key(0)}", Body=b"{}"), "AccessDenied"),
])
def test_the_controller_can_do_nothing_else(controller, what, call, code):
    with pytest.raises(botocore.exceptions.ClientError) as e:
        call(controller)
    assert e.value.response["Error"]["Code"] == code, what
    assert controller.decisions()[-1][2] is not Decision.ALLOW


def test_the_controller_reads_spot_prices_and_writes_its_cache_and_tables_with_its_own_policy_only(as_controller):
    from controller import prices, table
    from controller.prices import Offer

    c = as_controller
    now = time.time()
    before = len(c.decisions())
    p = c.config.placements[1]
    offer = Offer(1, "aws", p.region, ("t3.micro",))
    book = prices.PriceBook.open(open_store(c.config.run_uri))
    book.update([offer], now=now, fetch=prices.live_fetch(Clouds(aws=AwsGroups()), {1: p}, now=now))
    key = table.write(open_store(c.config.run_uri), {"rows": []}, now=now)

    quote = book.quotes[offer.key]
    assert (quote.source, quote.as_of) == ("aws", now) and quote.price is not None, quote.note  # moto's fixed price
    assert quote.score is None  # moto has no placement scores: an answer it cannot give is no score
    seen = c.decisions()[before:]
    assert [(a, r) for a, r, d in seen if d is not Decision.ALLOW] == []
    # The cache read (a missing object is told apart by a listing), the two price calls, the two writes.
    assert {a for a, _r, _d in seen} == {"ec2:DescribeSpotPriceHistory", "ec2:GetSpotPlacementScores",
                                         "s3:GetObject", "s3:ListBucket", "s3:PutObject"}
    writes = sorted(r.split(f"runs/{RUN_ID}/", 1)[1] for a, r, _d in seen if a == "s3:PutObject")
    assert writes == sorted([layout.PRICES_KEY, key])


# -- a GCP-home controller's role in AWS (access.aws_role_arn) ---------------------------------------

WEB_AUDIENCE = "trainstack-exp-controller"
GOOGLE_ID = "104812345678901234567"  # the function's service account's unique id


def test_a_gcp_home_controller_reaches_its_aws_placement_as_its_role_only(controller, monkeypatch):
    # The GCP function has no AWS key: it assumes the role with a Google ID token from its metadata
    # server (behind a gate checking the trust as AWS does, which has moto's STS issue the role's
    # session: tests/controller/federation.py), and every call it then makes is authorized against
    # the role's policy alone.
    from google.auth.compute_engine import _metadata

    from controller.config import Placement
    from controller.grants import aws_group_policy
    from devtools.fault_proxy import FaultProxy
    from tests.controller.federation import GoogleSide, WebIdentityGate

    cloud = controller.cloud
    group = "trainstack-exp-gpu-p3"
    _build_group(cloud, REGIONS[1], group, 0)
    policy = json.dumps(aws_group_policy(groups=[(REGIONS[1], group)], nodes=NODES, account_id=ACCOUNT))
    iam = cloud.admin("iam", REGIONS[0])
    role = iam.create_role(RoleName="trainstack-exp-controller-gcp", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Federated": "accounts.google.com"},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {"accounts.google.com:aud": GOOGLE_ID, "accounts.google.com:sub": GOOGLE_ID,
                                           "accounts.google.com:oaud": WEB_AUDIENCE}}},
            # moto enforcing IAM cannot answer the unsigned call: the gate assumes the role as the admin.
            {"Effect": "Allow", "Action": "sts:AssumeRole",
             "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:user/{ADMIN_USER}"}}]}))["Role"]["Arn"]
    iam.put_role_policy(RoleName="trainstack-exp-controller-gcp", PolicyName="groups", PolicyDocument=policy)
    keys: list[str] = []

    def assumed(key: str) -> None:
        keys.append(key)
        cloud.proxy.guard(key, [policy])

    google = GoogleSide(moto=cloud.endpoint, unique_id=GOOGLE_ID)
    monkeypatch.setattr(_metadata, "_GCE_METADATA_HOST", google.host)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    try:
        with FaultProxy(cloud.proxy.url) as proxy:
            proxy.gate = gate = WebIdentityGate(cloud.proxy.url, audience=WEB_AUDIENCE, unique_id=GOOGLE_ID,
                                                on_assumed=assumed, admin=cloud.proxy.admin)
            monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
            p = Placement(index=1, cloud="aws", region=REGIONS[1], group=group,
                          access={"aws_role_arn": role, "audience": WEB_AUDIENCE})
            groups = AwsGroups()

            groups.set_size(p, NODES)
            state = groups.state(p)

            assert _size(cloud, REGIONS[1], group) == NODES and state.desired == NODES
            [key] = keys  # assumed once, through the gate, with the metadata server's token
            assert [ok for _r, _t, ok in gate.presented] == [True] and google.id_tokens[0][:2] == (WEB_AUDIENCE, "full")
            seen = [(a, d) for k, a, _r, d in cloud.proxy.decisions if k == key]
            assert {a for a, _d in seen} == {"autoscaling:UpdateAutoScalingGroup", *READ_GROUP_ACTIONS}
            assert all(d is Decision.ALLOW for _a, d in seen)

            asg = groups.client(p)
            refused = []
            for what, call in [
                ("above the run's size", lambda: asg.update_auto_scaling_group(
                    AutoScalingGroupName=group, MinSize=NODES + 1, MaxSize=NODES + 1, DesiredCapacity=NODES + 1)),
                ("another stack's group", lambda: groups.client(
                    Placement(index=1, cloud="aws", region=REGIONS[0], group=OTHER_GROUP, access=p.access)
                ).update_auto_scaling_group(AutoScalingGroupName=OTHER_GROUP, MinSize=0, MaxSize=0, DesiredCapacity=0)),
                ("the home placement's group", lambda: groups.client(
                    Placement(index=1, cloud="aws", region=REGIONS[0], group=GROUPS[0], access=p.access)
                ).update_auto_scaling_group(AutoScalingGroupName=GROUPS[0], MinSize=0, MaxSize=0, DesiredCapacity=0)),
            ]:
                with pytest.raises(botocore.exceptions.ClientError) as e:
                    call()
                refused.append((what, e.value.response["Error"]["Code"]))
            assert refused == [("above the run's size", "AccessDenied"), ("another stack's group", "AccessDenied"),
                               ("the home placement's group", "AccessDenied")]
            assert _size(cloud, REGIONS[1], group) == NODES
    finally:
        google.close()
