"""A GCP placement's machine reaching the home S3 bucket, enforced: the federated role of an AWS-home
stack, assumed with Google ID tokens through STS, and its session's calls.

The role's trust and policy are the synth output's own (`ops.synth` on an AWS-home stack with a GCP
placement), made in moto. moto's `AssumeRoleWithWebIdentity` evaluates neither the trust policy nor the
token, so the authorization layer (tests/fixtures/iam_cloud.py, `trust`) decides it on the token's
claims with `policy_eval.evaluate_trust`, as AWS would with its condition keys for Google
(`accounts.google.com:sub` the `sub` claim, `:aud` the `azp` claim, `:oaud` the `aud` claim), and guards
the session's key with the role's policy. The tokens are the boot sandbox metadata server's
(devtools/metadata.py), of the placement's service account or another, for its audience or another.
"""

from __future__ import annotations

import json

import boto3
import botocore.config
import botocore.exceptions
import pytest

from components.aws.federation import audience
from devtools.metadata import MetadataServer, token_claims
from ops import synth
from ops.fakes.common import fake_hex
from tests.fixtures.iam_cloud import IamCloud
from tests.iam.policy_eval import Decision, evaluate_trust, google_token_context

pytestmark = pytest.mark.slow

REGION = "us-east-1"
PROJECT = "my-gpus-42"
RUN_ID = "exp-7"
RAW = {"cloud": "aws", "region": REGION, "run": {"id": RUN_ID, "synthetic": True, "steps": 100},
       "placements": [{"cloud": "aws", "region": REGION, "instanceTypes": ["g5.xlarge"]},
                      {"cloud": "gcp", "region": "us-central1", "project": PROJECT,
                       "instanceTypes": ["g2-standard-4"]}]}
GROUP = "trainstack-places--exp-7-gpu-p1"
UNIQUE_ID = str(int(fake_hex("gcp:serviceaccount/account:Account", "trainstack-identity-p1-sa")[:15], 16))
OTHER_ID = "109876543210987654321"


@pytest.fixture(scope="module")
def stack() -> dict:
    """The synth output's federated role (trust, policy) and bucket."""
    r = synth.synthesize(RAW, stack="places")
    (role,) = [x for x in r.of_type("aws:iam/role:Role") if x["parent"] == "trainstack-federation-p1"]
    (policy,) = [x for x in r.of_type("aws:iam/rolePolicy:RolePolicy") if x["parent"] == "trainstack-federation-p1"]
    return {"trust": role["inputs"]["assumeRolePolicy"], "policy": policy["inputs"]["policy"],
            "bucket": r.outputs["bucketName"]}


def _token(service_account_id: str, aud: str) -> str:
    server = MetadataServer(service_account_id=service_account_id)
    try:
        return server.identity_token(aud)
    finally:
        server.close()


# -- the trust policy's conditions, on their own --------------------------------------------------

TOKENS = {
    "the placement's account, its audience": (UNIQUE_ID, audience(GROUP), Decision.ALLOW),
    "another account, the placement's audience": (OTHER_ID, audience(GROUP), Decision.IMPLICIT_DENY),
    "the placement's account, another audience": (UNIQUE_ID, "sts.amazonaws.com", Decision.IMPLICIT_DENY),
    "the placement's account, another placement's audience": (UNIQUE_ID, audience("other-group"),
                                                              Decision.IMPLICIT_DENY),
}


@pytest.mark.parametrize("case", sorted(TOKENS))
def test_the_trust_admits_the_placements_account_for_its_audience_only(stack, case):
    account, aud, expected = TOKENS[case]
    context = google_token_context(token_claims(_token(account, aud)))
    assert evaluate_trust(stack["trust"], federated="accounts.google.com", action="sts:AssumeRoleWithWebIdentity",
                          context=context) is expected


def test_each_condition_key_is_checked_on_its_own(stack):
    """`sub` and `azp` each hold the account's id: a token right in one and wrong in the other is refused."""
    right = google_token_context(token_claims(_token(UNIQUE_ID, audience(GROUP))))
    assert right == {"accounts.google.com:sub": UNIQUE_ID, "accounts.google.com:aud": UNIQUE_ID,
                     "accounts.google.com:oaud": audience(GROUP)}
    decide = lambda ctx: evaluate_trust(stack["trust"], federated="accounts.google.com",  # noqa: E731
                                        action="sts:AssumeRoleWithWebIdentity", context=ctx)
    assert decide(right) is Decision.ALLOW
    for key in right:
        assert decide({**right, key: OTHER_ID}) is Decision.IMPLICIT_DENY, key
    # Another issuer or another action is not this statement's.
    assert evaluate_trust(stack["trust"], federated="cognito-identity.amazonaws.com",
                          action="sts:AssumeRoleWithWebIdentity", context=right) is Decision.IMPLICIT_DENY
    assert evaluate_trust(stack["trust"], federated="accounts.google.com", action="sts:AssumeRole",
                          context=right) is Decision.IMPLICIT_DENY


# -- through STS, under enforcement ---------------------------------------------------------------


@pytest.fixture(scope="module")
def cloud(iam_cloud: IamCloud, stack) -> dict:
    """The role and the home bucket in moto, the role's trust registered with the layer."""
    s3 = iam_cloud.admin("s3", REGION)
    s3.create_bucket(Bucket=stack["bucket"])
    s3.put_object(Bucket=stack["bucket"], Key=f"runs/{RUN_ID}/progress.json", Body=b'{"step": 40}')
    s3.put_object(Bucket=stack["bucket"], Key="runs/another-run/COMPLETE", Body=b"{}")
    iam = iam_cloud.admin("iam", REGION)
    arn = iam.create_role(RoleName="trainstack-placement-gcp", AssumeRolePolicyDocument=stack["trust"])["Role"]["Arn"]
    iam.put_role_policy(RoleName="trainstack-placement-gcp", PolicyName="machine", PolicyDocument=stack["policy"])
    iam_cloud.proxy.trust(arn, stack["trust"], [stack["policy"]])
    return {"cloud": iam_cloud, "arn": arn, "bucket": stack["bucket"]}


def _assume(cloud: dict, token: str) -> dict:
    sts = boto3.session.Session().client("sts", endpoint_url=cloud["cloud"].proxy.url, region_name=REGION,
                                         config=botocore.config.Config(signature_version=botocore.UNSIGNED))
    return sts.assume_role_with_web_identity(RoleArn=cloud["arn"], RoleSessionName="trainstack-gpu-p1-abcd",
                                             WebIdentityToken=token)["Credentials"]


def _client(cloud: dict, service: str, creds: dict):
    return boto3.session.Session().client(
        service, endpoint_url=cloud["cloud"].proxy.url, region_name=REGION, aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"], aws_session_token=creds["SessionToken"])


@pytest.mark.parametrize("case", sorted(TOKENS))
def test_sts_gives_a_session_to_the_placements_token_only(cloud, case):
    account, aud, expected = TOKENS[case]
    before = len(cloud["cloud"].proxy.decisions)
    if expected is Decision.ALLOW:
        assert _assume(cloud, _token(account, aud))["AccessKeyId"]
    else:
        with pytest.raises(botocore.exceptions.ClientError) as info:
            _assume(cloud, _token(account, aud))
        assert info.value.response["Error"]["Code"] == "AccessDenied"
    assert cloud["cloud"].proxy.decisions[before:] == [("web-identity", "sts:AssumeRoleWithWebIdentity",
                                                        cloud["arn"], expected)]


def test_the_session_reaches_its_run_in_the_home_bucket_and_nothing_else(cloud):
    creds = _assume(cloud, _token(UNIQUE_ID, audience(GROUP)))
    s3 = _client(cloud, "s3", creds)
    bucket = cloud["bucket"]
    assert json.loads(s3.get_object(Bucket=bucket, Key=f"runs/{RUN_ID}/progress.json")["Body"].read()) == {"step": 40}
    s3.put_object(Bucket=bucket, Key=f"runs/{RUN_ID}/events.jsonl", Body=b"{}")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"runs/{RUN_ID}/")["Contents"]]
    assert keys == [f"runs/{RUN_ID}/events.jsonl", f"runs/{RUN_ID}/progress.json"]
    refused = {
        "read another run": lambda: s3.get_object(Bucket=bucket, Key="runs/another-run/COMPLETE"),
        "write another run": lambda: s3.put_object(Bucket=bucket, Key="runs/another-run/x", Body=b"x"),
        "list every run": lambda: s3.list_objects_v2(Bucket=bucket, Prefix="runs/"),
        "scale a group": lambda: _client(cloud, "autoscaling", creds).update_auto_scaling_group(
            AutoScalingGroupName="trainstack-places--exp-7-gpu", MinSize=0, MaxSize=0, DesiredCapacity=0),
    }
    for what, call in refused.items():
        before = len(cloud["cloud"].proxy.decisions)
        with pytest.raises(botocore.exceptions.ClientError) as info:
            call()
        assert info.value.response["Error"]["Code"] == "AccessDenied", what
        assert [d for k, *_, d in cloud["cloud"].proxy.decisions[before:] if k == creds["AccessKeyId"]] == [
            Decision.IMPLICIT_DENY], what
    with pytest.raises(botocore.exceptions.ClientError) as info:
        _client(cloud, "ecr", creds).get_authorization_token()
    assert info.value.response["Error"]["Code"] == "AccessDeniedException"
