"""`ops preflight`, `ops move` and `ops status` on a GCP home with an AWS placement (stacks/Pulumi.gcp-aws.yaml).

Preflight reads the real stack file: home (GCP us-central1, project my-project-123) through the fake
GCP API of test_preflight.py, the AWS placement (us-east-1) through moto in-process. Move and status
use the stack's own `placements` output (`ops synth` of the real program), with the run folder in
home's GCS bucket (the emulator, behind the gate enforcing GCS's preconditions), home's managed
group on the fake Compute API (reached with the operator's application-default credentials, as
test_move.py does) and the AWS placement's Auto Scaling group on moto_server.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import boto3
import pytest
from google.oauth2 import credentials as google_oauth2

from controller import record as records
from controller.clouds import COMPUTE_ENDPOINT_ENV
from ops import hosts, preflight, status, synth
from ops.__main__ import main
from runfolder.storage import open_store
from tests.controller.helpers import make_group, moved_events, trained
from tests.ops.test_preflight import (  # noqa: F401 - `aws`: a fixture
    ENOUGH,
    GCP_OK,
    FakeGcp,
    FakeQuotas,
    Session,
    aws,
    default_vpc_as_on_aws,
)
from tests.ops.test_status import fake_pulumi

STACK = "gcp-aws"
STACK_FILE = synth.STACKS_DIR / f"Pulumi.{STACK}.yaml"
PROJECT, HOME_REGION, AWAY_REGION = "my-project-123", "us-central1", "us-east-1"


def _dlami_in(region: str) -> None:
    """The Deep Learning AMI in `region` too (the `aws` fixture adds it to its own region's EC2)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import amis, ec2_backends

    (dlami,) = [a for a in amis.AMIS if a["ami_id"] == "ami-0dlami00000000001"]
    backend = ec2_backends[DEFAULT_ACCOUNT_ID][region]
    backend.amis[dlami["ami_id"]] = amis.Ami(backend, **{**dlami, "owner_alias": "amazon"})


def _preflight(capsys, gcp: FakeGcp, quotas: FakeQuotas, asked: list[str]) -> tuple[int, list[str]]:
    class Regional(Session):
        def client(self, name: str, region_name: str | None = None):
            asked.append(f"{name} {region_name}")
            return super().client(name, region_name)

    args = argparse.Namespace(stack=STACK, stacks_dir=str(synth.STACKS_DIR))
    rc = preflight.cmd_preflight(args, aws_session=Regional(quotas), gcp_api=gcp)
    return rc, capsys.readouterr().out.splitlines()


def test_preflight_checks_home_in_its_project_and_the_aws_placement_in_its_region(aws, capsys):  # noqa: F811
    aws()
    _dlami_in(AWAY_REGION)
    default_vpc_as_on_aws(AWAY_REGION)
    gcp, quotas, asked = FakeGcp(**GCP_OK), FakeQuotas(ENOUGH), []

    rc, out = _preflight(capsys, gcp, quotas, asked)

    assert rc == 0, out
    assert out == [f"preflight {STACK}: ok (gcp, {HOME_REGION})"]
    # Home: every GCP check in its project and region. The placement: AWS's, in us-east-1, without the
    # bucket's (the run folder is home's GCS bucket).
    assert gcp.calls[:2] == [f"services {PROJECT}", f"region {PROJECT} {HOME_REGION}"]
    assert f"network {PROJECT} default" in gcp.calls and f"routes {PROJECT}" in gcp.calls
    assert f"ec2 {AWAY_REGION}" in asked and not [a for a in asked if a.split()[0] in ("s3", "sts")]
    assert quotas.asked == ["L-3819A6DF"]  # the G family's spot vCPUs: g5.xlarge and g6.xlarge


def test_preflight_names_the_aws_placement_for_its_problems_and_home_for_its_own(aws, capsys):  # noqa: F811
    aws()
    # us-east-1's default VPC as moto makes it (no internet gateway), no spot vCPUs and no AMI there;
    # no L4 quota at home.
    gcp = FakeGcp(**{**GCP_OK, "region": {}})
    rc, out = _preflight(capsys, gcp, FakeQuotas({**ENOUGH, "L-3819A6DF": 0}), [])

    assert rc == 1, out
    away = [line for line in out if line.startswith(f"placements[1] (aws {AWAY_REGION}): ")]
    assert any("route to the internet" in line for line in away), out
    assert any("L-3819A6DF" in line for line in away) and any("no AMI named" in line for line in away), out
    home = [line for line in out[:-1] if not line.startswith("placements[")]
    assert len(home) == 1 and home[0].startswith(f"GPU quota NVIDIA_L4_GPUS in {HOME_REGION} is 0"), out
    assert out[-1].startswith(f"preflight {STACK}: {len(out) - 1} problem(s)")


@pytest.fixture(scope="module")
def outputs() -> dict:
    """The gcp-aws stack's outputs, from `ops synth` of the real program."""
    return synth.synthesize(STACK_FILE).outputs


@pytest.mark.slow
def test_move_from_the_gcp_home_to_aws_then_status_reads_the_aws_group(outputs, gs_run_enforced, moto_server,
                                                                      tmp_path, capsys, monkeypatch):
    from tests.controller.federation import GoogleSide
    from tests.fixtures.emulators import AWS_VARS
    from tests.fixtures.gce_groups import GceGroups

    for k, v in {"AWS_ENDPOINT_URL": moto_server, **AWS_VARS}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    doc = json.loads(outputs["placements"])
    home, away = doc["placements"]
    assert (home["cloud"], home["region"], away["cloud"], away["region"]) == ("gcp", HOME_REGION, "aws", AWAY_REGION)
    doc["run_uri"] = gs_run_enforced.uri  # the stack's run, in the test's bucket
    make_group(AWAY_REGION, 0, name=away["group"])
    store = open_store(gs_run_enforced.uri)
    trained(store, step=1000, last_beat=time.time() - 5)  # preempted at home: its lease released

    google = GoogleSide(moto=moto_server)
    google.refresh_tokens.add("1//operator-refresh")
    gce = GceGroups(PROJECT, HOME_REGION)
    gce.add(home["group"], 1)
    gce.authorize = lambda _group, header: header.removeprefix("Bearer ") in google.operator_tokens
    adc = tmp_path / "application_default_credentials.json"
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "764086051850-x.apps.googleusercontent.com",
                               "client_secret": "d-FL95Q19q7MQmFpd7hHD0Ty", "refresh_token": "1//operator-refresh",
                               "universe_domain": "googleapis.com"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.setattr(google_oauth2, "_GOOGLE_OAUTH2_TOKEN_ENDPOINT", f"{google.url}/token")
    monkeypatch.setenv(COMPUTE_ENDPOINT_ENV, gce.url + "/")
    bin_dir = tmp_path / "bin"
    fake_pulumi(bin_dir, {**outputs, "runUri": gs_run_enforced.uri, "placements": json.dumps(doc)})
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    hosts._outputs_once.cache_clear()
    try:
        rc = main(["move", "--stack", STACK, "--to", f"aws:{AWAY_REGION}", "--reason", "no L4 at home"])
    finally:
        google.close()
        gce.close()

    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.strip() == (f"moved {gs_run_enforced.uri} from 0 (gcp {HOME_REGION}) to 1 (aws {AWAY_REGION}); "
                           "it resumes from step 1000")
    assert gce.sizes[home["group"]] == 0
    assert ("POST", f"/compute/v1/projects/{PROJECT}/regions/{HOME_REGION}/instanceGroupManagers/"
                    f"{home['group']}/resize") in gce.requests
    group = boto3.client("autoscaling", region_name=AWAY_REGION).describe_auto_scaling_groups(
        AutoScalingGroupNames=[away["group"]])["AutoScalingGroups"][0]
    assert group["DesiredCapacity"] == 1
    [event] = moved_events(store)
    assert (event["from_placement"], event["to_placement"], event["step"]) == (
        f"gcp {HOME_REGION}", f"aws {AWAY_REGION}", 1000)
    assert records.read(store)[0].active == 1

    # status: the run in home's bucket, the group read where the run is now (the AWS placement's).
    st = status.read_status(gs_run_enforced.uri)
    rows = dict(status.placement_lines(st.placement))
    assert rows["placement"].startswith(f"1 (aws {AWAY_REGION}) since ")
    assert f"gcp {HOME_REGION} -> aws {AWAY_REGION} at step 1000" in rows["moved"]
    assert main(["status", "--stack", STACK, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["machines_running"], shown["machines_desired"], shown["group_note"]) == (1, 1, ""), shown
    assert shown["placement"]["active"] == 1 and shown["step"] == 1000
