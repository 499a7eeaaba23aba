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

from components.userdata import boot_env
from runfolder import layout
from tests.fixtures.iam_cloud import IamCloud
from tests.trainer.helpers import REPO, trainer_env
from tests.userdata import cross_cloud
from tests.userdata.helpers import wait_for

pytestmark = pytest.mark.slow

STEPS, EVERY, BATCH, SEED = 300, 100, 16, 11


def test_a_gce_machine_resumes_from_the_s3_home_with_its_google_identity_and_completes(
        iam_cloud: IamCloud, tmp_path):
    home_stack = cross_cloud.aws_home(iam_cloud, cross_cloud.raw_stack(steps=STEPS, every=EVERY, batch=BATCH, seed=SEED))
    settings, bucket, run_uri, group = home_stack.settings, home_stack.bucket, home_stack.run_uri, home_stack.gcp_group
    s3 = iam_cloud.admin("s3", home_stack.raw["region"])

    # 1. Home's attempt: trains to its first committed checkpoint, held there, then stopped.
    home_env = {k: v for k, v in boot_env(settings, run_uri=run_uri, group="home", code_uri="").items()
                if k.startswith("TRAINSTACK_") and k != "TRAINSTACK_GPUS_PER_NODE"}
    state = tmp_path / "home-state"
    state.mkdir()
    home = subprocess.Popen([sys.executable, "-m", "tests.userdata.held_trainer", "--run-uri", run_uri], cwd=REPO,
                            env=trainer_env(**home_stack.admin_env(iam_cloud), **home_env, FAKE_STATE=str(state)),
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
    md = cross_cloud.gce_metadata(home_stack)
    box = None
    try:
        box = cross_cloud.gce_machine(tmp_path / "gce", home_stack, md, iam_cloud.proxy.url)
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
    cross_cloud.assert_ended_with_its_google_identity(iam_cloud, md, home_stack)
    # Its finish step resized its own GCE group to zero.
    assert any(argv[:5] == ["compute", "instance-groups", "managed", "resize", group] and "0" in argv
               for argv in box.argvs("gcloud"))
