"""A GCE machine of an AWS-home stack resumes the run from the home S3 bucket, with federated credentials
only, and ends it COMPLETE.

The run's first attempt trains "at home" (the trainer with the admin's keys) and stops after its first
committed checkpoint. Then a machine of the stack's GCP placement boots in the sandbox: GCE's metadata
server (devtools/metadata.py, which serves its service account's ID token), the fake `gcloud` for its
group, and for the store the fake `aws` and the trainer's own boto3 with no AWS key at all, only
AWS_ROLE_ARN and the token file lib.sh keeps. Every AWS call goes through the IAM-enforcing layer
(tests/fixtures/iam_cloud.py): STS's AssumeRoleWithWebIdentity is decided on the token by the synth
output's own trust policy, and the session's calls by the role's own policy. The machine resumes from the
committed step, ends the run COMPLETE and resizes its own GCE group to zero.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from components import placement
from components.aws.federation import audience
from components.code import archive_key, pack
from components.settings import load_settings
from components.userdata import aws_store_env, boot_env
from devtools.metadata import MetadataServer
from devtools.sandbox import Sandbox
from devtools.servers import Run
from ops import synth
from ops.fakes.common import fake_hex
from tests.fixtures.iam_cloud import IamCloud, iam_cloud  # noqa: F401 - a fixture, found by name
from tests.iam.policy_eval import Decision
from tests.trainer.helpers import REPO, trainer_env
from tests.userdata.helpers import wait_for
from trainer import layout

pytestmark = pytest.mark.slow

REGION = "us-east-1"
STEPS, EVERY, BATCH, SEED = 300, 100, 16, 11
RAW = {
    "cloud": "aws", "region": REGION,
    "run": {"id": "exp-7", "model": "mlp", "synthetic": True, "steps": STEPS, "batchSize": BATCH, "seed": SEED,
            "checkpointEverySteps": EVERY, "checkpointEverySeconds": 600, "extraArgs": ["--deterministic"]},
    "compute": {"maxRuntimeHours": 1},
    "placements": [{"cloud": "aws", "region": REGION, "instanceTypes": ["g5.xlarge"]},
                   {"cloud": "gcp", "region": "us-central1", "project": "my-gpus-42", "instanceTypes": ["g2-standard-4"]}],
}
STATIC_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


def _admin_env(cloud: IamCloud) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": cloud.proxy.url, "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": cloud.proxy.admin[0], "AWS_SECRET_ACCESS_KEY": cloud.proxy.admin[1]}


def test_a_gce_machine_resumes_from_the_s3_home_with_its_google_identity_and_completes(
        iam_cloud: IamCloud, tmp_path):  # noqa: F811
    settings = load_settings(RAW, stack="places")
    r = synth.synthesize(RAW, stack="places")
    (role,) = [x for x in r.of_type("aws:iam/role:Role") if x["parent"] == "trainstack-federation-p1"]
    (policy,) = [x for x in r.of_type("aws:iam/rolePolicy:RolePolicy") if x["parent"] == "trainstack-federation-p1"]
    unique_id = str(int(fake_hex("gcp:serviceaccount/account:Account", "trainstack-identity-p1-sa")[:15], 16))
    group = r.named("trainstack-group-p1-mig")["inputs"]["name"]
    bucket, run_uri = r.outputs["bucketName"], r.outputs["runUri"]

    s3 = iam_cloud.admin("s3", REGION)
    s3.create_bucket(Bucket=bucket)
    data = pack()
    s3.put_object(Bucket=bucket, Key=archive_key(data), Body=data)
    code_uri = f"s3://{bucket}/{archive_key(data)}"
    iam = iam_cloud.admin("iam", REGION)
    arn = iam.create_role(RoleName="trainstack-gcp-p1", AssumeRolePolicyDocument=role["inputs"]["assumeRolePolicy"],
                          )["Role"]["Arn"]
    iam.put_role_policy(RoleName="trainstack-gcp-p1", PolicyName="machine", PolicyDocument=policy["inputs"]["policy"])
    iam_cloud.proxy.trust(arn, role["inputs"]["assumeRolePolicy"], [policy["inputs"]["policy"]])

    # 1. Home's attempt: trains to its first committed checkpoint, held there, then stopped.
    home_env = {k: v for k, v in boot_env(settings, run_uri=run_uri, group="home", code_uri="").items()
                if k.startswith("TRAINSTACK_") and k != "TRAINSTACK_GPUS_PER_NODE"}
    state = tmp_path / "home-state"
    state.mkdir()
    home = subprocess.Popen([sys.executable, "-m", "tests.userdata.held_trainer", "--run-uri", run_uri], cwd=REPO,
                            env=trainer_env(**_admin_env(iam_cloud), **home_env, FAKE_STATE=str(state)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (state / "trainer-held").exists() or home.poll() is not None, 180, "home's first checkpoint")
        assert home.poll() is None, home.stderr.read()[-3000:]
        os.kill(home.pid, signal.SIGTERM)
        assert home.wait(timeout=120) == 143, home.stderr.read()[-3000:]
    finally:
        if home.poll() is None:
            home.kill()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"runs/exp-7/{layout.CHECKPOINTS_PREFIX}")
            .get("Contents", [])]
    committed = sorted(s for k in keys for s, rest in [layout.checkpoint_key_step(k.split("runs/exp-7/", 1)[1])
                                                        or (0, "")] if rest == layout.COMMITTED)
    assert committed and committed[-1] < STEPS

    # 2. A machine of the GCP placement: GCE's metadata (its account's ID token), no AWS key anywhere.
    md = MetadataServer(name="trainstack-places-gpu-p1-abcd", service_account_id=unique_id)
    box = None
    try:
        run = Run(uri=run_uri, bucket=bucket, vars={"AWS_ENDPOINT_URL": iam_cloud.proxy.url, "AWS_DEFAULT_REGION": REGION})
        box = Sandbox(tmp_path / "gce", run, md, group, code_uri, settings=placement.settings_at(settings, 1),
                      env_overrides=aws_store_env(region=REGION, role_arn=arn, audience=audience(group)))
        for k in STATIC_KEYS:
            box.env.pop(k, None)
        box.env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        assert box.boot().wait(timeout=400) == 0, box.journal()[-4000:]
        token_file = box.root / "run/trainstack/federation/aws-token"
        assert token_file.exists() and oct(token_file.stat().st_mode & 0o777) == "0o600"
    finally:
        if box is not None:
            box.power_off()
        md.close()

    # It resumed at home's last committed step and ended the run.
    assert s3.head_object(Bucket=bucket, Key=f"runs/exp-7/{layout.COMPLETE}")
    events = [line for line in s3.get_object(Bucket=bucket, Key=f"runs/exp-7/{layout.EVENTS_KEY}")["Body"]
              .read().decode().splitlines()]
    resumed = [e for e in map(json.loads, events) if e[layout.EVENT] == layout.RESUMED]
    assert [e["step"] for e in resumed] == [committed[-1]]
    # With its own identity: tokens for the placement's audience, sessions STS gave for them, and every
    # call of those sessions allowed by the role's policy.
    assert md.identity_audiences and set(md.identity_audiences) == {audience(group)}
    decisions = iam_cloud.proxy.decisions
    assert ("web-identity", "sts:AssumeRoleWithWebIdentity", arn, Decision.ALLOW) in decisions
    session_keys = set(iam_cloud.proxy.web_identity_keys)
    assert session_keys
    puts = [d for k, a, res, d in decisions if k in session_keys and a == "s3:PutObject"
            and res.endswith(f"runs/exp-7/{layout.COMPLETE}")]
    assert puts == [Decision.ALLOW]
    # Its finish step resized its own GCE group to zero.
    assert any(argv[:5] == ["compute", "instance-groups", "managed", "resize", group] and "0" in argv
               for argv in box.argvs("gcloud"))
