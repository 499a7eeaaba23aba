"""A run moves to the other cloud, end to end: an AWS machine, the controller's tick, a GCE machine.

An AWS-home stack with a GCP placement, synthesized (`ops synth`) and made on the IAM-enforcing
moto_server from the synth output's own documents (tests/userdata/cross_cloud.py). Placement A
(AWS, us-east-1) trains in the boot sandbox and is preempted by a spot notice. A's group then cannot
launch (its Auto Scaling answers carry no instance and failed scaling activities in AWS's words for
no capacity: tests/fixtures/no_capacity.py). The controller's tick, at a moment past `waitMinutes`,
runs as the function would: its identity a session of the synth's controller role, every AWS call
authorized by that role's synthesized policy, and B's group (the fake Compute API,
tests/fixtures/gce_groups.py) reached by federation: google-auth signs GetCallerIdentity with the
function's keys, Google's STS (tests/controller/federation.py) checks it against the synth's
provider condition and lets that role impersonate the synth's service account, whose tokens alone
the Compute API takes. It moves the run: A's group to zero, B's to one. A GCE machine of placement B
boots with no AWS key, only its service account's ID token for the role the synth output trusts,
resumes from A's last committed checkpoint in the S3 home, ends the run COMPLETE and its finish path
resizes B's group to zero through the Compute API. The final weights equal those of the same run
never interrupted (max |Δ| = 0, on CPU).
"""

from __future__ import annotations

import json
import re
import time

import pytest
import requests

from controller import record as records
from controller.clouds import AwsGroups, Clouds, GcpGroups
from controller.config import parse
from controller.decide import MOVE
from controller.tick import tick
from devtools.fault_proxy import FaultProxy
from devtools.machine_commands import GCE_ACCESS_TOKEN
from devtools.metadata import MetadataServer
from devtools.sandbox import Sandbox
from devtools.servers import Run
from runfolder import layout
from runfolder.storage import open_store
from tests.controller.federation import GoogleSide, Pool
from tests.controller.helpers import moved_events
from tests.fixtures.gce_groups import GceGroups
from tests.fixtures.iam_cloud import ADMIN_USER, IamCloud
from tests.fixtures.no_capacity import NoCapacity, insufficient_capacity
from tests.iam.policy_eval import Decision
from tests.userdata.cross_cloud import (
    GCP_PROJECT,
    REGION,
    AwsHome,
    assert_ended_with_its_google_identity,
    aws_home,
    gce_machine,
    gce_metadata,
    raw_stack,
)
from tests.userdata.helpers import diff_from_uninterrupted, events, preempted_after_first_checkpoint

pytestmark = pytest.mark.slow

# A's trainer holds after its first checkpoint (step 100) until the notice's stop signal, so the
# notice lands at a known step however slowly the machine trains; B's part and the reference are short.
STEPS, EVERY, BATCH, SEED = 300, 100, 16, 11
ACCOUNT = "123456789012"  # moto's, and the synth fakes'


def _controller_identity(cloud: IamCloud, home: AwsHome) -> dict[str, str]:
    """The function's variables as Lambda sets them: a session of the synth's controller role (made on moto,
    trusting the admin, as moto cannot take a Service principal), guarded by the role's synthesized policy."""
    r = home.synth
    role = r.named("trainstack-controller-role")["inputs"]["name"]
    policy = r.named("trainstack-controller-policy")["inputs"]["policy"]
    iam = cloud.admin("iam", REGION)
    arn = iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:user/{ADMIN_USER}"},
        "Action": "sts:AssumeRole"}]}))["Role"]["Arn"]
    iam.put_role_policy(RoleName=role, PolicyName="controller", PolicyDocument=policy)
    creds = cloud.admin("sts", REGION).assume_role(RoleArn=arn, RoleSessionName="trainstack-controller")["Credentials"]
    cloud.proxy.guard(creds["AccessKeyId"], [policy])
    cloud.proxy.verify(creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"])
    return {"AWS_ACCESS_KEY_ID": creds["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
            "AWS_SESSION_TOKEN": creds["SessionToken"], "AWS_REGION": REGION}


def test_a_preempted_aws_run_whose_region_cannot_launch_moves_to_gcp_and_ends_as_if_never_stopped(
        iam_cloud: IamCloud, monkeypatch, tmp_path):
    home = aws_home(iam_cloud, raw_stack(steps=STEPS, every=EVERY, batch=BATCH, seed=SEED))
    for k in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    r = home.synth
    config = parse(json.loads(r.outputs["placements"]))
    a, b = config.placements
    assert (a.cloud, a.group, b.cloud, b.group) == ("aws", home.home_group, "gcp", home.gcp_group)
    # The provider admits one role of moto's account: the synth's own attribute condition.
    condition = r.named("trainstack-controller-access-p1-provider")["inputs"]["attributeCondition"]
    account, controller_role = re.fullmatch(r'attribute\.aws_role == "arn:aws:sts::(\d{12}):assumed-role/([^"/]+)"',
                                            condition).groups()
    google = GoogleSide(moto=iam_cloud.proxy.url, pool=Pool(b.access["gcp_audience"], account, controller_role,
                                                           b.access["service_account"]))
    gce = GceGroups(GCP_PROJECT, b.region)
    gce.add(b.group, 0)
    federated = google.authorized(b.access["service_account"])
    # The Compute API takes the controller's federated tokens, and B's machine's own token for its group.
    gce.authorize = lambda group, header: federated(group, header) or (
        group == b.group and header == f"Bearer {GCE_ACCESS_TOKEN}")
    asg = iam_cloud.admin("autoscaling", REGION)
    iam_cloud.admin("ec2", REGION).create_launch_template(
        LaunchTemplateName=a.group, LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})
    asg.create_auto_scaling_group(AutoScalingGroupName=a.group, LaunchTemplate={"LaunchTemplateName": a.group},
                                  MinSize=1, MaxSize=1, DesiredCapacity=1, AvailabilityZones=[f"{REGION}a"])
    function = _controller_identity(iam_cloud, home)
    md_a = MetadataServer(instance_id="i-0aaaaaaaaaaaaaaa1")
    md_b = gce_metadata(home)
    boxes: list[Sandbox] = []

    def as_function(now: float):
        """One tick as the function runs it: its own variables, its own clients."""
        with monkeypatch.context() as m:
            for k, v in function.items():
                m.setenv(k, v)
            return tick(config, Clouds(aws=AwsGroups(), gcp=GcpGroups(
                requests.Session(), api=gce.url, token_url=google.token_url,
                iam_credentials=google.iam_credentials, sleep=lambda _s: None)), now)

    def desired() -> tuple[int, int]:
        return asg.describe_auto_scaling_groups(AutoScalingGroupNames=[a.group])["AutoScalingGroups"][0][
            "DesiredCapacity"], gce.sizes[b.group]

    with FaultProxy(iam_cloud.proxy.url) as proxy:
        proxy.gate = gate = NoCapacity(iam_cloud.proxy.url)
        for k, v in home.admin_env(iam_cloud, proxy.url).items():  # the test's own reads, as the admin
            monkeypatch.setenv(k, v)
        store = open_store(home.run_uri)
        run = Run(uri=home.run_uri, bucket=home.bucket, vars=home.admin_env(iam_cloud, proxy.url))
        try:
            # 1. Placement A trains and is preempted.
            box_a = Sandbox(tmp_path / "a", run, md_a, a.group, home.code_uri, settings=home.settings,
                            warm_trainer=True)
            boxes.append(box_a)
            stopped_at = preempted_after_first_checkpoint(box_a, md_a, store)
            assert EVERY <= stopped_at < STEPS

            # 2. A's group cannot launch; 3. the function's tick past waitMinutes moves the run.
            later = time.time() + (config.wait_minutes + 1) * 60
            gate.cannot_launch(a.region, a.group, insufficient_capacity("g5.xlarge", f"{REGION}a"), now=later)
            result = as_function(later)
            assert result.action == MOVE and "capacity" in result.reason, result
            assert gate.answered  # the refusals were the gate's, not moto's
            assert desired() == (0, 1)
            [moved] = moved_events(store)
            assert (moved["from"], moved["to"], moved["step"]) == (0, 1, stopped_at)
            assert (moved["from_placement"], moved["to_placement"]) == ("aws us-east-1", "gcp us-central1")

            # 4. A GCE machine of placement B resumes from A's last committed checkpoint; 5. COMPLETE.
            box_b = gce_machine(tmp_path / "b", home, md_b, proxy.url,
                                CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE=gce.url + "/", CLOUDSDK_CORE_PROJECT=GCP_PROJECT)
            boxes.append(box_b)
            assert box_b.boot().wait(timeout=400) == 0, box_b.journal()[-4000:]
            # B's finish path put B's group to zero through the Compute API: every group is at zero.
            assert desired() == (0, 0)
            assert as_function(time.time()).action == "finish"
        finally:
            for box in boxes:
                box.power_off()
            md_a.close()
            md_b.close()
            google.close()
            gce.close()

        assert [e["step"] for e in events(run) if e[layout.EVENT] == layout.RESUMED] == [stopped_at]
        assert store.exists(layout.COMPLETE)
        assert records.read(store)[0].active == 1
        resizes = [path for method, path in gce.requests if method == "POST" and path.endswith(f"/{b.group}/resize")]
        assert len(resizes) == 2  # the controller's, to one; the machine's, to zero
        # B with its own Google identity only; the controller as its own role, through Google's checks.
        assert_ended_with_its_google_identity(iam_cloud, md_b, home)
        # One exchange per tick (each a fresh invocation), each the controller's role, each let impersonate.
        assert [e["arn"].split("/")[:2] for e in google.exchanges] == [
            [f"arn:aws:sts::{account}:assumed-role", controller_role]] * 2
        assert google.impersonations == [(b.access["service_account"], True)] * 2
        controller_calls = [(act, res, d) for k, act, res, d in iam_cloud.proxy.decisions
                            if k == function["AWS_ACCESS_KEY_ID"]]
        assert [d for act, res, d in controller_calls if act == "autoscaling:UpdateAutoScalingGroup"
                and res.endswith(f":autoScalingGroupName/{a.group}")] == [Decision.ALLOW]
        assert all(d is Decision.ALLOW for _a, _r, d in controller_calls), controller_calls

        diff = diff_from_uninterrupted(home.run_uri, tmp_path, steps=STEPS, batch=BATCH, seed=SEED, every=EVERY)
        assert diff == 0.0, diff
