"""`lib.sh` `federation_token`: a GCE machine whose run folder is in S3 keeps its service account's Google
ID token in the file the `aws` CLI and boto3 read (AWS_WEB_IDENTITY_TOKEN_FILE), fresh while it lives.

It runs in bash as the boot runs it (`load_env` on a GCP machine's env file with the S3 store's keys),
against the sandbox's GCE metadata server. A fetch happens when the file is missing or TOKEN_REFRESH_S
old, is retried (3 tries, each bounded), replaces the file in one rename, keeps a token that still has
life when the server does not answer, and fails (1) only when there is none; on a machine whose store is
its own cloud's it asks nothing. The notice watcher renews it on its polls while the machine lives.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from components.userdata import USERDATA_DIR, aws_store_env, boot_env, gcs_store_env
from devtools.metadata import MetadataServer, token_claims
from tests.userdata.helpers import installed_scripts, shellcheck, wait_for

AUDIENCE = "trainstack/trainstack-places--exp-7-gpu-p1"
ROLE = "arn:aws:iam::123456789012:role/trainstack-federation-p1-role-0123456"


@pytest.fixture
def md():
    server = MetadataServer(service_account_id="104329573211187625437")
    yield server
    server.close()


def _env_file(root: Path, *, store: bool = True) -> Path:
    values = {"TRAINSTACK_CLOUD": "gcp", "TRAINSTACK_REGION": "us-central1", "TRAINSTACK_RUN_URI": "s3://b/runs/r",
              "TRAINSTACK_GROUP": "g", "TRAINSTACK_IMAGE": "tensorflow/tensorflow:2.21.0-gpu"}
    if store:
        values.update(aws_store_env(region="us-east-1", role_arn=ROLE, audience=AUDIENCE))
    path = root / "env"
    path.write_text("".join(f"{k}='{v}'\n" for k, v in values.items()))
    return path


def _run(root: Path, md: MetadataServer, script: str, *, store: bool = True, **env: str) -> subprocess.CompletedProcess:
    full = {"PATH": os.environ["PATH"], "TRAINSTACK_ROOT": str(root), "TRAINSTACK_ENV_FILE": str(_env_file(root, store=store)),
            "TRAINSTACK_METADATA_URL": md.url, "TRAINSTACK_RETRY_BASE_S": "0", **env}
    return subprocess.run(["bash", "-c", f'set -euo pipefail; . "{USERDATA_DIR / "lib.sh"}"; load_env; {script}'],
                          env=full, capture_output=True, text=True, timeout=60)


def _token_file(root: Path) -> Path:
    return root / "run/trainstack/federation/aws-token"


def test_the_token_is_fetched_for_the_audience_into_the_file_the_sdks_read(tmp_path, md):
    proc = _run(tmp_path, md, 'federation_token; printf "%s" "$AWS_WEB_IDENTITY_TOKEN_FILE"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == str(_token_file(tmp_path))
    claims = token_claims(_token_file(tmp_path).read_text())
    assert (claims["aud"], claims["sub"], claims["azp"]) == (AUDIENCE, md.service_account_id, md.service_account_id)
    assert md.identity_audiences == [AUDIENCE]
    assert _token_file(tmp_path).stat().st_mode & 0o777 == 0o600  # the machine's credential: root only
    # Only the GCE header's requests are answered: the fetch sent it.
    assert all(ok for method, path, ok in md.requests if "identity" in path)


def test_a_fresh_token_is_kept_and_an_old_one_renewed(tmp_path, md):
    assert _run(tmp_path, md, "federation_token; federation_token").returncode == 0
    assert len(md.identity_audiences) == 1  # the second call found it fresh
    first = _token_file(tmp_path).read_text()
    old = time.time() - 1801
    os.utime(_token_file(tmp_path), (old, old))
    assert _run(tmp_path, md, "federation_token").returncode == 0
    assert len(md.identity_audiences) == 2
    assert _token_file(tmp_path).stat().st_mtime > old + 1000
    assert token_claims(_token_file(tmp_path).read_text())["iat"] >= token_claims(first)["iat"]
    assert not list(_token_file(tmp_path).parent.glob("aws-token.*"))  # no temporary file left behind


def test_a_failing_metadata_server_is_retried(tmp_path, md):
    md.identity_failures = 2
    proc = _run(tmp_path, md, "federation_token")
    assert proc.returncode == 0, proc.stderr
    assert md.identity_failures == 0 and len(md.identity_audiences) == 1
    assert proc.stderr.count("attempt") == 2


def test_a_renewal_that_fails_keeps_a_token_with_life_left(tmp_path, md):
    assert _run(tmp_path, md, "federation_token").returncode == 0
    kept = _token_file(tmp_path).read_text()
    forty_minutes = time.time() - 2400
    os.utime(_token_file(tmp_path), (forty_minutes, forty_minutes))
    md.identity_failures = 10
    proc = _run(tmp_path, md, "federation_token")
    assert proc.returncode == 0, proc.stderr
    assert "could not renew the identity token" in proc.stderr
    assert _token_file(tmp_path).read_text() == kept
    assert md.identity_failures == 7  # three tries, then it stopped
    # The store calls of the next minute do not try again (each try costs up to 21 s); then one does.
    assert _run(tmp_path, md, "federation_token; federation_token").returncode == 0
    assert md.identity_failures == 7
    failed = _token_file(tmp_path).with_name("aws-token.failed")
    a_minute_ago = time.time() - 61
    os.utime(failed, (a_minute_ago, a_minute_ago))
    md.identity_failures = 0
    assert _run(tmp_path, md, "federation_token").returncode == 0
    assert len(md.identity_audiences) == 2 and not failed.exists()


def test_no_token_at_all_fails_the_store_call_within_its_bound(tmp_path, md):
    md.identity_failures = 100
    start = time.monotonic()
    proc = _run(tmp_path, md, 'aws() { echo "aws called" >&2; }; rc=0; store_cat "$RUN_URI/progress.json" || rc=$?; '
                'echo "rc=$rc"')
    assert "rc=1" in proc.stdout, proc.stderr
    assert "no identity token" in proc.stderr and "aws called" not in proc.stderr
    assert md.identity_failures == 97
    assert time.monotonic() - start < 50  # three tries of at most 5 s each, no pause (TRAINSTACK_RETRY_BASE_S=0)
    assert not _token_file(tmp_path).exists()


def test_a_machine_whose_store_is_its_own_clouds_asks_for_no_token(tmp_path, md):
    proc = _run(tmp_path, md, 'federation_token; printf "%s|%s" "${AWS_WEB_IDENTITY_TOKEN_FILE:-}" "$STORE_CLOUD"',
                store=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "|gcp"
    assert md.identity_audiences == [] and not _token_file(tmp_path).exists()


def test_a_store_on_the_other_cloud_needs_its_role_and_audience(tmp_path, md):
    env = _env_file(tmp_path)
    env.write_text("\n".join(line for line in env.read_text().splitlines() if not line.startswith("AWS_ROLE_ARN")))
    full = {"PATH": os.environ["PATH"], "TRAINSTACK_ROOT": str(tmp_path), "TRAINSTACK_ENV_FILE": str(env),
            "TRAINSTACK_METADATA_URL": md.url}
    proc = subprocess.run(["bash", "-c", f'. "{USERDATA_DIR / "lib.sh"}"; load_env'], env=full, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 1
    assert "AWS_ROLE_ARN is empty" in proc.stderr


def test_the_notice_watcher_renews_the_token_while_the_machine_lives(tmp_path, md):
    """With a renewal every second, the watcher's polls fetch a new token again and again."""
    env = {"PATH": os.environ["PATH"], "TRAINSTACK_ROOT": str(tmp_path), "TRAINSTACK_ENV_FILE": str(_env_file(tmp_path)),
           "TRAINSTACK_METADATA_URL": md.url, "TRAINSTACK_RETRY_BASE_S": "0", "TRAINSTACK_POLL_S": "0.2",
           "TRAINSTACK_TOKEN_REFRESH_S": "1"}
    watcher = subprocess.Popen([str(USERDATA_DIR / "watch-notice.sh")], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: len(md.identity_audiences) >= 3, 60, "three renewals by the watcher")
    finally:
        os.killpg(watcher.pid, 9)
        watcher.wait(timeout=10)
    assert set(md.identity_audiences) == {AUDIENCE}


def test_federation_sh_is_installed_on_machines_of_the_other_clouds_store_only(tmp_path):
    from components.userdata import render_user_data
    from devtools.sandbox import settings_for

    base = boot_env(settings_for("gcp"), run_uri="s3://b/runs/r", group="g", code_uri="", boot_uri="s3://b/code/boot-0123456789abcdef.tar.gz")
    across = {**base, **aws_store_env(region="us-east-1", role_arn=ROLE, audience=AUDIENCE)}
    paths = {name: [f["path"] for f in yaml.safe_load(render_user_data("gcp", env))["write_files"]]
             for name, env in (("own", base), ("across", across))}
    assert "/opt/trainstack/bin/federation-aws.sh" in paths["across"]
    assert [x for x in paths["across"] if x != "/opt/trainstack/bin/federation-aws.sh"] == paths["own"]
    # The scripts as installed (comments stripped) pass shellcheck, lib.sh following federation-aws.sh.
    installed_scripts(render_user_data("gcp", across), tmp_path)
    code, output = shellcheck(["lib.sh", "federation-aws.sh", "supervise.sh"], tmp_path)
    assert code == 0, output


def test_a_gcp_image_without_the_aws_cli_gets_it_from_snap(tmp_path, md):
    """The store's CLI as well as the machine's: `aws` is installed the way a missing cloud CLI always is."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text("#!/bin/sh\nexit 0\n")
    # snap records its arguments and "installs" the CLI it is asked for.
    (bin_dir / "snap").write_text(f'#!/bin/sh\necho "$*" >>"{tmp_path}/snap.log"\n'
                                  f'printf "#!/bin/sh\\n" >"{bin_dir}/aws"; chmod +x "{bin_dir}/aws"\n')
    for name in ("gcloud", "snap"):
        (bin_dir / name).chmod(0o755)
    tools = {name: subprocess.run(["bash", "-c", f"command -v {name}"], capture_output=True, text=True).stdout.strip()
             for name in ("bash", "curl", "date", "stat", "mkdir", "cat", "dirname", "mv", "rm", "chmod")}
    system = tmp_path / "system"
    system.mkdir()
    for name, path in tools.items():
        (system / name).symlink_to(path)
    proc = _run(tmp_path, md, "cloud_cli", PATH=f"{bin_dir}:{system}")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "snap.log").read_text().splitlines() == ["install aws-cli --classic"]
    assert "no aws on this image: installing aws-cli from snap" in proc.stderr
    # A machine whose store is its own cloud's needs no aws CLI: none is installed.
    (bin_dir / "aws").unlink()
    own = _run(tmp_path, md, "cloud_cli", store=False, PATH=f"{bin_dir}:{system}")
    assert own.returncode == 0 and (tmp_path / "snap.log").read_text().count("install") == 1


# ---- an AWS machine whose run folder is in GCS: google-auth's credential configuration, no token to keep

GCP_AUDIENCE = "//iam.googleapis.com/projects/418026337123/locations/global/workloadIdentityPools/ts/providers/aws-p1"
GCP_ACCOUNT = "trainstack-p1@home-proj.iam.gserviceaccount.com"


def _load_on_aws(root: Path, md: MetadataServer, script: str, **store: str) -> subprocess.CompletedProcess:
    values = {"TRAINSTACK_CLOUD": "aws", "TRAINSTACK_REGION": "us-east-1", "TRAINSTACK_RUN_URI": "gs://b/runs/r",
              "TRAINSTACK_GROUP": "g", "TRAINSTACK_IMAGE": "tensorflow/tensorflow:2.21.0-gpu",
              **gcs_store_env(audience=GCP_AUDIENCE, service_account=GCP_ACCOUNT), **store}
    path = root / "env"
    path.write_text("".join(f"{k}='{v}'\n" for k, v in values.items()))
    env = {"PATH": os.environ["PATH"], "TRAINSTACK_ROOT": str(root), "TRAINSTACK_ENV_FILE": str(path),
           "TRAINSTACK_METADATA_URL": md.url, "TRAINSTACK_RETRY_BASE_S": "0"}
    return subprocess.run(["bash", "-c", f'set -euo pipefail; . "{USERDATA_DIR / "lib.sh"}"; load_env; {script}'],
                          env=env, capture_output=True, text=True, timeout=60)


def _config(root: Path) -> Path:
    return root / "run/trainstack/federation/google-credentials.json"


def test_an_aws_machine_reaching_gcs_writes_googles_credential_configuration_once(tmp_path, md):
    show = ('printf "%s\\n" "$CLOUDSDK_AUTH_CREDENTIAL_FILE_OVERRIDE" "$GOOGLE_APPLICATION_CREDENTIALS" '
            '"${FEDERATION_CONTAINER_ARGS[@]}"; federation_token')
    proc = _load_on_aws(tmp_path, md, show)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        str(_config(tmp_path)), str(_config(tmp_path)),
        "-v", f"{tmp_path}/run/trainstack/federation:/run/trainstack/federation:ro",
        "-e", "GOOGLE_APPLICATION_CREDENTIALS=/run/trainstack/federation/google-credentials.json",
        "-e", "GOOGLE_CLOUD_PROJECT=418026337123"]
    imds = f"{md.url}/latest"
    assert json.loads(_config(tmp_path).read_text()) == {
        "type": "external_account", "audience": GCP_AUDIENCE,
        "subject_token_type": "urn:ietf:params:aws:token-type:aws4_request",
        "token_url": "https://sts.googleapis.com/v1/token",
        "service_account_impersonation_url":
            f"https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/{GCP_ACCOUNT}:generateAccessToken",
        "credential_source": {
            "environment_id": "aws1", "region_url": f"{imds}/meta-data/placement/availability-zone",
            "url": f"{imds}/meta-data/iam/security-credentials", "imdsv2_session_token_url": f"{imds}/api/token",
            "regional_cred_verification_url":
                "https://sts.{region}.amazonaws.com?Action=GetCallerIdentity&Version=2011-06-15"}}
    assert _config(tmp_path).stat().st_mode & 0o777 == 0o600 and _config(tmp_path).parent.stat().st_mode & 0o777 == 0o700
    # google-auth renews by itself: the boot asks the metadata server nothing for it.
    assert md.requests == []
    # Once per boot: a later load_env (every script runs one) keeps the file; the endpoints move only
    # by the variables a test sets.
    written = _config(tmp_path).stat().st_mtime_ns
    moved = _load_on_aws(tmp_path, md, "true")
    assert moved.returncode == 0 and _config(tmp_path).stat().st_mtime_ns == written
    _config(tmp_path).unlink()
    env_sts = subprocess.run(
        ["bash", "-c", f'. "{USERDATA_DIR / "lib.sh"}"; load_env; cat "$GOOGLE_APPLICATION_CREDENTIALS"'],
        env={"PATH": os.environ["PATH"], "TRAINSTACK_ROOT": str(tmp_path), "TRAINSTACK_ENV_FILE": str(tmp_path / "env"),
             "TRAINSTACK_METADATA_URL": md.url, "TRAINSTACK_GOOGLE_STS_URL": "http://127.0.0.1:9/v1/token",
             "TRAINSTACK_GOOGLE_IAM_CREDENTIALS_URL": "http://127.0.0.1:9/v1"}, capture_output=True, text=True, timeout=30)
    doc = json.loads(env_sts.stdout)
    assert doc["token_url"] == "http://127.0.0.1:9/v1/token"
    assert doc["service_account_impersonation_url"].startswith("http://127.0.0.1:9/v1/projects/-/serviceAccounts/")
    assert not list(_config(tmp_path).parent.glob("*.json.*"))  # no temporary file left behind


@pytest.mark.parametrize(("store", "said"), [
    ({"TRAINSTACK_GCP_AUDIENCE": ""}, "TRAINSTACK_GCP_AUDIENCE is empty"),
    ({"TRAINSTACK_GCP_SERVICE_ACCOUNT": ""}, "TRAINSTACK_GCP_SERVICE_ACCOUNT is empty"),
    ({"TRAINSTACK_GCP_AUDIENCE": "projects/418026337123/locations/global/workloadIdentityPools/ts/providers/aws-p1"},
     "TRAINSTACK_GCP_AUDIENCE is not a workload identity pool's provider: 'projects/418026337123/"),
    ({"TRAINSTACK_STORE_CLOUD": "azure"}, "TRAINSTACK_STORE_CLOUD azure: this machine has no federation-azure.sh"),
])
def test_an_aws_machine_reaching_gcs_refuses_what_cannot_reach_it(tmp_path, md, store, said):
    """Without its pool and account the machine cannot reach the run folder (so cannot mark it FAILED
    either): load_env stops every script with the reason in the journal, naming what is wrong."""
    proc = _load_on_aws(tmp_path, md, "echo loaded", **store)
    assert proc.returncode == 1 and "loaded" not in proc.stdout
    assert said in proc.stderr, proc.stderr
    assert not _config(tmp_path).exists()
