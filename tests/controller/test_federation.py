"""The controller reaching the other cloud's group by federation, on the stand-ins.

AWS home, a GCP placement: the function's own AWS identity (a role's session on moto_server)
signs GetCallerIdentity through google-auth; a fake Google STS checks that request and asks moto
whose it is, IAM Credentials lets that role impersonate one service account, and the fake Compute
API takes only that account's tokens (tests/controller/federation.py, tests/fixtures/gce_groups.py).

GCP home, an AWS placement: a fake metadata server gives the function a Google ID token for the
placement's audience, moto_server's STS exchanges it for the role (a gate in front checks what
AWS checks against the role's trust, which moto does not), and the group is sized as that role.

The run moves both ways across them, once even when two ticks run at once.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
import requests

from controller import record as records
from controller.clouds import AwsGroups, CloudError, Clouds, GcpGroups
from controller.config import Config, parse
from controller.decide import MOVE, STAY
from controller.tick import tick
from devtools.fault_proxy import FaultProxy
from devtools.servers import AWS_VARS
from runfolder.storage import open_store
from tests.controller.federation import GoogleSide, Pool, WebIdentityGate, claims
from tests.controller.helpers import make_group, moved_events, race, trained
from tests.fixtures.gce_groups import GceGroups
from tests.fixtures.no_capacity import NoCapacity, insufficient_capacity

pytestmark = pytest.mark.slow

ACCOUNT = "123456789012"  # moto's
PROJECT = "ts-proj"
AUDIENCE = f"//iam.googleapis.com/projects/{987654321}/locations/global/workloadIdentityPools/ts-pool/providers/ts-aws"
SERVICE_ACCOUNT = "ts-controller@ts-proj.iam.gserviceaccount.com"
CONTROLLER_ROLE = "ts-home-controller"
WEB_AUDIENCE = "trainstack-fed-test"
UNIQUE_ID = "104812345678901234567"
NO_CAPACITY = insufficient_capacity("g5.xlarge", "us-east-1a")


def _role(name: str, trust: dict) -> str:
    iam = boto3.client("iam", region_name="us-east-1")
    try:
        return iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    except iam.exceptions.EntityAlreadyExistsException:
        return iam.get_role(RoleName=name)["Role"]["Arn"]


def _gcp_groups(gce: GceGroups, google: GoogleSide, pauses: list[float] | None = None) -> GcpGroups:
    return GcpGroups(requests.Session(), api=gce.url, token_url=google.token_url,
                     iam_credentials=google.iam_credentials,
                     sleep=pauses.append if pauses is not None else (lambda s: None))


# -- AWS home, a GCP placement ---------------------------------------------------------------


@dataclass
class AwsHome:
    config: Config
    google: GoogleSide
    gce: GceGroups
    gate: NoCapacity
    store: object
    keys: dict[str, str]
    config_doc: dict


@pytest.fixture
def aws_home(s3_run, moto_server, monkeypatch) -> Iterator[AwsHome]:
    """An S3 run, its home group on moto (behind the no-capacity gate) and a GCP placement's group,
    with the function's identity a role session of moto's, in the variables Lambda sets."""
    arn = _role(CONTROLLER_ROLE, {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}, "Action": "sts:AssumeRole"}]})
    creds = boto3.client("sts", region_name="us-east-1").assume_role(
        RoleArn=arn, RoleSessionName="trainstack-home-ctl")["Credentials"]
    keys = {"AWS_ACCESS_KEY_ID": creds["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
            "AWS_SESSION_TOKEN": creds["SessionToken"], "AWS_REGION": "us-east-1"}
    google = GoogleSide(moto=moto_server, pool=Pool(AUDIENCE, ACCOUNT, CONTROLLER_ROLE, SERVICE_ACCOUNT))
    gce = GceGroups(PROJECT, "us-central1")
    gce.add("ts-gpu-p1", 0)
    gce.authorize = google.authorized(SERVICE_ACCOUNT)
    with FaultProxy(moto_server) as proxy:
        proxy.gate = gate = NoCapacity(moto_server)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        home = make_group("us-east-1", 1)
        for k, v in keys.items():
            monkeypatch.setenv(k, v)
        doc = {"run_uri": s3_run.uri, "nodes": 1, "wait_minutes": 15, "placements": [
            {"cloud": "aws", "region": "us-east-1", "project": None, "group": home},
            {"cloud": "gcp", "region": "us-central1", "project": PROJECT, "group": "ts-gpu-p1",
             "access": {"gcp_audience": AUDIENCE, "service_account": SERVICE_ACCOUNT}}]}
        try:
            yield AwsHome(parse(doc), google, gce, gate, open_store(s3_run.uri), keys, doc)
        finally:
            google.close()
            gce.close()


def _aws_size(p) -> int:
    return boto3.client("autoscaling", region_name=p.region).describe_auto_scaling_groups(
        AutoScalingGroupNames=[p.group])["AutoScalingGroups"][0]["DesiredCapacity"]


def test_an_aws_run_moves_to_its_gcp_placement_and_back(aws_home):
    h = aws_home
    home, gcp = h.config.placements
    now = time.time()
    trained(h.store, step=20, last_beat=now - 16 * 60)
    h.gate.cannot_launch(home.region, home.group, NO_CAPACITY, now=now)
    clouds = Clouds(aws=AwsGroups(), gcp=_gcp_groups(h.gce, h.google))

    there = tick(h.config, clouds, now)

    assert there.action == MOVE and (_aws_size(home), h.gce.sizes["ts-gpu-p1"]) == (0, 1)
    # Google saw the function's own signed GetCallerIdentity, for its region, as its role.
    [seen] = h.google.exchanges
    assert seen["subject_token_type"] == "urn:ietf:params:aws:token-type:aws4_request"
    assert (seen["region"], seen["host_region"], seen["key"]) == ("us-east-1", "us-east-1", h.keys["AWS_ACCESS_KEY_ID"])
    assert seen["target"] == AUDIENCE and seen["arn"].startswith(f"arn:aws:sts::{ACCOUNT}:assumed-role/{CONTROLLER_ROLE}/")
    assert h.google.impersonations == [(SERVICE_ACCOUNT, True)]
    assert ("POST", f"/compute/v1/projects/{PROJECT}/regions/us-central1/instanceGroupManagers/ts-gpu-p1/resize") \
        in h.gce.requests

    # GCE then stocks out: after the wait the run comes home (home failed 31 min ago: tried again).
    h.gce.stockout("ts-gpu-p1", "us-central1-a")
    h.gate.allow(home.region, home.group)
    later = now + 31 * 60
    back = tick(h.config, clouds, later)

    assert back.action == MOVE and "ZONE_RESOURCE_POOL_EXHAUSTED" in back.reason, back
    assert (_aws_size(home), h.gce.sizes["ts-gpu-p1"]) == (1, 0)
    assert [(e["from_placement"], e["to_placement"]) for e in moved_events(h.store)] == [
        ("aws us-east-1", "gcp us-central1"), ("gcp us-central1", "aws us-east-1")]
    assert len(h.google.exchanges) == 1  # the federated token was reused, not fetched per call


def test_two_aws_ticks_at_once_move_the_run_to_gcp_once(aws_home):
    h = aws_home
    home, _gcp = h.config.placements
    now = time.time()
    trained(h.store, step=20, last_beat=now - 16 * 60)
    h.gate.cannot_launch(home.region, home.group, NO_CAPACITY, now=now)

    meeting, results = race(h.config, Clouds(aws=AwsGroups(), gcp=_gcp_groups(h.gce, h.google)), h.store, now)

    assert meeting.refused == 1 and sorted(r.action for r in results) == [MOVE, STAY]
    assert (_aws_size(home), h.gce.sizes["ts-gpu-p1"]) == (0, 1)
    assert [r for r in h.gce.requests if r[1].endswith("/resize")] == [
        ("POST", f"/compute/v1/projects/{PROJECT}/regions/us-central1/instanceGroupManagers/ts-gpu-p1/resize")]
    assert len(moved_events(h.store)) == 1


def test_googles_blips_are_retried_and_its_refusal_names_the_placement(aws_home):
    h = aws_home
    gcp = h.config.placements[1]
    pauses: list[float] = []
    h.google.fail_next(2)  # STS answers 503 twice, then exchanges

    assert _gcp_groups(h.gce, h.google, pauses).desired(gcp) == 0
    assert pauses == [1.0, 2.0] and len(h.google.exchanges) == 1

    h.google.pool.role = "another-role"  # the provider's attribute condition no longer names this role
    pauses.clear()
    with pytest.raises(CloudError) as e:
        _gcp_groups(h.gce, h.google, pauses).desired(gcp)
    assert str(e.value).startswith("placement 1 (gcp us-central1): Google refused")
    assert "attribute condition" in str(e.value) and SERVICE_ACCOUNT in str(e.value)
    assert pauses == []  # a verdict, not retried

    # Google's STS out of reach: retried, then the group's call fails as any blip that lasts.
    closed = GcpGroups(requests.Session(), api=h.gce.url, token_url="http://127.0.0.1:9/v1/token",
                       iam_credentials=h.google.iam_credentials, sleep=pauses.append)
    with pytest.raises(CloudError, match=r"get of the group ts-gpu-p1 \(gcp us-central1\) failed: TransportError"):
        closed.desired(gcp)
    assert len(pauses) == 4

    pauses.clear()
    h.google.pool.role = CONTROLLER_ROLE
    h.google.pool.service_account = "someone-else@ts-proj.iam.gserviceaccount.com"
    with pytest.raises(CloudError, match=r"placement 1 \(gcp us-central1\): Google refused.*PERMISSION_DENIED"):
        _gcp_groups(h.gce, h.google, pauses).desired(gcp)
    assert pauses == []


def test_ops_move_reaches_the_other_cloud_as_the_operator_not_through_federation(aws_home):
    # The operator's own Google credentials (here a session holding their token), never the
    # function's federation, which trusts the function's role only.
    h = aws_home
    gcp = h.config.placements[1]
    h.gce.authorize = lambda _group, header: header == "Bearer operator-token"
    session = requests.Session()
    session.headers["Authorization"] = "Bearer operator-token"
    groups = GcpGroups(session, api=h.gce.url, token_url=h.google.token_url, iam_credentials=h.google.iam_credentials)

    Clouds(gcp=groups, federate=False).set_size(gcp, 1)

    assert h.gce.sizes["ts-gpu-p1"] == 1 and h.google.exchanges == []
    with pytest.raises(CloudError, match="refused"):  # the same groups, federating: Google refuses the operator
        h.google.pool.role = "not-the-operator"
        Clouds(gcp=groups).desired(gcp)


# -- GCP home, an AWS placement ---------------------------------------------------------------


@dataclass
class GcpHome:
    config: Config
    google: GoogleSide
    gce: GceGroups
    gate: WebIdentityGate
    capacity: NoCapacity
    store: object
    role: str
    proxy: FaultProxy


@pytest.fixture
def gcp_home(gs_run_enforced, moto_server, monkeypatch) -> Iterator[GcpHome]:
    """A GCS run, its home group on the fake Compute API and an AWS placement's group on moto,
    reached through a role trusting the function's Google identity."""
    from google.auth.compute_engine import _metadata

    google = GoogleSide(moto=moto_server, unique_id=UNIQUE_ID)
    monkeypatch.setenv("GCE_METADATA_HOST", google.host)
    monkeypatch.setattr(_metadata, "_GCE_METADATA_HOST", google.host)  # read once, when google-auth loads
    gce = GceGroups(PROJECT, "us-central1")
    gce.add("ts-gpu", 1)
    for k, v in {**AWS_VARS, "AWS_ENDPOINT_URL": moto_server}.items():  # the test's own set-up, as moto's admin
        monkeypatch.setenv(k, v)
    role = _role("ts-placement-controller", {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Federated": "accounts.google.com"},
        "Action": "sts:AssumeRoleWithWebIdentity",
        "Condition": {"StringEquals": {"accounts.google.com:aud": UNIQUE_ID, "accounts.google.com:sub": UNIQUE_ID,
                                       "accounts.google.com:oaud": WEB_AUDIENCE}}}]})
    with FaultProxy(moto_server) as proxy:
        capacity = NoCapacity(moto_server)
        proxy.gate = gate = WebIdentityGate(moto_server, audience=WEB_AUDIENCE, unique_id=UNIQUE_ID, inner=capacity)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        group = make_group("us-east-1", 0)
        # The function has no AWS credentials of its own.
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            monkeypatch.delenv(k, raising=False)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
        config = parse({"run_uri": gs_run_enforced.uri, "nodes": 1, "wait_minutes": 15, "placements": [
            {"cloud": "gcp", "region": "us-central1", "project": PROJECT, "group": "ts-gpu"},
            {"cloud": "aws", "region": "us-east-1", "project": None, "group": group,
             "access": {"aws_role_arn": role, "audience": WEB_AUDIENCE}}]})
        try:
            yield GcpHome(config, google, gce, gate, capacity, open_store(gs_run_enforced.uri), role, proxy)
        finally:
            google.close()
            gce.close()


def _admin_size(p) -> int:
    return boto3.client("autoscaling", region_name=p.region, aws_access_key_id=AWS_VARS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=AWS_VARS["AWS_SECRET_ACCESS_KEY"]).describe_auto_scaling_groups(
        AutoScalingGroupNames=[p.group])["AutoScalingGroups"][0]["DesiredCapacity"]


def test_a_gcs_run_moves_to_its_aws_placement_and_back(gcp_home):
    h = gcp_home
    home, aws = h.config.placements
    now = time.time()
    trained(h.store, step=30, last_beat=now - 16 * 60)
    h.gce.stockout("ts-gpu", "us-central1-a")
    clouds = Clouds(aws=AwsGroups(), gcp=GcpGroups(requests.Session(), api=h.gce.url, sleep=lambda s: None))

    there = tick(h.config, clouds, now + 1)

    assert there.action == MOVE and (h.gce.sizes["ts-gpu"], _admin_size(aws)) == (0, 1)
    # The function asked its metadata server for a token of the placement's audience, and
    # presented that very token to STS for the placement's role.
    [(audience, form, token)] = h.google.id_tokens
    assert (audience, form) == (WEB_AUDIENCE, "full") and claims(token)["aud"] == WEB_AUDIENCE
    assert h.gate.presented == [(h.role, token, True)]

    h.capacity.cannot_launch(aws.region, aws.group, NO_CAPACITY, now=now + 1)
    h.gce.stockouts.clear()
    back = tick(h.config, clouds, now + 32 * 60)

    assert back.action == MOVE and "capacity" in back.reason, back
    assert (h.gce.sizes["ts-gpu"], _admin_size(aws)) == (1, 0)
    assert [(e["from_placement"], e["to_placement"], e["step"]) for e in moved_events(h.store)] == [
        ("gcp us-central1", "aws us-east-1", 30), ("aws us-east-1", "gcp us-central1", 30)]
    assert len(h.gate.presented) == 1  # the role's credentials lasted: assumed once
    assert records.read(h.store)[0].active == 0


def test_two_gcp_ticks_at_once_move_the_run_to_aws_once(gcp_home):
    h = gcp_home
    _home, aws = h.config.placements
    now = time.time()
    trained(h.store, step=30, last_beat=now - 16 * 60)
    h.gce.stockout("ts-gpu", "us-central1-a")
    clouds = Clouds(aws=AwsGroups(), gcp=GcpGroups(requests.Session(), api=h.gce.url, sleep=lambda s: None))

    meeting, results = race(h.config, clouds, h.store, now + 1)

    assert meeting.refused == 1 and sorted(r.action for r in results) == [MOVE, STAY]
    assert (h.gce.sizes["ts-gpu"], _admin_size(aws)) == (0, 1)
    assert len(moved_events(h.store)) == 1


def test_a_blip_of_aws_sts_is_retried(gcp_home):
    h = gcp_home
    aws = h.config.placements[1]
    h.proxy.fail_next(2, "503")  # the first requests through: the role's AssumeRoleWithWebIdentity

    assert AwsGroups().desired(aws) == 0

    assert h.proxy.failed == 2 and [ok for _r, _t, ok in h.gate.presented] == [True]


def test_a_role_that_refuses_the_token_names_the_placement(gcp_home, monkeypatch):
    h = gcp_home
    aws = h.config.placements[1]
    h.gate.unique_id = "104800000000000000000"  # the role trusts another service account

    with pytest.raises(CloudError) as e:
        AwsGroups().desired(aws)

    assert str(e.value).startswith(f"placement 1 (aws us-east-1): AWS refused the role {h.role}")
    assert "AccessDenied" in str(e.value) and WEB_AUDIENCE in str(e.value)
    assert [ok for _r, _t, ok in h.gate.presented] == [False]


# -- the AWS function's package -----------------------------------------------------------------

# What Lambda's Python runtime brings besides the standard library: boto3 and its own dependencies.
LAMBDA_RUNTIME = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six")


def _fits_lambda(tag: str) -> bool:
    """A wheel tag Lambda's python3.12 on x86_64 (Amazon Linux 2023, glibc 2.34) loads."""
    python, abi, platform = tag.split("-")
    version = int(python.removeprefix("cp")[1:])
    glibc = re.fullmatch(r"manylinux_2_(\d+)_x86_64", platform)
    return (python.startswith("cp3") and (abi == "abi3" and version <= 12 or abi == python == "cp312")
            and (platform in ("manylinux2014_x86_64", "manylinux1_x86_64") or bool(glibc and int(glibc.group(1)) <= 34)))


def test_the_aws_package_reaches_a_gcp_placement_in_lambdas_runtime(aws_home, tmp_path):
    # The package as `pulumi up` ships it, run where only Lambda's runtime is importable (python -S:
    # no site-packages), reaches the GCP placement's group through the stand-ins with the
    # function's own AWS credentials. Its compiled wheels are Lambda's Python's (3.12); this
    # machine's Python is not, so cffi's backend for it is put beside the shipped one (the
    # interpreter loads the one of its own version), and the shipped wheels' tags are checked.
    import zipfile

    from components import placement
    from components.aws import controller
    from tests.components.test_placement_controller import _materialize

    h = aws_home
    task, runtime = tmp_path / "task", tmp_path / "runtime"
    task.mkdir()
    runtime.mkdir()
    _materialize(controller.function_code(federation=True), task)
    site = Path(boto3.__file__).parents[1]
    for name in LAMBDA_RUNTIME:
        found = [p for p in (site / name, site / f"{name}.py") if p.exists()]
        (runtime / found[0].name).symlink_to(found[0])
    shipped = sorted(p.name for p in task.glob("_cffi_backend*.so"))
    assert shipped == ["_cffi_backend.cpython-312-x86_64-linux-gnu.so"]
    for backend in site.glob("_cffi_backend.cpython-*.so"):
        shutil.copyfile(backend, task / backend.name)
    wheels = sorted(p for p in placement.WHEEL_CACHE.rglob("*.whl")
                    if p.name.split("-")[0] in {n.replace("-", "_") for n in placement.LAMBDA_WHEELS})
    assert {w.name.split("-")[0] for w in wheels} == {"cryptography", "cffi"}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))
            tags = [line.split(": ", 1)[1] for line in z.read(meta).decode().splitlines() if line.startswith("Tag: ")]
        assert tags and any(_fits_lambda(t) for t in tags), (wheel.name, tags)
    gcp = h.config.placements[1]
    code = f"""
import sys; sys.path[:0] = ['.', {str(runtime)!r}]
import json
from controller.clouds import GcpGroups
from controller.config import parse
config = parse({json.dumps(h.config_doc)!r})
groups = GcpGroups(api={h.gce.url!r}, token_url={h.google.token_url!r}, iam_credentials={h.google.iam_credentials!r})
groups.set_size(config.placements[1], 1)
import google.auth, requests, cryptography
print(json.dumps({{"size": groups.desired(config.placements[1]),
                  "from": sorted({{m.__file__.split("/task/")[1].split("/")[0] for m in (google.auth, requests, cryptography)}})}}))
"""
    env = {"PATH": "/usr/bin:/bin", **h.keys}
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=task, env=env, capture_output=True, text=True,
                          timeout=120)

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"size": 1, "from": ["cryptography", "google", "requests"]}
    assert h.gce.sizes[gcp.group] == 1 and h.google.impersonations == [(SERVICE_ACCOUNT, True)]
