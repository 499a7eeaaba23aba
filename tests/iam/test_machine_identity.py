"""The machine's identity, enforced: its real calls, as the role the stack's synth output builds.

The role is made in moto from the synth output's own documents (`ops.synth` on an AWS
stack of two machines), assumed through STS, and every call below is signed with the
session's keys. The calls are the machine's own: the trainer's `open_store`, and
`userdata/finish.sh` and `rendezvous.sh`'s `join_generation` run unchanged
(their `aws` is the boot sandbox's stand-in, which makes the CLI's calls with boto3), plus
the same calls made directly with boto3 so each can be checked on its own. moto_server enforces IAM (signature, key,
actions against the S3 bucket and object ARNs); the authorization layer in front of it
(tests/fixtures/iam_cloud.py) evaluates the same documents where moto cannot: identity-policy
conditions (`s3:prefix`, `autoscaling:MinSize`/`MaxSize`), ARN-scoped grants for Auto
Scaling, ECR and EC2, `DeleteObjects` per key, and the 403 S3 gives for a missing key to a
caller who may not list the bucket. Every refusal asserted here is one AWS gives for this
policy, in the error code AWS uses.

What differs from AWS, on purpose: moto answers HTTP 500 for a trust policy with a
`Service` principal, so the role in moto trusts the admin user that assumes it; the synth
trust policy is checked separately (EC2 only).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import boto3
import botocore.exceptions
import pytest

from components.aws.signing_key import KEY_SPEC, KEY_USAGE, key_policy
from components.code import boot_key, pack_boot_scripts
from devtools import cli_server
from runfolder import layout
from runfolder.storage import NotFound, open_store
from tests.components.aws import helpers as aws_helpers
from tests.fixtures.iam_cloud import ACCOUNT, ADMIN_USER, IMAGE, IamCloud
from tests.iam.policy_eval import Decision

pytestmark = pytest.mark.slow

REGION = aws_helpers.BASE["region"]
ROOT = Path(__file__).resolve().parents[2]
# The boot sandbox's stand-ins: `aws` does the AWS CLI's calls with boto3 (the real CLI
# cannot be installed beside the project's botocore), `shutdown` and `journalctl` record.
FAKES = ROOT / "devtools" / "machine_commands.py"
OTHER_BUCKET = "trainstack-someone-else"
OTHER_GROUP = "trainstack-other-stack-gpu"


@dataclass
class Machine:
    """The stack as synthesized, built in moto, and the machine's session keys."""

    outputs: dict
    policy: str
    bucket: str
    group: str
    repository: str
    run_id: str
    keys: dict[str, str]
    cloud: IamCloud
    signing_key: str
    """The ARN of a key made as the stack's SigningKey makes it (its key policy lets the deployer alone sign)."""

    def env(self) -> dict[str, str]:
        """The variables a process on the machine would have: the endpoint and the role's keys."""
        return {"AWS_ENDPOINT_URL": self.cloud.proxy.url, "AWS_DEFAULT_REGION": REGION, **self.keys}

    def client(self, service: str):
        """A boto3 client with the machine's credentials, through the authorization layer."""
        return boto3.session.Session().client(
            service, endpoint_url=self.cloud.proxy.url, region_name=REGION,
            aws_access_key_id=self.keys["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.keys["AWS_SECRET_ACCESS_KEY"],
            aws_session_token=self.keys["AWS_SESSION_TOKEN"],
        )


def _build_group(cloud: IamCloud, name: str, size: int) -> None:
    ec2 = cloud.admin("ec2", REGION)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    lt = ec2.create_launch_template(LaunchTemplateName=f"{name}-lt",
                                    LaunchTemplateData={"ImageId": IMAGE, "InstanceType": "t3.micro"})
    cloud.admin("autoscaling", REGION).create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=size, DesiredCapacity=size, VPCZoneIdentifier=subnet,
        LaunchTemplate={"LaunchTemplateId": lt["LaunchTemplate"]["LaunchTemplateId"], "Version": "$Latest"},
    )


@pytest.fixture(scope="module")
def machine(iam_cloud: IamCloud) -> Machine:
    """The synth output's role, bucket, repository and group, made in moto; the role assumed via STS."""
    result = aws_helpers.synth_raw({"compute": {"nodes": 2, "instanceTypes": ["g5.xlarge"]}})
    outputs = result.outputs
    policy = aws_helpers.one(result, "aws:iam/rolePolicy:RolePolicy")["inputs"]["policy"]
    trust = json.loads(aws_helpers.one(result, "aws:iam/role:Role")["inputs"]["assumeRolePolicy"])
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}]
    repository = aws_helpers.one(result, "aws:ecr/repository:Repository")["inputs"]["name"]
    bucket, group = outputs["bucketName"], outputs["groupName"]
    run_id = aws_helpers.BASE["run"]["id"]

    s3 = iam_cloud.admin("s3", REGION)
    for name in (bucket, OTHER_BUCKET):
        s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
    code_key = outputs["codeUri"].removeprefix(f"s3://{bucket}/")
    assert code_key.startswith(layout.CODE_PREFIX)
    s3.put_object(Bucket=bucket, Key=code_key, Body=b"code archive")
    # Two machines: their user data names the boot scripts' archive, which `pulumi up` puts beside the code.
    (user_data,) = result.user_data.values()
    assert f"TRAINSTACK_BOOT_URI='s3://{bucket}/{boot_key(pack_boot_scripts())}'" in user_data
    s3.put_object(Bucket=bucket, Key=boot_key(pack_boot_scripts()), Body=pack_boot_scripts())
    s3.put_object(Bucket=bucket, Key="runs/another-run/COMPLETE", Body=b"{}")
    s3.put_object(Bucket=bucket, Key=f"runs/{run_id}0/events.jsonl", Body=b"{}")  # a sibling: runs/exp-70
    s3.put_object(Bucket=OTHER_BUCKET, Key=f"runs/{run_id}/progress.json", Body=b"{}")
    iam_cloud.admin("ecr", REGION).create_repository(repositoryName=repository)
    _build_group(iam_cloud, group, 2)
    _build_group(iam_cloud, OTHER_GROUP, 1)

    iam = iam_cloud.admin("iam", REGION)
    # moto fails a trust policy with a Service principal (HTTP 500): trust the admin user instead.
    role = iam.create_role(
        RoleName="trainstack-machine",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": "sts:AssumeRole",
            "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:user/{ADMIN_USER}"}}]}),
    )["Role"]
    iam.put_role_policy(RoleName="trainstack-machine", PolicyName="machine", PolicyDocument=policy)
    creds = iam_cloud.admin("sts", REGION).assume_role(RoleArn=role["Arn"], RoleSessionName="i-0abc")["Credentials"]
    iam_cloud.proxy.guard(creds["AccessKeyId"], [policy])
    keys = {"AWS_ACCESS_KEY_ID": creds["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
            "AWS_SESSION_TOKEN": creds["SessionToken"]}
    signer = f"arn:aws:iam::{ACCOUNT}:user/{ADMIN_USER}"
    signing_key = iam_cloud.admin("kms", REGION).create_key(
        KeySpec=KEY_SPEC, KeyUsage=KEY_USAGE, Policy=key_policy(partition="aws", account_id=ACCOUNT, signer_arn=signer),
    )["KeyMetadata"]["Arn"]
    return Machine(outputs, policy, bucket, group, repository, run_id, keys, iam_cloud, signing_key)


@pytest.fixture
def on_machine(machine: Machine, monkeypatch: pytest.MonkeyPatch) -> Machine:
    """`machine`, with this process's AWS variables set as on the machine (for code that reads them)."""
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    for k, v in machine.env().items():
        monkeypatch.setenv(k, v)
    return machine


def error_code(call) -> str:
    """The AWS error code a call fails with; fails the test when the call succeeds."""
    with pytest.raises(botocore.exceptions.ClientError) as info:
        call()
    return info.value.response["Error"]["Code"]


def decided(machine: Machine, action: str, resource_part: str) -> list[Decision]:
    """The layer's decisions for this action on resources containing `resource_part`."""
    key = machine.keys["AWS_ACCESS_KEY_ID"]
    return [d for k, a, r, d in machine.cloud.proxy.decisions if k == key and a == action and resource_part in r]


# -- what the machine needs --------------------------------------------------------


def test_the_trainers_store_works_under_its_run(on_machine: Machine, tmp_path) -> None:
    store = open_store(on_machine.outputs["runUri"])
    store.put_bytes("checkpoints/ckpt-10/COMMITTED", b"10")
    big = tmp_path / "weights"
    big.write_bytes(os.urandom(9 * 1024 * 1024))  # above the 8 MiB threshold: a multipart upload
    store.put_file("checkpoints/ckpt-10/weights", str(big))
    assert store.get_bytes("checkpoints/ckpt-10/COMMITTED") == b"10"
    back = tmp_path / "back"
    store.get_file("checkpoints/ckpt-10/weights", str(back))
    assert back.read_bytes() == big.read_bytes()
    store.append_line(layout.EVENTS_KEY, '{"event": "started"}')
    assert sorted(store.list("checkpoints/")) == ["checkpoints/ckpt-10/COMMITTED", "checkpoints/ckpt-10/weights"]
    # A missing key: AWS answers 403 (no ListBucket without a prefix); the store still says "absent".
    assert not store.exists("checkpoints/ckpt-99/COMMITTED")
    with pytest.raises(NotFound):
        store.get_bytes("COMPLETE")
    store.delete_prefix("checkpoints/")
    assert store.list("checkpoints/") == []
    # The layer decided these, with the conditions evaluated (not moto's unconditional match).
    assert Decision.ALLOW in decided(on_machine, "s3:ListBucket", on_machine.bucket)
    assert decided(on_machine, "s3:DeleteObject", "/checkpoints/ckpt-10/weights") == [Decision.ALLOW]


def _checkpoint_tags(machine: Machine, key: str) -> dict[str, str]:
    s3 = machine.cloud.admin("s3", REGION)
    tags = s3.get_object_tagging(Bucket=machine.bucket, Key=f"runs/{machine.run_id}/{key}")["TagSet"]
    return {t["Key"]: t["Value"] for t in tags}


def test_checkpoint_uploads_carry_the_lifecycle_tag_as_the_role(on_machine: Machine, tmp_path) -> None:
    """Both upload paths (one PutObject, a multipart upload) send the checkpoint tag, which AWS
    authorizes as s3:PutObjectTagging too; other run files go up untagged (no tagging call)."""
    store = open_store(on_machine.outputs["runUri"])
    big = tmp_path / "ckpt.data"
    big.write_bytes(os.urandom(9 * 1024 * 1024))  # above the 8 MiB threshold: a multipart upload
    before = len(decided(on_machine, "s3:PutObjectTagging", "/checkpoints/"))
    store.put_file("checkpoints/ckpt-20/ckpt.data", str(big))
    store.put_bytes("checkpoints/ckpt-20/COMMITTED", b"{}")
    store.put_bytes(layout.PROGRESS_KEY, b"{}")
    tagging = decided(on_machine, "s3:PutObjectTagging", "/checkpoints/")[before:]
    assert tagging == [Decision.ALLOW, Decision.ALLOW]  # CreateMultipartUpload and PutObject
    assert not decided(on_machine, "s3:PutObjectTagging", "/" + layout.PROGRESS_KEY)
    mark = {layout.CHECKPOINT_TAG_KEY: layout.CHECKPOINT_TAG_VALUE}
    assert _checkpoint_tags(on_machine, "checkpoints/ckpt-20/ckpt.data") == mark
    assert _checkpoint_tags(on_machine, "checkpoints/ckpt-20/COMMITTED") == mark
    assert _checkpoint_tags(on_machine, layout.PROGRESS_KEY) == {}
    store.delete_prefix("checkpoints/ckpt-20/")


def test_checkpoint_uploads_need_the_tagging_grant(on_machine: Machine, tmp_path) -> None:
    """The same policy without s3:PutObjectTagging refuses a checkpoint upload: the grant is needed."""
    policy = json.loads(on_machine.policy)
    for statement in policy["Statement"]:
        if statement.get("Sid") == "ReadWriteRun":
            statement["Action"] = [a for a in statement["Action"] if a != "s3:PutObjectTagging"]
            assert "s3:PutObjectTagging" not in statement["Action"]
    key = on_machine.keys["AWS_ACCESS_KEY_ID"]
    on_machine.cloud.proxy.guard(key, [json.dumps(policy)])
    try:
        s3 = on_machine.client("s3")
        tag = f"{layout.CHECKPOINT_TAG_KEY}={layout.CHECKPOINT_TAG_VALUE}"
        assert error_code(lambda: s3.put_object(Bucket=on_machine.bucket, Key=f"{RUN}/checkpoints/ckpt-30/x",
                                                Body=b"x", Tagging=tag)) == "AccessDenied"
        assert decided(on_machine, "s3:PutObjectTagging", "/checkpoints/ckpt-30/x") == [Decision.IMPLICIT_DENY]
        s3.put_object(Bucket=on_machine.bucket, Key=f"{RUN}/checkpoints/ckpt-30/x", Body=b"x")  # untagged: allowed
    finally:
        on_machine.cloud.proxy.guard(key, [on_machine.policy])
    s3.delete_object(Bucket=on_machine.bucket, Key=f"{RUN}/checkpoints/ckpt-30/x")


def test_the_run_lease_works_as_the_role(on_machine: Machine) -> None:
    """The lease's conditional writes (If-None-Match / If-Match on PutObject) need no grant beyond
    s3:PutObject and s3:GetObject under the run: taken, refused to a second holder, released."""
    from runfolder.lease import LeaseHeld, RunLease

    store = open_store(on_machine.outputs["runUri"])
    first = RunLease(store, holder="machine-a/1", ttl_s=20, poll_s=0.1, wait_s=0.3)
    assert first.acquire() == 1
    first.renew()
    second = RunLease(open_store(on_machine.outputs["runUri"]), holder="machine-b/1", ttl_s=20, poll_s=0.1, wait_s=0.3)
    with pytest.raises(LeaseHeld):
        second.acquire()
    first.release()
    assert second.acquire() == 2
    assert Decision.ALLOW in decided(on_machine, "s3:PutObject", "/" + layout.LEASE_KEY)
    assert set(decided(on_machine, "s3:PutObject", "/" + layout.LEASE_KEY)) == {Decision.ALLOW}


def test_it_reads_the_code_archive_and_its_boot_scripts(machine: Machine) -> None:
    key = machine.outputs["codeUri"].removeprefix(f"s3://{machine.bucket}/")
    body = machine.client("s3").get_object(Bucket=machine.bucket, Key=key)["Body"].read()
    assert body == b"code archive"
    boot = machine.client("s3").get_object(Bucket=machine.bucket, Key=boot_key(pack_boot_scripts()))["Body"].read()
    assert boot == pack_boot_scripts()


def test_it_pulls_its_image(machine: Machine) -> None:
    ecr = machine.client("ecr")
    assert ecr.get_authorization_token()["authorizationData"]
    # An empty repository: the call is authorized, and the image is reported missing.
    answer = ecr.batch_get_image(repositoryName=machine.repository, imageIds=[{"imageTag": "x"}])
    assert answer["images"] == [] and answer["failures"]
    assert decided(machine, "ecr:BatchGetImage", machine.repository) == [Decision.ALLOW]


def test_the_finish_path_uploads_logs_and_scales_its_group_to_zero(machine: Machine) -> None:
    s3 = machine.client("s3")
    logs = f"{layout.run_prefix(machine.run_id)}{layout.LOGS_PREFIX}i-0abc/trainstack.log"
    s3.upload_fileobj(io.BytesIO(b"boot log"), machine.bucket, logs)
    s3.put_object(Bucket=machine.bucket, Key=f"{layout.run_prefix(machine.run_id)}{layout.FAILED}", Body=b"{}")
    # userdata/lib.sh scale_to_zero: update-auto-scaling-group --min-size 0 --max-size 0 --desired-capacity 0.
    machine.client("autoscaling").update_auto_scaling_group(
        AutoScalingGroupName=machine.group, MinSize=0, MaxSize=0, DesiredCapacity=0)
    group = machine.cloud.admin("autoscaling", REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=[machine.group])["AutoScalingGroups"][0]
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (0, 0, 0)
    assert decided(machine, "autoscaling:UpdateAutoScalingGroup", f"autoScalingGroupName/{machine.group}") == [
        Decision.ALLOW]


def sandbox(machine: Machine, tmp: Path) -> dict[str, str]:
    """The environment the boot scripts run in: the machine's env file, its keys, and the stand-in commands."""
    root, bin_dir = tmp / "root", tmp / "bin"
    for d in (root / "etc/trainstack", bin_dir):
        d.mkdir(parents=True)
    for name in ("aws", "shutdown", "journalctl"):
        (bin_dir / name).write_text(cli_server.wrapper(name, FAKES))
        (bin_dir / name).chmod(0o755)
    (root / "etc/trainstack/env").write_text("".join(f"{k}={v}\n" for k, v in {
        "TRAINSTACK_CLOUD": "aws", "TRAINSTACK_REGION": REGION, "TRAINSTACK_RUN_URI": machine.outputs["runUri"],
        "TRAINSTACK_GROUP": machine.group, "TRAINSTACK_IMAGE": machine.outputs["imageRef"],
    }.items()))
    keep = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**keep, **machine.env(), "PATH": f"{bin_dir}:/usr/bin:/bin", "TRAINSTACK_ROOT": str(root),
            "TRAINSTACK_LIB": str(ROOT / "userdata/lib.sh"), "TRAINSTACK_RETRY_BASE_S": "0",
            # Nothing answers here: the instance id falls back to the host name, as lib.sh intends.
            "TRAINSTACK_METADATA_URL": "http://127.0.0.1:9", "FAKE_LOG": str(tmp / "calls.jsonl"),
            "FAKE_STATE": str(tmp / "state"), "AWS_CONFIG_FILE": os.devnull,
            "FAKE_CLI_SOCKET": cli_server.ensure_server(),
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def test_finish_sh_itself_ends_a_run_as_the_role(machine: Machine, tmp_path: Path) -> None:
    """userdata/finish.sh, unchanged: marker, logs, scale to zero, all as the machine's role."""
    env = sandbox(machine, tmp_path)
    admin_asg = machine.cloud.admin("autoscaling", REGION)
    admin_asg.update_auto_scaling_group(AutoScalingGroupName=machine.group, MinSize=0, MaxSize=2, DesiredCapacity=2)
    run = layout.run_prefix(machine.run_id)
    for marker in layout.END_MARKERS:  # an earlier test's marker would make finish.sh keep it
        machine.cloud.admin("s3", REGION).delete_object(Bucket=machine.bucket, Key=f"{run}{marker}")
    proc = subprocess.run(["bash", str(ROOT / "userdata/finish.sh"), "FAILED", "a test"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "could not" not in proc.stderr and "scaled to zero" in proc.stderr, proc.stderr
    group = admin_asg.describe_auto_scaling_groups(AutoScalingGroupNames=[machine.group])["AutoScalingGroups"][0]
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (0, 0, 0)
    s3 = machine.cloud.admin("s3", REGION)
    marker = json.loads(s3.get_object(Bucket=machine.bucket, Key=f"{run}{layout.FAILED}")["Body"].read())
    assert marker["reason"] == "a test"
    logs = s3.list_objects_v2(Bucket=machine.bucket, Prefix=f"{run}{layout.LOGS_PREFIX}")["Contents"]
    assert any(o["Key"].endswith("/trainstack.log") for o in logs)
    calls = [json.loads(line)["argv"][:2] for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert ["autoscaling", "update-auto-scaling-group"] in calls


def test_the_rendezvous_runs_as_the_role(machine: Machine, tmp_path: Path) -> None:
    """userdata/rendezvous.sh, unchanged: heartbeat, list, read, seal (a conditional create), as the role."""
    from devtools.metadata import MetadataServer

    run = layout.run_prefix(machine.run_id)
    for marker in layout.END_MARKERS:  # an earlier test's marker: the machine would not join an ended run
        machine.cloud.admin("s3", REGION).delete_object(Bucket=machine.bucket, Key=f"{run}{marker}")
    md = MetadataServer(instance_id="i-0rendezvous", address="10.1.2.3")
    try:
        env = {**sandbox(machine, tmp_path), "TRAINSTACK_METADATA_URL": md.url, "TRAINSTACK_NODES": "1"}
        script = ('. "$TRAINSTACK_LIB" && . "$(dirname "$TRAINSTACK_LIB")/rendezvous.sh" && load_env && '
                  'DEADLINE=$(($(date +%s) + 120)) CLUSTER_POLL_S=0.2 RENDEZVOUS_TTL_S=60 WORKER_PORT=2222 && '
                  'CONTAINER_ENV="$RUNTIME_DIR/env" && join_generation && cat "$CONTAINER_ENV" && '
                  'rc=0 && echo x | store_create "$RUN_URI/${RENDEZVOUS_PREFIX}gen-0/sealed" || rc=$?; echo "again=$rc"')
        proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    finally:
        md.close()
    assert proc.returncode == 0, proc.stderr
    assert 'TF_CONFIG={"cluster":{"worker":["10.1.2.3:2222"]}' in proc.stdout and "again=1" in proc.stdout, proc.stderr
    keys = [o["Key"] for o in machine.cloud.admin("s3", REGION).list_objects_v2(
        Bucket=machine.bucket, Prefix=f"{run}{layout.RENDEZVOUS_PREFIX}")["Contents"]]
    assert f"{run}{layout.RENDEZVOUS_PREFIX}gen-0/sealed" in keys
    assert any(k.startswith(f"{run}{layout.RENDEZVOUS_PREFIX}gen-0/members/i-0rendezvous-") for k in keys)
    assert "AccessDenied" not in proc.stderr


def test_the_package_cache_is_written_once_and_read_as_the_role(machine: Machine, tmp_path: Path) -> None:
    """The package cache (trainer/pip_cache.sh over userdata/lib.sh), unchanged: listing, upload, the commit (a conditional
    create), a second commit refused as existing, and the read back, all as the role."""
    env = sandbox(machine, tmp_path)
    script = ('. "$TRAINSTACK_LIB" && . "$PIP_CACHE" && load_env && mkdir -p "$T/pkgs/nvidia/cudnn/lib" && '
              'head -c 100000 /dev/urandom >"$T/pkgs/nvidia/cudnn/lib/libcudnn.so.9" && '
              'pip_cache_put k0123456789abcdef "$T/pkgs" && pip_cache_get k0123456789abcdef "$T/back" && '
              'cmp "$T/pkgs/nvidia/cudnn/lib/libcudnn.so.9" "$T/back/nvidia/cudnn/lib/libcudnn.so.9" && '
              'rc=0 && pip_commit "$(pip_cache_uri k0123456789abcdef)" x || rc=$?; echo "again=$rc"')
    proc = subprocess.run(["bash", "-c", script], env={**env, "T": str(tmp_path), "PIP_CACHE": str(ROOT / "trainer/pip_cache.sh")}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "again=1" in proc.stdout, proc.stderr
    assert "cached in the bucket" in proc.stderr and "from the bucket's cache" in proc.stderr, proc.stderr
    prefix = layout.pip_cache_prefix("k0123456789abcdef")
    keys = [o["Key"] for o in machine.cloud.admin("s3", REGION).list_objects_v2(
        Bucket=machine.bucket, Prefix=prefix)["Contents"]]
    assert len(keys) == 2 and f"{prefix}{layout.COMMITTED}" in keys
    assert Decision.ALLOW in decided(machine, "s3:ListBucket", machine.bucket)
    assert set(decided(machine, "s3:PutObject", "/" + prefix)) == {Decision.ALLOW}
    assert "AccessDenied" not in proc.stderr


# -- what it must not do -----------------------------------------------------------

RUN = f"runs/{aws_helpers.BASE['run']['id']}"

REFUSED = {
    "read another bucket": ("s3", lambda m, c: c.get_object(Bucket=OTHER_BUCKET, Key=f"{RUN}/progress.json")),
    "write another bucket": ("s3", lambda m, c: c.put_object(Bucket=OTHER_BUCKET, Key=f"{RUN}/x", Body=b"x")),
    "list another bucket": ("s3", lambda m, c: c.list_objects_v2(Bucket=OTHER_BUCKET, Prefix=f"{RUN}/")),
    "read another run": ("s3", lambda m, c: c.get_object(Bucket=m.bucket, Key="runs/another-run/COMPLETE")),
    "write a sibling run": ("s3", lambda m, c: c.put_object(Bucket=m.bucket, Key=f"{RUN}0/COMPLETE", Body=b"x")),
    "list all runs": ("s3", lambda m, c: c.list_objects_v2(Bucket=m.bucket, Prefix="runs/")),
    "list the whole bucket": ("s3", lambda m, c: c.list_objects_v2(Bucket=m.bucket)),
    "write beside the package cache": ("s3", lambda m, c: c.put_object(Bucket=m.bucket, Key="cachex/pip", Body=b"x")),
    "list beside the package cache": ("s3", lambda m, c: c.list_objects_v2(Bucket=m.bucket, Prefix="cach")),
    "delete a package cache entry": ("s3", lambda m, c: c.delete_object(
        Bucket=m.bucket, Key=f"{layout.pip_cache_prefix('k0')}{layout.COMMITTED}")),
    "overwrite the code": ("s3", lambda m, c: c.put_object(Bucket=m.bucket, Key="code/evil.tar.gz", Body=b"x")),
    "scale another group": ("autoscaling", lambda m, c: c.update_auto_scaling_group(
        AutoScalingGroupName=OTHER_GROUP, MinSize=0, MaxSize=0, DesiredCapacity=0)),
    "scale its group up": ("autoscaling", lambda m, c: c.update_auto_scaling_group(
        AutoScalingGroupName=m.group, MinSize=0, MaxSize=8, DesiredCapacity=8)),
    "raise only the desired capacity": ("autoscaling", lambda m, c: c.update_auto_scaling_group(
        AutoScalingGroupName=m.group, DesiredCapacity=2)),
    "set desired capacity": ("autoscaling", lambda m, c: c.set_desired_capacity(
        AutoScalingGroupName=m.group, DesiredCapacity=2)),
    "push an image": ("ecr", lambda m, c: c.put_image(repositoryName=m.repository, imageManifest="{}",
                                                      imageTag="evil")),
    "start a layer upload": ("ecr", lambda m, c: c.initiate_layer_upload(repositoryName=m.repository)),
    "create a user": ("iam", lambda m, c: c.create_user(UserName="backdoor")),
    "list instances (peers come from the run folder)": ("ec2", lambda m, c: c.describe_instances()),
    "seal another run's generation": ("s3", lambda m, c: c.put_object(
        Bucket=m.bucket, Key=f"runs/another-run/{layout.RENDEZVOUS_PREFIX}gen-0/sealed", Body=b"{}", IfNoneMatch="*")),
    "tag another run's object": ("s3", lambda m, c: c.put_object_tagging(
        Bucket=m.bucket, Key="runs/another-run/COMPLETE", Tagging={"TagSet": [{"Key": "k", "Value": "v"}]})),
    "retag an old version of its own object": ("s3", lambda m, c: c.put_object_tagging(
        Bucket=m.bucket, Key=f"{RUN}/events.jsonl", VersionId="v1", Tagging={"TagSet": []})),
    "delete a version of its own object (pruning leaves versions to the bucket's rules)": (
        "s3", lambda m, c: c.delete_object(Bucket=m.bucket, Key=f"{RUN}/events.jsonl", VersionId="v1")),
    # It verifies its image with the public key in its user data: the stack's signing key is not its to use.
    "sign with the stack's key": ("kms", lambda m, c: c.sign(KeyId=m.signing_key, Message=b"{}", MessageType="RAW",
                                                             SigningAlgorithm="ECDSA_SHA_256")),
    "read the signing key's public key": ("kms", lambda m, c: c.get_public_key(KeyId=m.signing_key)),
    "launch instances": ("ec2", lambda m, c: c.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                                                             InstanceType="p5.48xlarge")),
}
# The codes AWS answers a refusal with, per service.
DENIED = {"s3": "AccessDenied", "autoscaling": "AccessDenied", "iam": "AccessDenied",
          "ecr": "AccessDeniedException", "ec2": "UnauthorizedOperation", "kms": "AccessDeniedException"}


def test_the_data_index_is_written_once_and_read_as_the_role(on_machine: Machine, tmp_path: Path) -> None:
    """A data set's record counts (trainer/staging.py) in the bucket's cache/data/: the first trainer that counted
    creates the index (create-if-absent), the next one reads it; the data in a prefix the role reads."""
    import tensorflow as tf

    from trainer.staging import Staging

    admin = on_machine.cloud.admin("s3", REGION)
    prefix = f"runs/{on_machine.run_id}/datasets/tiny/"
    for f in range(2):
        path = tmp_path / f"part-{f}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as w:
            for i in range(3 + f):
                w.write(f"record {i}".encode())
        admin.upload_file(str(path), on_machine.bucket, f"{prefix}{path.name}")
    data_uri, run_uri = f"s3://{on_machine.bucket}/{prefix}", on_machine.outputs["runUri"]
    first = Staging(data_uri, str(tmp_path / "a"), run_uri=run_uri, wait_s=60)
    assert first.index_state == "absent"  # a 403 for the missing key, told apart by the listing the role may make
    first.start([0, 1]).wait_all()
    assert first.index_state == "written" and first.records() == 7
    later = Staging(data_uri, str(tmp_path / "b"), run_uri=run_uri, wait_s=60)
    assert later.index_state == "used" and later.records() == 7
    assert decided(on_machine, "s3:PutObject", f"/{layout.CACHE_PREFIX}{layout.DATA_INDEX_DIR}/") == [Decision.ALLOW]


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_calls_outside_its_scope_are_refused(machine: Machine, what: str) -> None:
    service, call = REFUSED[what]
    client = machine.client(service)
    before = len(machine.cloud.proxy.decisions)
    assert error_code(lambda: call(machine, client)) == DENIED[service]
    # The refusal is the layer's evaluation of the synth policy (or moto's, behind it, for S3/IAM).
    assert any(d is not Decision.ALLOW for *_, d in machine.cloud.proxy.decisions[before:])


def test_deleting_another_runs_objects_is_refused_per_key(machine: Machine) -> None:
    # DeleteObjects answers 200; each key the caller may not delete is an AccessDenied entry (as AWS does).
    answer = machine.client("s3").delete_objects(
        Bucket=machine.bucket, Delete={"Objects": [{"Key": "runs/another-run/COMPLETE"}]})
    assert [(e["Key"], e["Code"]) for e in answer["Errors"]] == [("runs/another-run/COMPLETE", "AccessDenied")]
    assert decided(machine, "s3:DeleteObject", "runs/another-run/COMPLETE")[-1] is Decision.IMPLICIT_DENY
    s3 = machine.cloud.admin("s3", REGION)
    assert s3.get_object(Bucket=machine.bucket, Key="runs/another-run/COMPLETE")["Body"].read() == b"{}"


def test_a_sibling_runs_names_cannot_be_listed(machine: Machine) -> None:
    s3 = machine.client("s3")
    prefix = layout.run_prefix(machine.run_id).rstrip("/")
    assert error_code(lambda: s3.list_objects_v2(Bucket=machine.bucket, Prefix=prefix)) == "AccessDenied"


def test_refused_calls_changed_nothing(machine: Machine) -> None:
    admin_asg = machine.cloud.admin("autoscaling", REGION)
    for name in (machine.group, OTHER_GROUP):
        before = admin_asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
        for what in ("scale another group", "scale its group up", "raise only the desired capacity"):
            service, call = REFUSED[what]
            with pytest.raises(botocore.exceptions.ClientError):
                call(machine, machine.client(service))
        after = admin_asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
        assert [before[k] for k in ("MinSize", "MaxSize", "DesiredCapacity")] == [
            after[k] for k in ("MinSize", "MaxSize", "DesiredCapacity")]
    s3 = machine.cloud.admin("s3", REGION)
    assert s3.get_object(Bucket=machine.bucket, Key="runs/another-run/COMPLETE")["Body"].read() == b"{}"
    assert machine.cloud.admin("iam", REGION).list_users()["Users"][0]["UserName"] == ADMIN_USER


def test_moto_itself_enforces_behind_the_layer(machine: Machine) -> None:
    """Straight to moto (no layer): the role's keys are checked by moto too, so the layer only adds refusals."""
    direct = boto3.session.Session().client(
        "s3", endpoint_url=machine.cloud.endpoint, region_name=REGION,
        aws_access_key_id=machine.keys["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=machine.keys["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=machine.keys["AWS_SESSION_TOKEN"],
    )
    assert error_code(lambda: direct.get_object(Bucket=OTHER_BUCKET, Key=f"{RUN}/progress.json")) == "AccessDenied"
    stranger = boto3.session.Session().client(
        "s3", endpoint_url=machine.cloud.endpoint, region_name=REGION,
        aws_access_key_id="AKIAIOSFODNN7EXAMPLE", aws_secret_access_key="wrong",
    )
    assert error_code(lambda: stranger.list_objects_v2(Bucket=machine.bucket)) == "InvalidAccessKeyId"
    # The gap the layer closes: moto alone ignores the s3:prefix condition.
    direct.list_objects_v2(Bucket=machine.bucket, Prefix="runs/")
