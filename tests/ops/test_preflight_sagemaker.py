"""`ops preflight` on a SageMaker stack: SageMaker's own training quota of the job's instance type, found by name
in Service Quotas (the account's applied values, else AWS's defaults), and the bucket; none of the groups' EC2
checks.

moto serves no SageMaker quotas: a real botocore client with `Stubber`, which checks each request and each answer
against Service Quotas' service model. The bucket is moto's S3.
"""

from __future__ import annotations

import copy
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from components import settings as config
from components.project import STACKS_DIR
from ops import preflight
from ops.preflight import sagemaker as preflight_sagemaker

REGION = "us-east-1"
SPOT = "ml.g5.xlarge for spot training job usage"
ON_DEMAND = "ml.g5.xlarge for training job usage"


def stack(**compute) -> config.Settings:
    """The repository's `sagemaker` stack (ml.g5.xlarge, spot, one node), with `compute` changed."""
    raw = config.raw_from_config(config.read_stack_file(Path(STACKS_DIR) / "Pulumi.sagemaker.yaml"))
    raw = copy.deepcopy(raw)
    raw["compute"].update(compute)
    return config.load_settings(raw, stack="sagemaker")


def quota(name: str, code: str, value: float) -> dict:
    return {"ServiceCode": "sagemaker", "ServiceName": "Amazon SageMaker", "QuotaCode": code, "QuotaName": name,
            "QuotaArn": f"arn:aws:servicequotas:{REGION}:123456789012:sagemaker/{code}", "Value": value,
            "Unit": "None", "Adjustable": True, "GlobalQuota": False}


def quotas_client(applied: list[list[dict]], defaults: list[list[dict]] | None = None) -> tuple[object, Stubber]:
    """A Service Quotas client answering ListServiceQuotas with the `applied` pages, then (when given)
    ListAWSDefaultServiceQuotas with the `defaults` pages; each request is checked, paging included."""
    client = boto3.client("service-quotas", region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s")
    stub = Stubber(client)
    for op, pages in (("list_service_quotas", applied), ("list_aws_default_service_quotas", defaults)):
        for i, page in enumerate(pages or []):
            more = {"NextToken": f"t{i + 1}"} if i + 1 < len(pages) else {}
            stub.add_response(op, {"Quotas": page, **more},
                              {"ServiceCode": "sagemaker", **({"NextToken": f"t{i}"} if i else {})})
    stub.activate()
    return client, stub


def problems_of(s: config.Settings, applied: list[list[dict]], defaults: list[list[dict]] | None = None) -> list:
    client, stub = quotas_client(applied, defaults)
    found = preflight_sagemaker.sagemaker_quota_problems(s, client)
    stub.assert_no_pending_responses()  # every page was read, and nothing else was asked
    return found


def test_enough_spot_quota_is_clean() -> None:
    assert problems_of(stack(), [[quota(ON_DEMAND, "L-OD", 0), quota(SPOT, "L-SPOT", 1)]]) == []


def test_a_new_account_s_zero_is_one_line_naming_the_quota_and_the_request() -> None:
    (p,) = problems_of(stack(nodes=2), [[quota(SPOT, "L-SPOT", 0)]])
    assert p.what.startswith(f"SageMaker quota '{SPOT}' (L-SPOT) in {REGION} is 0; the job needs 2 "
                             "(2 x ml.g5.xlarge)")
    assert "ResourceLimitExceeded" in p.what
    assert p.fix.startswith("aws service-quotas request-service-quota-increase --service-code sagemaker "
                            f"--quota-code L-SPOT --desired-value 2 --region {REGION}")


def test_a_quota_is_found_on_a_later_page() -> None:
    (p,) = problems_of(stack(nodes=3), [[quota("ml.p3.2xlarge for spot training job usage", "L-P3", 4)],
                                         [quota(SPOT, "L-SPOT", 2)]])
    assert "is 2; the job needs 3" in p.what


def test_without_an_applied_value_aws_s_default_holds() -> None:
    applied = [[quota("ml.p3.2xlarge for spot training job usage", "L-P3", 4)]]
    assert problems_of(stack(), applied, [[quota(SPOT, "L-SPOT", 1)]]) == []
    (p,) = problems_of(stack(), applied, [[quota(SPOT, "L-SPOT", 0)]])
    assert f"'{SPOT}' (L-SPOT) in {REGION} is 0" in p.what


@pytest.mark.parametrize("spot, name, code", [(True, SPOT, "L-SPOT"), (False, ON_DEMAND, "L-OD")])
def test_spot_and_on_demand_draw_on_their_own_quota(spot: bool, name: str, code: str) -> None:
    # The other kind has room; the job's own kind has none.
    page = [quota(ON_DEMAND, "L-OD", 0 if not spot else 8), quota(SPOT, "L-SPOT", 0 if spot else 8)]
    (p,) = problems_of(stack(spot=spot), [page])
    assert p.what.startswith(f"SageMaker quota '{name}' ({code})") and f"--quota-code {code} " in p.fix


def test_a_quota_of_another_type_is_not_the_job_s() -> None:
    # Names sharing a prefix with the job's type (ml.g5.xlarge) are other types' quotas.
    others = [quota("ml.g5.2xlarge for spot training job usage", "L-2X", 8),
              quota("ml.g5.12xlarge for spot training job usage", "L-12X", 8),
              quota("ml.g5.xlarge for spot training warm pool usage", "L-WARM", 8)]
    (p,) = problems_of(stack(), [others], [[*others, quota(SPOT, "L-SPOT", 0)]])
    assert "(L-SPOT)" in p.what and "is 0" in p.what


def test_a_type_without_any_quota_says_the_region_may_not_offer_it() -> None:
    (p,) = problems_of(stack(), [[]], [[quota("ml.p3.2xlarge for spot training job usage", "L-P3", 0)]])
    assert p.what.startswith(f"SageMaker has no quota '{SPOT}' in {REGION}")
    assert "list-aws-default-service-quotas --service-code sagemaker" in p.fix


def test_credentials_that_may_not_list_quotas_are_told_which_permissions_to_add() -> None:
    client = boto3.client("service-quotas", region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s")
    with Stubber(client) as stub:
        stub.add_client_error("list_service_quotas", "AccessDeniedException", "not authorized", 400,
                              expected_params={"ServiceCode": "sagemaker"})
        (p,) = preflight_sagemaker.sagemaker_quota_problems(stack(), client)
    assert p.what == (f"could not read SageMaker's quota '{SPOT}' in {REGION}: AccessDeniedException: not authorized")
    assert p.fix.startswith("allow servicequotas:ListServiceQuotas and servicequotas:ListAWSDefaultServiceQuotas")


class DeployerSts:
    """moto's STS, whose caller is an IAM user of moto's account (moto names its caller with an `sts` ARN, which
    IAM cannot simulate)."""

    def __init__(self, region: str | None) -> None:
        self.sts = boto3.client("sts", region_name=region)

    def get_caller_identity(self) -> dict:
        found = self.sts.get_caller_identity()
        return {**found, "Arn": f"arn:aws:iam::{found['Account']}:user/deployer"}


def allowing_iam() -> object:
    """IAM that allows every action the image-signing key check simulates (a SageMaker stack signs its image)."""
    from ops.preflight import aws as preflight_aws

    iam = boto3.client("iam", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(iam)
    for actions in (preflight_aws.SIGNING_CREATE_ACTIONS, preflight_aws.SIGNING_KEY_ACTIONS,
                    preflight_aws.SIGNING_SIGNER_ACTIONS):
        stub.add_response("simulate_principal_policy", {"EvaluationResults": [
            {"EvalActionName": a, "EvalDecision": "allowed"} for a in actions], "IsTruncated": False})
    stub.activate()
    return iam


class Session:
    """A boto3 session: the stubbed Service Quotas and IAM clients, moto's for the rest; records which clients are
    made."""

    def __init__(self, quotas: object) -> None:
        self.quotas, self.made = quotas, []

    def client(self, name: str, region_name: str | None = None):
        self.made.append(name)
        made = {"service-quotas": lambda: self.quotas, "iam": allowing_iam, "sts": lambda: DeployerSts(region_name)}
        return made.get(name, lambda: boto3.client(name, region_name=region_name))()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        yield


def test_a_sagemaker_stack_gets_the_job_s_checks_not_the_groups(aws) -> None:
    client, stub = quotas_client([[quota(SPOT, "L-SPOT", 0)]])
    session = Session(client)
    found = preflight.check(stack(), aws_session=session)
    stub.assert_no_pending_responses()
    assert [p.what.split(" in ")[0] for p in found] == [f"SageMaker quota '{SPOT}' (L-SPOT)"]
    # No EC2 (no zones, subnets, AMI); IAM for the image-signing key's rights.
    assert sorted(set(session.made)) == ["iam", "s3", "service-quotas", "sts"]


def test_a_sagemaker_stack_s_bucket_is_checked(aws) -> None:
    s = stack()
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=preflight.aws_bucket_name(s, boto3.client("sts")))
    client, _ = quotas_client([[quota(SPOT, "L-SPOT", 1)]])
    (p,) = preflight.check(s, aws_session=Session(client))
    assert "already exists in your account" in p.what and "storage.adopt" in p.fix


def test_the_cli_says_the_training_job_would_be_refused(aws, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    client, _ = quotas_client([[quota(SPOT, "L-SPOT", 0)]])
    args = argparse.Namespace(stack="sagemaker", stacks_dir=str(STACKS_DIR))
    assert preflight.cmd_preflight(args, aws_session=Session(client)) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"SageMaker quota '{SPOT}' (L-SPOT)")
    assert out[-1] == "preflight sagemaker: 1 problem(s); the sagemaker training job would be refused"
