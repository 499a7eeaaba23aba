"""An EC2 machine of a GCP-home stack resumes the run from the home GCS bucket with its instance role
only, and ends it COMPLETE.

The run's first attempt trains "at home" (the trainer straight on the emulator) and stops after its first
committed checkpoint. Then a machine of the stack's AWS placement boots in the sandbox: EC2's metadata
server (devtools/metadata.py, which serves the instance role's keys: moto issued them for that role), the
fake `aws` for its group (boto3 with the same instance role), and for the store the fake `gcloud` and the
trainer's own google-cloud-storage with no Google key at all, only the env file's pool provider and service
account (`components/userdata.py` `gcs_store_env`). federation-gcp.sh writes google-auth's `external_account`
configuration from them; the Google side (tests/controller/federation.py) checks the role's signed
GetCallerIdentity against moto and issues the service account's tokens, and every GCS request goes through
a gate (tests/fixtures/gcs_tokens.py) that admits only that account's tokens, only for the run's folder and
the code and boot archives.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import boto3
import pytest

from components.code import archive_key, boot_key, pack, pack_boot_scripts
from components.userdata import boot_env, gcs_store_env
from devtools.fault_proxy import FaultProxy
from devtools.metadata import MetadataServer
from devtools.sandbox import Sandbox, make_group, settings_for
from devtools.servers import Run
from runfolder import layout
from tests.controller.federation import GoogleSide, Pool
from tests.fixtures.gcs_tokens import GcsTokens
from tests.trainer.helpers import REPO, trainer_env
from tests.userdata.helpers import wait_for

STEPS, EVERY, BATCH, SEED = 300, 100, 16, 11
ACCOUNT = "123456789012"  # moto's
ROLE = "trainstack-gcs-machine-p1"
AUDIENCE = ("//iam.googleapis.com/projects/418026337123/locations/global/workloadIdentityPools/trainstack-places"
            "/providers/aws-p1")
SERVICE_ACCOUNT = "trainstack-places-p1@home-proj.iam.gserviceaccount.com"
# What must not reach the machine: any AWS key or Google credential of the test process.
NOT_ON_THE_MACHINE = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
                      "AWS_DEFAULT_REGION", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_AUTH_CREDENTIAL_FILE_OVERRIDE",
                      "STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")


def _instance_role(md: MetadataServer) -> str:
    """The machine's instance role on moto, its session's keys served by `md`; the session's access key id."""
    iam = boto3.client("iam", region_name="us-east-1")
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com",
                                                                                      "AWS": f"arn:aws:iam::{ACCOUNT}:root"},
                                                      "Action": "sts:AssumeRole"}]}
    try:
        arn = iam.create_role(RoleName=ROLE, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    except iam.exceptions.EntityAlreadyExistsException:
        arn = iam.get_role(RoleName=ROLE)["Role"]["Arn"]
    c = boto3.client("sts", region_name="us-east-1").assume_role(RoleArn=arn, RoleSessionName=md.instance_id)["Credentials"]
    md.attach_role(ROLE, c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"],
                   c["Expiration"].strftime("%Y-%m-%dT%H:%M:%SZ"))
    return c["AccessKeyId"]


@pytest.mark.slow
def test_an_ec2_machine_resumes_from_the_gcs_home_with_its_instance_role_and_completes(
        gs_run, gcs_emulator, moto_server, monkeypatch, tmp_path):
    from google.cloud import storage

    bucket = storage.Client().bucket(gs_run.bucket)  # the emulator itself, as the home's admin
    run_prefix = gs_run.uri.removeprefix(f"gs://{gs_run.bucket}/") + "/"
    code, boot = pack(), pack_boot_scripts()
    bucket.blob(archive_key(code)).upload_from_string(code)
    bucket.blob(boot_key(boot)).upload_from_string(boot)
    settings = settings_for("aws", steps=STEPS, checkpointEverySteps=EVERY, batchSize=BATCH, seed=SEED,
                            extraArgs=["--deterministic"])

    # 1. Home's attempt: trains to its first committed checkpoint, held there, then stopped.
    home_env = {k: v for k, v in boot_env(settings, run_uri=gs_run.uri, group="home", code_uri="").items()
                if k.startswith("TRAINSTACK_") and k != "TRAINSTACK_GPUS_PER_NODE"}
    state = tmp_path / "home-state"
    state.mkdir()
    home = subprocess.Popen([sys.executable, "-m", "tests.userdata.held_trainer", "--run-uri", gs_run.uri], cwd=REPO,
                            env=trainer_env(**home_env, FAKE_STATE=str(state)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (state / "trainer-held").exists() or home.poll() is not None, 180, "home's first checkpoint")
        assert home.poll() is None, home.stderr.read()[-3000:]
        os.kill(home.pid, signal.SIGTERM)
        assert home.wait(timeout=120) == 143, home.stderr.read()[-3000:]
    finally:
        if home.poll() is None:
            home.kill()
    committed = sorted(s for b in bucket.client.list_blobs(bucket, prefix=run_prefix + layout.CHECKPOINTS_PREFIX)
                       for s, rest in [layout.checkpoint_key_step(b.name.removeprefix(run_prefix)) or (0, "")]
                       if rest == layout.COMMITTED)
    assert committed and committed[-1] < STEPS

    # 2. The AWS placement's machine: EC2's metadata (its instance role), the group on moto, no key anywhere.
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": moto_server}.items():
        monkeypatch.setenv(k, v)  # the test's own set-up on moto, as the admin
    md = MetadataServer()
    role_key = _instance_role(md)
    group = make_group(Run(uri="", vars={"AWS_ENDPOINT_URL": moto_server}), 1)
    google = GoogleSide(moto=moto_server, pool=Pool(AUDIENCE, ACCOUNT, ROLE, SERVICE_ACCOUNT))
    gate = GcsTokens(google.access_tokens, service_account=SERVICE_ACCOUNT, bucket=gs_run.bucket,
                     prefixes=(run_prefix, archive_key(code), boot_key(boot), layout.CACHE_PREFIX))
    box = None
    with FaultProxy(gcs_emulator) as proxy:
        proxy.gate = gate
        try:
            box = Sandbox(tmp_path / "ec2", Run(uri=gs_run.uri, bucket=gs_run.bucket, vars={
                "API_ENDPOINT_OVERRIDE": proxy.url, "AWS_ENDPOINT_URL": moto_server}), md, group,
                f"gs://{gs_run.bucket}/{archive_key(code)}", settings=settings, warm_trainer=True,
                env_overrides={**gcs_store_env(audience=AUDIENCE, service_account=SERVICE_ACCOUNT),
                               "TRAINSTACK_BOOT_URI": f"gs://{gs_run.bucket}/{boot_key(boot)}"})
            for k in NOT_ON_THE_MACHINE:
                box.env.pop(k, None)
            box.env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                           AWS_EC2_METADATA_SERVICE_ENDPOINT=md.url,  # the fake `aws`'s boto3: the instance role
                           TRAINSTACK_GOOGLE_STS_URL=google.token_url,
                           TRAINSTACK_GOOGLE_IAM_CREDENTIALS_URL=google.iam_credentials)
            box.boot()
            assert box.wait(timeout=400) == 0, box.journal()[-4000:]
            config_file = box.root / "run/trainstack/federation/google-credentials.json"
            config = json.loads(config_file.read_text())
            assert oct(config_file.stat().st_mode & 0o777) == "0o600"
            on_disk = [p for p in box.root.rglob("*") if p.is_file() and not p.is_symlink()]
            assert on_disk and not [p for p in on_disk if b"private_key" in p.read_bytes()]
        finally:
            if box is not None:
                box.power_off()
            md.close()
            google.close()

    # What it trusts is the pool's provider, through the role's keys from IMDSv2: no secret in the file.
    assert config["type"] == "external_account" and config["audience"] == AUDIENCE
    assert config["credential_source"]["environment_id"] == "aws1"
    assert config["credential_source"]["imdsv2_session_token_url"] == f"{md.url}/latest/api/token"
    # It resumed at home's last committed step and ended the run.
    assert bucket.blob(run_prefix + layout.COMPLETE).exists()
    events = map(json.loads, bucket.blob(run_prefix + layout.EVENTS_KEY).download_as_text().splitlines())
    assert [e["step"] for e in events if e[layout.EVENT] == layout.RESUMED] == [committed[-1]]
    # Every GCS request carried a token of the impersonated account, and reached only what the stack grants
    # it (the run's folder, the archives, cache/); the trainer's own COMPLETE among them. The one refusal
    # is GCS's answer to google-cloud-storage's read of the bucket's metadata (storage.buckets.get, which
    # the account lacks), which the library expects and falls back from.
    assert gate.decisions and {who for _m, _what, who, _ok in gate.decisions} == {SERVICE_ACCOUNT}
    assert {(m, what) for m, what, _who, ok in gate.decisions if not ok} <= {("GET", f"/storage/v1/b/{gs_run.bucket}")}
    assert any(m == "POST" and what == run_prefix + layout.COMPLETE for m, what, _who, _ok in gate.decisions)
    # Google's STS saw the role's signed GetCallerIdentity, with the instance's own keys, and nothing else.
    assert google.exchanges and all(
        e["arn"] == f"arn:aws:sts::{ACCOUNT}:assumed-role/{ROLE}/{md.instance_id}" and e["key"] == role_key
        and e["host_region"] == "us-east-1" for e in google.exchanges), google.exchanges[:3]
    assert google.impersonations and set(google.impersonations) == {(SERVICE_ACCOUNT, True)}
    # The container had the credential file (the folder, read-only) and the variable naming it.
    (trainer_run,) = [a for a in box.argvs("docker") if a[0] == "run" and "trainer" in a]
    assert f"{box.root}/run/trainstack/federation:/run/trainstack/federation:ro" in trainer_run
    assert "GOOGLE_APPLICATION_CREDENTIALS=/run/trainstack/federation/google-credentials.json" in trainer_run
    # Its finish step scaled its own Auto Scaling group to zero, with the instance role's keys.
    assert any(a[:2] == ["autoscaling", "update-auto-scaling-group"] and group in a for a in box.argvs("aws"))
    asg = boto3.client("autoscaling", region_name="us-east-1", endpoint_url=moto_server)
    assert asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"][0]["DesiredCapacity"] == 0


def test_the_gate_admits_only_the_accounts_tokens_for_what_it_may_reach():
    gate = GcsTokens({"ya29.sa": SERVICE_ACCOUNT, "ya29.other": "other@home-proj.iam.gserviceaccount.com"},
                     service_account=SERVICE_ACCOUNT, bucket="home", prefixes=("runs/exp-7/", "code/trainer-1.tar.gz"))
    sa, other = {"Authorization": "Bearer ya29.sa"}, {"Authorization": "Bearer ya29.other"}
    admitted = [("GET", "/download/storage/v1/b/home/o/runs/exp-7/progress.json?alt=media", sa, b""),
                ("GET", "/storage/v1/b/home/o/code%2Ftrainer-1.tar.gz", sa, b""),
                ("GET", "/storage/v1/b/home/o?prefix=runs%2Fexp-7%2Fcheckpoints%2F&delimiter=%2F", sa, b""),
                ("POST", "/upload/storage/v1/b/home/o?uploadType=multipart", sa,
                 b'--b\r\ncontent-type: application/json\r\n\r\n{"name": "runs/exp-7/COMPLETE"}\r\n--b--'),
                ("POST", "/storage/v1/b/home/o/runs%2Fexp-7%2Fa/rewriteTo/b/home/o/runs%2Fexp-7%2Fb", sa, b"")]
    for method, path, headers, body in admitted:
        assert gate.refuse(method, path, headers, body) is None, path
    refused = [(401, "GET", "/storage/v1/b/home/o/runs%2Fexp-7%2Fprogress.json", {}, b""),
               (401, "GET", "/storage/v1/b/home/o/runs%2Fexp-7%2Fprogress.json", other, b""),
               (403, "GET", "/storage/v1/b/home/o/runs%2Fexp-8%2Fprogress.json", sa, b""),
               (403, "GET", "/storage/v1/b/home/o?prefix=runs%2F", sa, b""),
               (403, "GET", "/storage/v1/b/elsewhere/o/runs%2Fexp-7%2Fx", sa, b""),
               (403, "POST", "/storage/v1/b/home/o/runs%2Fexp-7%2Fall/compose", sa,
                b'{"sourceObjects": [{"name": "runs/exp-7/p1"}, {"name": "runs/exp-8/p2"}]}'),
               (403, "GET", "/storage/v1/b/home", sa, b"")]
    for status, method, path, headers, body in refused:
        answer = gate.refuse(method, path, headers, body)
        assert answer is not None and answer[0] == status, (path, answer)
        assert json.loads(answer[2])["error"]["code"] == status
    assert [ok for *_rest, ok in gate.decisions] == [True] * len(admitted) + [False] * len(refused)
