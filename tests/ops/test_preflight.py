"""`python -m ops preflight`: AWS checks against moto (EC2 offerings, instance types, images, S3, STS), with
a fake for Service Quotas (moto 5.2.5 serves only VPC quotas); GCP checks against a fake API.

moto's EC2 data is a snapshot: in eu-west-1 it offers g5.xlarge and g4dn.xlarge in every
zone but not g6.xlarge, and it has no "Deep Learning Base OSS" AMI unless a test adds one.
"""

from __future__ import annotations

import argparse
import copy
import datetime
from pathlib import Path

import boto3
import botocore.exceptions
import pytest
import yaml
from moto import mock_aws

from components import settings as config
from components.aws.naming import DLAMI_NAME
from components.gcp.naming import PREREQUISITE_APIS
from ops import __main__ as ops_main
from ops import preflight

REGION = "eu-west-1"
AWS = {
    "cloud": "aws",
    "region": REGION,
    "run": {"id": "exp-7", "synthetic": True, "steps": 100},
    "compute": {"instanceTypes": ["g5.xlarge", "g4dn.xlarge"], "maxRuntimeHours": 6},
}
GCP = {
    "cloud": "gcp",
    "region": "us-central1",
    "project": "my-project",
    "run": {"id": "exp-7", "synthetic": True, "steps": 100},
    "compute": {"instanceTypes": ["g2-standard-4"], "zones": ["us-central1-a"], "maxRuntimeHours": 6},
}


def settings_of(base: dict, **blocks: dict) -> config.Settings:
    raw = copy.deepcopy(base)
    for key, value in blocks.items():
        raw.setdefault(key, {}).update(value)
    return config.load_settings(raw, stack="unit")


class FakeQuotas:
    """Service Quotas for EC2: `applied` values by code; a code without one answers NoSuchResource, like AWS."""

    def __init__(self, applied: dict[str, float], defaults: dict[str, float] | None = None) -> None:
        self.applied, self.defaults = applied, defaults or {}
        self.asked: list[str] = []

    @staticmethod
    def _missing(op: str) -> botocore.exceptions.ClientError:
        return botocore.exceptions.ClientError(
            {"Error": {"Code": "NoSuchResourceException", "Message": "no such quota"}}, op)

    def get_service_quota(self, ServiceCode: str, QuotaCode: str) -> dict:  # noqa: N803 - boto3's names
        assert ServiceCode == "ec2"
        self.asked.append(QuotaCode)
        if QuotaCode not in self.applied:
            raise self._missing("GetServiceQuota")
        return {"Quota": {"QuotaCode": QuotaCode, "Value": self.applied[QuotaCode]}}

    def get_aws_default_service_quota(self, ServiceCode: str, QuotaCode: str) -> dict:  # noqa: N803
        if QuotaCode not in self.defaults:
            raise self._missing("GetAWSDefaultServiceQuota")
        return {"Quota": {"QuotaCode": QuotaCode, "Value": self.defaults[QuotaCode]}}


class Session:
    """boto3 clients from moto, except Service Quotas (a fake)."""

    def __init__(self, quotas: FakeQuotas) -> None:
        self.quotas = quotas

    def client(self, name: str, region_name: str | None = None):
        if name == "service-quotas":
            return self.quotas
        return boto3.client(name, region_name=region_name)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch):
    """moto in-process (fake credentials); yields a function that adds the Deep Learning AMI."""
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    from moto.ec2.models import amis

    def add_dlami() -> None:
        dlami = {
            "ami_id": "ami-0dlami00000000001", "name": DLAMI_NAME.replace("*", " 20261101"),
            "description": "DLAMI", "owner_id": "898082745236", "public": True, "virtualization_type": "hvm",
            "architecture": "x86_64", "state": "available", "platform": None, "root_device_type": "ebs",
            "root_device_name": "/dev/sda1", "sriov": "simple",
            "creation_date": datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC),
        }
        monkeypatch.setattr(amis, "AMIS", [*amis.AMIS, dlami])
        # The region's EC2 already loaded its images (the default VPC below): add it there too.
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends

        backend = ec2_backends[DEFAULT_ACCOUNT_ID][REGION]
        backend.amis[dlami["ami_id"]] = amis.Ami(backend, **{**dlami, "owner_alias": "amazon"})

    with mock_aws():
        default_vpc_as_on_aws(REGION)
        yield add_dlami


def default_vpc_as_on_aws(region: str) -> None:
    """The default VPC's way out as AWS makes it (an internet gateway, the main route table's
    0.0.0.0/0 route to it, public IPs from its subnets): moto's default VPC has no gateway."""
    ec2 = boto3.client("ec2", region_name=region)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
    (main,) = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                                {"Name": "association.main", "Values": ["true"]}])["RouteTables"]
    ec2.create_route(RouteTableId=main["RouteTableId"], DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)


ENOUGH = {"L-3819A6DF": 64, "L-DB2E81BA": 64, "L-7212CCBC": 512, "L-417A185B": 512}


def test_a_launchable_stack_is_clean(aws) -> None:
    aws()
    s = settings_of(AWS)
    quotas = FakeQuotas(ENOUGH)
    assert preflight.check(s, aws_session=Session(quotas)) == []
    assert quotas.asked == ["L-3819A6DF"]  # the spot quota of the G family: the check ran


@pytest.mark.parametrize(
    ("compute", "code", "need"),
    [
        ({}, "L-3819A6DF", 4),  # g5.xlarge: 4 vCPUs, spot
        ({"nodes": 2, "instanceTypes": ["g5.xlarge"]}, "L-3819A6DF", 8),
        ({"spot": False}, "L-DB2E81BA", 4),  # on-demand draws on another quota
        ({"instanceTypes": ["g5.2xlarge", "g4dn.xlarge"]}, "L-3819A6DF", 8),  # the largest type counts
        ({"instanceTypes": ["p5.48xlarge"], "gpusPerNode": 8}, "L-7212CCBC", 192),
    ],
)
def test_a_quota_below_the_need_is_one_line_with_the_request_command(aws, compute, code, need) -> None:
    aws()
    s = settings_of(AWS, compute=compute)
    problems = preflight.aws_quota_problems(s, boto3.client("ec2", region_name=REGION), FakeQuotas({code: need - 1}))
    assert len(problems) == 1
    line = problems[0].line()
    assert code in line and f"needs {need}" in line and f"--desired-value {need}" in line and "\n" not in line
    assert preflight.aws_quota_problems(s, boto3.client("ec2", region_name=REGION), FakeQuotas({code: need})) == []


def test_an_account_that_never_changed_a_quota_gets_the_default(aws) -> None:
    s = settings_of(AWS)
    ec2 = boto3.client("ec2", region_name=REGION)
    assert preflight.aws_quota_problems(s, ec2, FakeQuotas({}, defaults={"L-3819A6DF": 0}))[0].what.startswith(
        "EC2 quota 'All G and VT Spot Instance Requests' (L-3819A6DF) in eu-west-1 is 0 vCPUs")
    unreadable = preflight.aws_quota_problems(s, ec2, FakeQuotas({}))
    assert "could not read" in unreadable[0].what


def test_types_not_offered_in_the_zones_are_named(aws) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    s = settings_of(AWS, compute={"instanceTypes": ["g5.xlarge", "g6.xlarge"]})
    problems = preflight.aws_offering_problems(s, ec2)
    assert [p.what for p in problems] == [
        "g6.xlarge is not offered in zones eu-west-1a, eu-west-1b, eu-west-1c of eu-west-1"]
    only = settings_of(AWS, compute={"instanceTypes": ["g6.xlarge"], "nodes": 2})
    (problem,) = preflight.aws_offering_problems(only, ec2)
    assert problem.what.startswith("compute.instanceTypes ['g6.xlarge']: no zone of the group's subnets "
                                   "(eu-west-1a, eu-west-1b, eu-west-1c) offers any of them")
    assert preflight.aws_offering_problems(settings_of(AWS, compute={"zones": ["eu-west-1b"]}), ec2) == []


def test_the_image_is_resolved_in_the_region(aws) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    (missing,) = preflight.aws_image_problems(settings_of(AWS), ec2)
    assert DLAMI_NAME in missing.what and "compute.imageId" in missing.fix
    some = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    assert preflight.aws_image_problems(settings_of(AWS, compute={"imageId": some}), ec2) == []
    (bad,) = preflight.aws_image_problems(settings_of(AWS, compute={"imageId": "ami-00000000000000000"}), ec2)
    assert "ami-00000000000000000" in bad.what and "copy-image" in bad.fix


def test_the_deep_learning_ami_found_by_the_groups_own_name_filter(aws) -> None:
    aws()
    assert preflight.aws_image_problems(settings_of(AWS), boto3.client("ec2", region_name=REGION)) == []


@pytest.mark.parametrize(
    ("exists", "adopt", "expected"),
    [(False, False, None), (True, False, "storage.adopt: true"), (True, True, None), (False, True, "storage.adopt: false")],
)
def test_the_bucket_is_free_or_adopted(aws, exists: bool, adopt: bool, expected: str | None) -> None:
    s = settings_of(AWS, storage={"adopt": adopt})
    s3, sts = boto3.client("s3", region_name=REGION), boto3.client("sts", region_name=REGION)
    name = preflight.aws_bucket_name(s, sts)
    assert name.startswith("trainstack-unit-")  # the stack's own generated name
    if exists:
        s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
    problems = preflight.aws_bucket_problems(s, s3, sts)
    assert len(problems) == (expected is not None)
    assert all(expected in p.fix for p in problems)


def test_a_bucket_of_another_account_needs_another_name(aws) -> None:
    class Taken:
        def head_bucket(self, Bucket: str) -> None:  # noqa: N803
            raise botocore.exceptions.ClientError({"Error": {"Code": "403", "Message": "Forbidden"}}, "HeadBucket")

    s = settings_of(AWS, storage={"bucketName": "somebody-elses"})
    (p,) = preflight.aws_bucket_problems(s, Taken(), None)
    assert "another account" in p.what and "storage.bucketName" in p.fix


class FakeGcp:
    """The GCP reads preflight makes, answered from dicts."""

    def __init__(self, region: dict[str, tuple[float, float]], project: dict[str, tuple[float, float]],
                 services: set[str]) -> None:
        self.region, self.project, self.services = region, project, services
        self.calls: list[str] = []

    def region_quotas(self, project: str, region: str) -> dict[str, tuple[float, float]]:
        self.calls.append(f"region {project} {region}")
        return self.region

    def project_quotas(self, project: str) -> dict[str, tuple[float, float]]:
        self.calls.append(f"project {project}")
        return self.project

    def enabled_services(self, project: str) -> set[str]:
        self.calls.append(f"services {project}")
        return self.services

    # What each zone offers (everything unless a test says otherwise).
    not_offered: set[tuple[str, str]] = set()

    def region_zones(self, project: str, region: str) -> list[str]:
        self.calls.append(f"zones {project} {region}")
        return [f"{region}-a", f"{region}-b"]

    def offered(self, project: str, zone: str, kind: str, name: str) -> bool:
        return (zone, name) not in self.not_offered

    # The `default` network as a new project has it (auto mode: a subnet in every region, the route out).
    networks: dict[str, dict] = {"default": {"name": "default", "autoCreateSubnetworks": True, "subnetworks": [
        f"https://www.googleapis.com/compute/v1/projects/p/regions/{r}/subnetworks/default"
        for r in ("us-central1", "europe-west4", "us-east4")]}}
    route_list: list[dict] = [{"name": "default-route-1", "network": ".../global/networks/default",
                               "destRange": "0.0.0.0/0", "priority": 1000,
                               "nextHopGateway": ".../global/gateways/default-internet-gateway"}]

    def network(self, project: str, name: str) -> dict | None:
        self.calls.append(f"network {project} {name}")
        return self.networks.get(name)

    def routes(self, project: str) -> list[dict]:
        self.calls.append(f"routes {project}")
        return self.route_list


GCP_OK = dict(region={"PREEMPTIBLE_NVIDIA_L4_GPUS": (4, 0), "NVIDIA_L4_GPUS": (4, 0)}, project={"GPUS_ALL_REGIONS": (4, 0)},
              services=set(PREREQUISITE_APIS) | {"compute.googleapis.com"})


def test_gcp_clean() -> None:
    api = FakeGcp(**GCP_OK)
    assert preflight.check(settings_of(GCP), gcp_api=api) == []
    assert api.calls == ["services my-project", "region my-project us-central1", "project my-project",
                         "network my-project default", "routes my-project"]


def test_gcp_problems_each_with_its_fix() -> None:
    api = FakeGcp(region={"NVIDIA_L4_GPUS": (8, 0)}, project={"GPUS_ALL_REGIONS": (0, 0)},
                  services={"compute.googleapis.com"})
    lines = [p.line() for p in preflight.check(settings_of(GCP, compute={"nodes": 2}), gcp_api=api)]
    assert len(lines) == 2
    assert "gcloud services enable cloudresourcemanager.googleapis.com serviceusage.googleapis.com" in lines[0]
    # No preemptible quota granted: the Spot VMs use the standard NVIDIA_L4_GPUS (8), which is enough.
    assert "GPUS_ALL_REGIONS" in lines[1]
    on_demand = settings_of(GCP, compute={"spot": False, "nodes": 2})
    assert preflight.gcp_quota_problems(on_demand, api)[0].what.startswith("GPU quota GPUS_ALL_REGIONS")


@pytest.mark.parametrize(
    ("region", "spot", "metric", "problem"),
    [
        # No preemptible quota granted: Spot VMs fall back to the standard quota.
        ({"NVIDIA_L4_GPUS": (2, 0)}, True, "NVIDIA_L4_GPUS", None),
        ({"NVIDIA_L4_GPUS": (1, 0)}, True, "NVIDIA_L4_GPUS",
         "GPU quota NVIDIA_L4_GPUS in us-central1 is 1 (Spot VMs use it while PREEMPTIBLE_NVIDIA_L4_GPUS is 0); "
         "the stack needs 2"),
        ({"PREEMPTIBLE_NVIDIA_L4_GPUS": (0, 0), "NVIDIA_L4_GPUS": (4, 0)}, True, "NVIDIA_L4_GPUS", None),
        # A granted preemptible quota is the one Spot VMs draw on, even with a larger standard one.
        ({"PREEMPTIBLE_NVIDIA_L4_GPUS": (1, 0), "NVIDIA_L4_GPUS": (8, 0)}, True, "PREEMPTIBLE_NVIDIA_L4_GPUS",
         "GPU quota PREEMPTIBLE_NVIDIA_L4_GPUS in us-central1 is 1; the stack needs 2"),
        ({"PREEMPTIBLE_NVIDIA_L4_GPUS": (8, 0), "NVIDIA_L4_GPUS": (1, 0)}, False, "NVIDIA_L4_GPUS",
         "GPU quota NVIDIA_L4_GPUS in us-central1 is 1; the stack needs 2"),
    ],
)
def test_spot_vms_use_the_standard_gpu_quota_when_no_preemptible_one_is_granted(region, spot, metric, problem) -> None:
    api = FakeGcp(region=region, project={"GPUS_ALL_REGIONS": (8, 0)}, services=set(PREREQUISITE_APIS))
    problems = preflight.gcp_quota_problems(settings_of(GCP, compute={"nodes": 2, "spot": spot}), api)
    assert api.calls == ["region my-project us-central1", "project my-project"]  # the check ran
    assert [p.what.split(" (1 per node")[0] for p in problems] == ([problem] if problem else [])
    assert preflight.gcp_gpu_quota("NVIDIA_L4_GPUS", region, spot=spot) == metric


@pytest.mark.parametrize(
    ("machine", "accelerator", "metric"),
    [("g2-standard-8", None, "NVIDIA_L4_GPUS"), ("a2-highgpu-1g", None, "NVIDIA_A100_GPUS"),
     ("a2-ultragpu-8g", None, "NVIDIA_A100_80GB_GPUS"), ("a3-highgpu-8g", None, "NVIDIA_H100_GPUS"),
     ("n1-standard-8", "nvidia-tesla-t4", "NVIDIA_T4_GPUS")],
)
def test_gcp_gpu_metrics(machine: str, accelerator: str | None, metric: str) -> None:
    assert preflight.gcp_gpu_metric(machine, accelerator) == metric


def test_a_check_that_cannot_run_is_a_problem_not_a_crash() -> None:
    class Broken(FakeGcp):
        def enabled_services(self, project: str) -> set[str]:
            raise RuntimeError("GET https://serviceusage.googleapis.com/...: HTTP 403 PERMISSION_DENIED")

    problems = preflight.check(settings_of(GCP), gcp_api=Broken(**GCP_OK))
    assert [p.what for p in problems] == [
        "could not check APIs: RuntimeError: GET https://serviceusage.googleapis.com/...: HTTP 403 PERMISSION_DENIED"]


def write_stack(tmp_path: Path, raw: dict) -> Path:
    doc = {"config": {f"trainstack:{k}": v for k, v in raw.items()}}
    (tmp_path / "Pulumi.unit.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An environment where neither boto3 nor google-auth finds any credentials (and asks no metadata server)."""
    import os

    for k in list(os.environ):
        if k.startswith(("AWS_", "GOOGLE_", "CLOUDSDK_", "GCE_")):
            monkeypatch.delenv(k)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(home / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")


@pytest.mark.parametrize(("raw", "line"), [
    (AWS, "ops preflight: no AWS credentials found (environment variables, AWS_PROFILE, ~/.aws/credentials and "
          "~/.aws/config, an instance or container role); run `aws configure` or `aws sso login` (or set "
          "AWS_PROFILE), then run preflight again"),
    (GCP, "ops preflight: no Google Cloud credentials found (Application Default Credentials: "
          "GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default login, the metadata server); run `gcloud "
          "auth application-default login`, then run preflight again"),
    ({**AWS, "scheduler": "sagemaker", "image": {"build": True}, "compute": {"instanceTypes": ["g5.xlarge"]}},
     "ops preflight: no AWS credentials found (environment variables, AWS_PROFILE, ~/.aws/credentials and "
     "~/.aws/config, an instance or container role); run `aws configure` or `aws sso login` (or set "
     "AWS_PROFILE), then run preflight again"),
    ({**GCP, "scheduler": "vertex", "image": {"build": True}, "compute": {"instanceTypes": ["g2-standard-4"]}},
     "ops preflight: no Google Cloud credentials found (Application Default Credentials: "
     "GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default login, the metadata server); run `gcloud "
     "auth application-default login`, then run preflight again"),
], ids=["aws", "gcp", "sagemaker", "vertex"])
def test_no_credentials_is_one_line_and_exit_2(no_credentials, tmp_path: Path, capsys, raw, line) -> None:
    write_stack(tmp_path, raw)
    assert ops_main.main(["preflight", "--stack", "unit", "--stacks-dir", str(tmp_path)]) == 2
    assert capsys.readouterr() == ("", line + "\n")


def test_credentials_that_cannot_be_loaded_are_one_line_and_exit_2(no_credentials, monkeypatch, tmp_path: Path,
                                                                    capsys) -> None:
    config = tmp_path / "home" / "aws-config"
    config.write_text("[profile broken]\ncredential_process = /bin/false\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "broken")
    write_stack(tmp_path, AWS)
    assert ops_main.main(["preflight", "--stack", "unit", "--stacks-dir", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith("ops preflight: no AWS credentials found (CredentialRetrievalError: ")
    assert err.endswith("; run `aws sso login` or `aws configure` for this profile (AWS_PROFILE), then run "
                        "preflight again\n")


def test_a_key_file_that_is_not_there_is_one_line_and_exit_2(no_credentials, monkeypatch, tmp_path: Path,
                                                              capsys) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "gone.json"))
    write_stack(tmp_path, GCP)
    assert ops_main.main(["preflight", "--stack", "unit", "--stacks-dir", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"ops preflight: no Google Cloud credentials found (GOOGLE_APPLICATION_CREDENTIALS={tmp_path / 'gone.json'}: "
        f"File {tmp_path / 'gone.json'} was not found.); point it at a key file, or unset it and run `gcloud auth "
        "application-default login`, then run preflight again\n")


def test_a_profile_that_is_not_there_is_one_line_and_exit_2(no_credentials, monkeypatch, tmp_path: Path,
                                                             capsys) -> None:
    monkeypatch.setenv("AWS_PROFILE", "gone")
    write_stack(tmp_path, AWS)
    assert ops_main.main(["preflight", "--stack", "unit", "--stacks-dir", str(tmp_path)]) == 2
    assert capsys.readouterr() == ("", "ops preflight: no AWS credentials found (The config profile (gone) could not "
                                       "be found); name a profile of ~/.aws/config in AWS_PROFILE, or unset it, then "
                                       "run preflight again\n")


def test_cli_exit_codes(aws, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    aws()
    args = argparse.Namespace(stack="unit", stacks_dir=str(write_stack(tmp_path, AWS)))
    assert preflight.cmd_preflight(args, aws_session=Session(FakeQuotas(ENOUGH))) == 0
    assert capsys.readouterr().out == "preflight unit: ok (aws, eu-west-1)\n"

    assert preflight.cmd_preflight(args, aws_session=Session(FakeQuotas({"L-3819A6DF": 0}))) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "L-3819A6DF" in out[0] and "; fix: " in out[0]

    bad = copy.deepcopy(AWS)
    bad["compute"]["instanceTypes"] = ["g5.xlarg"]
    write_stack(tmp_path, bad)
    assert ops_main.main(["preflight", "--stack", "unit", "--stacks-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "instanceTypes" in err and "\n" not in err
    assert ops_main.main(["preflight", "--stack", "nope", "--stacks-dir", str(tmp_path)]) == 2


def test_gcp_gpus_in_use_count_against_the_quota() -> None:
    api = FakeGcp(region={"PREEMPTIBLE_NVIDIA_L4_GPUS": (4, 3)}, project={"GPUS_ALL_REGIONS": (8, 3)},
                  services=set(PREREQUISITE_APIS))
    (p,) = preflight.gcp_quota_problems(settings_of(GCP, compute={"nodes": 2}), api)
    assert p.what.startswith("GPU quota PREEMPTIBLE_NVIDIA_L4_GPUS in us-central1 is 4 with 3 in use; the stack needs 2")
    assert p.fix.startswith("request 5 ")


class FakeResponse:
    def __init__(self, status: int, doc: dict) -> None:
        self.status_code, self._doc, self.text = status, doc, str(doc)

    def json(self) -> dict:
        return self._doc


class FakeSession:
    """Answers GETs from a table of URL -> pages, as google-auth's AuthorizedSession would."""

    def __init__(self, pages: dict[str, list[FakeResponse]]) -> None:
        self.pages, self.asked = pages, []

    def get(self, url: str, params: dict | None = None, timeout: float = 0) -> FakeResponse:
        self.asked.append((url, dict(params or {})))
        return self.pages[url].pop(0)


def test_the_rest_client_reads_the_documented_shapes() -> None:
    compute = "https://compute.googleapis.com/compute/v1/projects/p"
    usage = "https://serviceusage.googleapis.com/v1/projects/p/services"
    session = FakeSession({
        f"{compute}/regions/us-central1": [FakeResponse(200, {"quotas": [
            {"metric": "PREEMPTIBLE_NVIDIA_L4_GPUS", "limit": 16.0, "usage": 2.0}, {"metric": "CPUS", "limit": 24.0}]})],
        compute: [FakeResponse(200, {"quotas": [{"metric": "GPUS_ALL_REGIONS", "limit": 0.0, "usage": 0.0}]})],
        usage: [FakeResponse(200, {"services": [{"name": "projects/1/services/compute.googleapis.com",
                                                 "config": {"name": "compute.googleapis.com"}, "state": "ENABLED"}],
                                   "nextPageToken": "t2"}),
                FakeResponse(200, {"services": [{"name": "projects/1/services/serviceusage.googleapis.com",
                                                 "config": {"name": "serviceusage.googleapis.com"}}]})],
    })
    api = preflight.RestGcpApi(session)
    assert api.region_quotas("p", "us-central1") == {"PREEMPTIBLE_NVIDIA_L4_GPUS": (16.0, 2.0), "CPUS": (24.0, 0.0)}
    assert api.project_quotas("p") == {"GPUS_ALL_REGIONS": (0.0, 0.0)}
    assert api.enabled_services("p") == {"compute.googleapis.com", "serviceusage.googleapis.com"}
    assert session.asked[-1] == (usage, {"filter": "state:ENABLED", "pageSize": 200, "pageToken": "t2"})
    zones = preflight.RestGcpApi(FakeSession({
        f"{compute}/regions/us-central1": [FakeResponse(200, {"zones": [
            "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-b",
            "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a"]})],
        f"{compute}/zones/us-central1-a/machineTypes/g2-standard-4": [FakeResponse(200, {"name": "g2-standard-4"})],
        f"{compute}/zones/us-central1-b/machineTypes/g2-standard-4": [FakeResponse(404, {"error": "notFound"})],
    }))
    assert zones.region_zones("p", "us-central1") == ["us-central1-a", "us-central1-b"]
    assert zones.offered("p", "us-central1-a", "machineTypes", "g2-standard-4") is True
    assert zones.offered("p", "us-central1-b", "machineTypes", "g2-standard-4") is False
    routes = f"{compute}/global/routes"
    nets = FakeSession({
        f"{compute}/global/networks/default": [FakeResponse(200, {"name": "default", "subnetworks": []})],
        f"{compute}/global/networks/other": [FakeResponse(404, {"error": {"code": 404}})],
        routes: [FakeResponse(200, {"items": [{"name": "r1"}], "nextPageToken": "n2"}),
                 FakeResponse(200, {"items": [{"name": "r2"}]})],
    })
    api = preflight.RestGcpApi(nets)
    assert api.network("p", "default") == {"name": "default", "subnetworks": []}
    assert api.network("p", "other") is None
    assert [r["name"] for r in api.routes("p")] == ["r1", "r2"]
    assert nets.asked[-1] == (routes, {"maxResults": 500, "pageToken": "n2"})
    denied = preflight.RestGcpApi(FakeSession({compute: [FakeResponse(403, {"error": "PERMISSION_DENIED"})]}))
    with pytest.raises(RuntimeError, match="HTTP 403"):
        denied.project_quotas("p")


def test_the_group_s_subnets_decide_its_zones(aws) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    subnet = next(s for s in ec2.describe_subnets()["Subnets"] if s["AvailabilityZone"] == "eu-west-1b")
    s = settings_of(AWS, compute={"subnets": [subnet["SubnetId"]]})
    assert preflight.aws_zones(s, ec2) == ["eu-west-1b"]
    # Several machines: the same zone, chosen by the program's own choose_zone.
    several = settings_of(AWS, compute={"subnets": [subnet["SubnetId"]], "nodes": 2, "instanceTypes": ["g5.xlarge"]})
    assert preflight.aws_zones(several, ec2) == ["eu-west-1b"]
    (p,) = preflight.aws_offering_problems(settings_of(AWS, compute={"subnets": [subnet["SubnetId"]],
                                                                     "zones": ["eu-west-1a"]}), ec2)
    assert p.what == "compute.zones ['eu-west-1a']: no subnet of the group is in them (the subnets are in eu-west-1b)"


def test_gcp_machine_types_and_gpus_offered_in_no_zone() -> None:
    api = FakeGcp(**GCP_OK)
    api.not_offered = {("us-central1-a", "g2-standard-8"), ("us-central1-b", "g2-standard-8"),
                      ("us-central1-a", "g2-standard-4")}
    s = settings_of(GCP, compute={"instanceTypes": ["g2-standard-4", "g2-standard-8"], "zones": []})
    (p,) = preflight.gcp_offering_problems(s, api)
    assert p.what == "g2-standard-8 (compute.instanceTypes) is offered in none of the zones us-central1-a, us-central1-b"
    assert "gcloud compute machine-types list --filter='name=g2-standard-8'" in p.fix
    n1 = settings_of(GCP, compute={"instanceTypes": ["n1-standard-8"], "accelerator": "nvidia-tesla-t4",
                                   "zones": ["us-central1-a"]})
    api.not_offered = {("us-central1-a", "nvidia-tesla-t4")}
    (p,) = preflight.gcp_offering_problems(n1, api)
    assert p.what.startswith("nvidia-tesla-t4 (compute.accelerator)") and "accelerator-types" in p.fix


SERVICE_DISABLED = {"error": {
    "code": 403, "status": "PERMISSION_DENIED",
    "message": "Compute Engine API has not been used in project 123 before or it is disabled. Enable it by visiting "
               "https://console.developers.google.com/apis/api/compute.googleapis.com/overview?project=123 then retry.",
    "errors": [{"message": "Compute Engine API has not been used ...", "domain": "usageLimits",
                "reason": "accessNotConfigured"}],
    "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "SERVICE_DISABLED",
                 "domain": "googleapis.com",
                 "metadata": {"service": "compute.googleapis.com", "consumer": "projects/123"}}],
}}


def test_the_compute_api_off_says_enable_it_not_check_the_credentials() -> None:
    # Listed as off by Service Usage: one line, and no compute read is tried.
    api = FakeGcp(**{**GCP_OK, "services": set(PREREQUISITE_APIS)})
    problems = preflight.check(settings_of(GCP), gcp_api=api)
    assert api.calls == ["services my-project"]
    (p,) = problems
    assert "Compute Engine API" in p.what and "credentials" not in p.line()
    assert p.fix.startswith("gcloud services enable compute.googleapis.com --project my-project")

    # Service Usage unreadable, so Compute Engine answers for itself: 403 SERVICE_DISABLED, said once.
    compute = "https://compute.googleapis.com/compute/v1/projects/my-project"
    session = FakeSession({
        "https://serviceusage.googleapis.com/v1/projects/my-project/services": [
            FakeResponse(403, {"error": {"code": 403, "message": "denied", "status": "PERMISSION_DENIED"}})],
        f"{compute}/regions/us-central1": [FakeResponse(403, SERVICE_DISABLED)],
        f"{compute}/zones/us-central1-a/machineTypes/g2-standard-4": [FakeResponse(403, SERVICE_DISABLED)],
        f"{compute}/global/networks/default": [FakeResponse(403, SERVICE_DISABLED)],
    })
    lines = [p.line() for p in preflight.check(settings_of(GCP), gcp_api=preflight.RestGcpApi(session))]
    assert len(session.asked) == 4  # every check ran
    assert lines[0].startswith("could not check APIs") and "credentials" in lines[0]  # a real permission error
    assert lines[1:] == [preflight.compute_api_problem(settings_of(GCP)).line()]
    assert all("credentials" not in line for line in lines[1:])


@pytest.mark.parametrize(
    ("status", "doc", "service"),
    [(403, SERVICE_DISABLED, "compute.googleapis.com"),
     (403, {"error": {"code": 403, "message": "Access Not Configured. compute.googleapis.com has not been used",
                      "errors": [{"reason": "accessNotConfigured"}]}}, "compute.googleapis.com"),
     (403, {"error": {"code": 403, "message": "denied", "status": "PERMISSION_DENIED"}}, None),
     (404, SERVICE_DISABLED, None), (403, None, None)],
)
def test_an_api_that_is_off_is_told_from_other_errors(status, doc, service) -> None:
    found = preflight.api_disabled(status, doc)
    assert (found.service if found else None) == service


class TableEc2:
    """The EC2 reads preflight makes for zones, answered from a table of subnets and offerings."""

    def __init__(self, subnets: list[tuple[str, str]], offerings: list[tuple[str, str]]) -> None:
        self.subnets, self.offerings, self.asked = subnets, offerings, []

    def describe_vpcs(self, Filters: list) -> dict:  # noqa: N803 - boto3's names
        return {"Vpcs": [{"VpcId": "vpc-1", "IsDefault": True}]}

    def get_paginator(self, op: str):
        table = self

        class Pages:
            def paginate(self, **kw):
                table.asked.append(op)
                if op == "describe_subnets":
                    wanted = kw.get("SubnetIds")
                    return [{"Subnets": [{"SubnetId": s, "AvailabilityZone": z} for s, z in table.subnets
                                         if wanted is None or s in wanted]}]
                filters = {f["Name"]: f["Values"] for f in kw["Filters"]}
                return [{"InstanceTypeOfferings": [{"InstanceType": t, "Location": z} for t, z in table.offerings
                                                   if t in filters["instance-type"] and z in filters["location"]]}]

        return Pages()


class TableClouds:
    """The program's lookups of the same table: `ops synth`'s fake cloud with this table's subnets and offerings."""

    def __init__(self, subnets: list[tuple[str, str]], offerings: list[tuple[str, str]]) -> None:
        from ops.fakes import Mocks as SynthMocks

        zone_of = dict(subnets)

        class Mocks(SynthMocks):
            def call(self, args):
                if args.token == "aws:ec2/getSubnets:getSubnets":
                    return {"id": "x", "ids": [s for s, _ in subnets]}
                if args.token == "aws:ec2/getSubnet:getSubnet":
                    return {"id": args.args["id"], "vpcId": "vpc-1", "availabilityZone": zone_of[args.args["id"]]}
                if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
                    return {"id": "r", "instanceTypes": [t for t, _ in offerings], "locations": [z for _, z in offerings]}
                return super().call(args)

        self.mocks = Mocks("eu-west-1")


ZONE_CASES = {
    # The default VPC's subnets are in b and c only; every zone offers the type: b, not the region's a.
    "subnets-not-in-the-first-zone": ([("subnet-0b", "eu-west-1b"), ("subnet-0c", "eu-west-1c")],
                                      {}, [("g5.xlarge", z) for z in ("eu-west-1a", "eu-west-1b", "eu-west-1c")],
                                      "eu-west-1b"),
    # The first subnet zone does not offer the type: the next one that does.
    "first-zone-lacks-the-type": ([("subnet-0a", "eu-west-1a"), ("subnet-0c", "eu-west-1c")],
                                  {}, [("g5.xlarge", "eu-west-1b"), ("g5.xlarge", "eu-west-1c")], "eu-west-1c"),
    # compute.zones orders the candidates; a zone without a subnet is skipped.
    "compute-zones-order": ([("subnet-0a", "eu-west-1a"), ("subnet-0c", "eu-west-1c")],
                            {"zones": ["eu-west-1b", "eu-west-1c", "eu-west-1a"]},
                            [("g5.xlarge", z) for z in ("eu-west-1a", "eu-west-1b", "eu-west-1c")], "eu-west-1c"),
    # Own subnets.
    "own-subnets": ([("subnet-0123456789abcdef1", "eu-west-1c")], {"subnets": ["subnet-0123456789abcdef1"]},
                    [("g5.xlarge", "eu-west-1a"), ("g5.xlarge", "eu-west-1c")], "eu-west-1c"),
}


@pytest.mark.parametrize("case", sorted(ZONE_CASES))
def test_preflight_checks_the_zone_the_program_launches_in(case) -> None:
    from components.aws.group import SpotGroup, SpotGroupArgs
    from tests.fixtures.registrations import registrations

    subnets, compute, offerings, zone = ZONE_CASES[case]
    s = settings_of(AWS, compute={"nodes": 2, "instanceTypes": ["g5.xlarge"], **compute})
    ec2 = TableEc2(subnets, offerings)
    assert preflight.aws_zones(s, ec2) == [zone]
    assert preflight.aws_offering_problems(s, ec2) == []
    assert ec2.asked.count("describe_subnets") == 2  # preflight read the table

    records = registrations(lambda: SpotGroup("g", SpotGroupArgs(
        group_name="g-gpu", instance_types=list(s.compute.instance_types), nodes=2, subnets=list(s.compute.subnets),
        zones=list(s.compute.zones), instance_profile_arn="arn:aws:iam::1:instance-profile/p", user_data="#cloud-config",
    )), mocks=TableClouds(subnets, offerings).mocks)
    (asg,) = [r["inputs"] for r in records if r["type"] == "aws:autoscaling/group:Group"]
    assert asg["vpcZoneIdentifiers"] == [sid for sid, z in subnets if z == zone]


class DataBuckets(FakeGcp):
    """FakeGcp with GCS buckets: name -> (the deployer's permissions, public)."""

    def __init__(self, buckets: dict[str, tuple[set[str], bool]]) -> None:
        super().__init__(**GCP_OK)
        self.buckets = buckets

    def bucket_permissions(self, bucket: str, permissions: list[str]) -> set[str] | None:
        self.calls.append(f"permissions {bucket} {' '.join(permissions)}")
        return None if bucket not in self.buckets else self.buckets[bucket][0] & set(permissions)

    def publicly_readable(self, bucket: str, prefix: str) -> bool:
        self.calls.append(f"public {bucket} {prefix}")
        return self.buckets[bucket][1]


SET_POLICY = {"storage.buckets.setIamPolicy"}


@pytest.mark.parametrize(
    ("bucket", "data_grant", "what", "fix"),
    [
        ("own-data", True, None, None),  # the deployer's own bucket: the grant goes through
        ("public-data", True, "you cannot set the IAM policy of data bucket public-data (storage.buckets."
         "setIamPolicy), so `pulumi up` would fail granting the machines read access to it (403); it is publicly "
         "readable, so they need no grant", "set run.dataGrant: false"),
        ("other-team", True, "you cannot set the IAM policy of data bucket other-team",
         "ask its owner to grant roles/storage.objectViewer on gs://other-team to serviceAccount:ts-unit-"),
        ("public-data", False, None, None),  # said so: no grant is made, nothing to check
        ("no-such-bucket", True, "run.dataUri gs://no-such-bucket/lm/: there is no bucket no-such-bucket",
         "check run.dataUri"),
    ],
)
def test_preflight_says_when_the_data_bucket_s_policy_cannot_be_set(bucket, data_grant, what, fix) -> None:
    api = DataBuckets({"own-data": (SET_POLICY, False), "public-data": (set(), True), "other-team": (set(), False)})
    s = settings_of(GCP, run={"synthetic": False, "dataUri": f"gs://{bucket}/lm/", "dataGrant": data_grant})
    problems = preflight.check(s, gcp_api=api)
    if data_grant:
        assert f"permissions {bucket} storage.buckets.setIamPolicy" in api.calls  # the check ran
    assert [(p.what, p.fix) for p in problems if what and p.what.startswith(what[:40])] == (
        [] if what is None else [(problems[0].what, problems[0].fix)])
    assert len(problems) == (what is not None)
    if what:
        assert problems[0].what.startswith(what) and problems[0].fix.startswith(fix)
        assert "\n" not in problems[0].line()
    if bucket == "other-team":
        assert problems[0].fix.endswith("@my-project.iam.gserviceaccount.com and set run.dataGrant: false, or get "
                                        "roles/storage.admin on that bucket")


def test_preflight_runs_without_loading_the_cloud_providers() -> None:
    """The names preflight shares with the program come from the Pulumi-free naming modules:
    pulumi_aws and pulumi_gcp take seconds to import and preflight needs neither."""
    code = """
import sys
from ops import preflight
from tests.ops.test_preflight import AWS, GCP, SET_POLICY, DataBuckets, TableEc2, settings_of
s = settings_of(GCP, run={"synthetic": False, "dataUri": "gs://own-data/lm/", "dataGrant": True})
assert preflight.check(s, gcp_api=DataBuckets({"own-data": (SET_POLICY, False)})) == []
a = settings_of(AWS, compute={"nodes": 2, "instanceTypes": ["g5.xlarge"]})
assert preflight.aws_zones(a, TableEc2([("subnet-0b", "eu-west-1b")], [("g5.xlarge", "eu-west-1b")])) == ["eu-west-1b"]
class Ec2:
    def describe_images(self, **kw):
        return {"Images": [{"State": "available", "Name": kw["Filters"][0]["Values"][0]}]}
assert preflight.aws_image_problems(settings_of(AWS), Ec2()) == []
print("loaded:", sorted(m for m in sys.modules if m.split(".")[0] in ("pulumi_aws", "pulumi_gcp")))
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded: []"


def test_the_rest_client_reads_bucket_permissions_and_public_listing() -> None:
    tested = "https://storage.googleapis.com/storage/v1/b/{}/iam/testPermissions"
    session = FakeSession({
        tested.format("mine"): [FakeResponse(200, {"kind": "storage#testIamPermissionsResponse",
                                                   "permissions": ["storage.buckets.setIamPolicy"]})],
        tested.format("theirs"): [FakeResponse(200, {"kind": "storage#testIamPermissionsResponse"})],
        tested.format("gone"): [FakeResponse(404, {"error": {"code": 404, "message": "Not Found"}})],
    })
    anonymous = FakeSession({
        "https://storage.googleapis.com/storage/v1/b/theirs/o": [FakeResponse(200, {"items": []})],
        "https://storage.googleapis.com/storage/v1/b/mine/o": [FakeResponse(401, {"error": {"code": 401}})],
    })
    api = preflight.RestGcpApi(session, anonymous)
    assert api.bucket_permissions("mine", ["storage.buckets.setIamPolicy"]) == {"storage.buckets.setIamPolicy"}
    assert api.bucket_permissions("theirs", ["storage.buckets.setIamPolicy"]) == set()
    assert api.bucket_permissions("gone", ["storage.buckets.setIamPolicy"]) is None
    assert session.asked[0][1] == {"permissions": ["storage.buckets.setIamPolicy"]}
    assert api.publicly_readable("theirs", "lm/") is True and api.publicly_readable("mine", "lm/") is False
    assert anonymous.asked[0][1] == {"prefix": "lm/", "maxResults": 1}
