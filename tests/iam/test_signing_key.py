"""The signing key's grants, evaluated: the identity that runs `pulumi up` signs, the machines use the key for
nothing, and no other IAM principal of the account can be given its use.

AWS: the key policy the stack synthesizes (`ops synth` of a build stack, with a deployer who runs `pulumi up` as an
assumed role) and the machines' role policy, evaluated together as KMS does (tests/iam/policy_eval.py's
`evaluate_key_policy`: moto enforces no key policy). The machine's own calls to the key, refused by the
IAM-enforced emulator, are in tests/iam/test_machine_identity.py. GCP: every grant the stack makes, read from the
synth output: the deployer's two roles on the one crypto key, and nothing of Cloud KMS for the machines' account.
"""

from __future__ import annotations

import json

import pytest

import components.aws as aws
import components.gcp as gcp
from components.common import TrainingStackArgs
from components.gcp.signing_key import SIGNER_ROLES
from components.settings import load_settings
from ops.fakes import Mocks
from tests.fixtures.registrations import ACCOUNT, registrations
from tests.iam.policy_eval import Decision, Request, evaluate_key_policy

DEPLOYER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/Deployer"
RUN = {"id": "exp-7", "synthetic": True, "steps": 10}
AWS_STACK = {"cloud": "aws", "region": "eu-west-1", "run": RUN, "image": {"build": True}}
GCP_STACK = {"cloud": "gcp", "region": "us-central1", "project": "my-proj-123", "run": RUN, "image": {"build": True},
             "compute": {"instanceTypes": ["g2-standard-8"]}}
ADMIN_POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "kms:*", "Resource": "*"}]}


class DeployerSession(Mocks):
    """The fake cloud, where `pulumi up` runs as a session of the role Deployer (as SSO and CI do)."""

    def call(self, args):
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            self.invokes.append({"token": args.token})
            return {"accountId": ACCOUNT, "id": ACCOUNT, "userId": "AROAFAKE:ci-4711",
                    "arn": f"arn:aws:sts::{ACCOUNT}:assumed-role/Deployer/ci-4711"}
        return super().call(args)


@pytest.fixture(scope="module")
def aws_documents() -> dict:
    settings = load_settings(AWS_STACK, stack="unit")
    records = registrations(lambda: aws.TrainingStack("trainstack", TrainingStackArgs(settings=settings)).bucket_name,
                            DeployerSession("eu-west-1"), region="eu-west-1")
    (key,) = [r for r in records if r["type"] == "aws:kms/key:Key"]
    (role,) = [r for r in records if r["type"] == "aws:iam/role:Role" and r["name"] == "trainstack-identity-role"]
    (machine,) = [r["inputs"]["policy"] for r in records if r["type"] == "aws:iam/rolePolicy:RolePolicy"
                  and r["name"].startswith("trainstack-identity")]
    return {"key": json.loads(key["inputs"]["policy"]), "key_arn": f"arn:aws:kms:eu-west-1:{ACCOUNT}:key/k",
            "machine": json.loads(machine), "machine_role": f"arn:aws:iam::{ACCOUNT}:role/{role['inputs'].get('name') or role['name']}"}


def test_the_key_policy_names_the_deployers_role_not_its_session(aws_documents):
    (signer,) = [s for s in aws_documents["key"]["Statement"] if "kms:Sign" in s["Action"]]
    assert signer["Principal"] == {"AWS": DEPLOYER_ROLE}


@pytest.mark.parametrize(("who", "action", "decision"), [
    ("deployer", "kms:Sign", Decision.ALLOW),
    ("deployer", "kms:GetPublicKey", Decision.ALLOW),
    ("deployer", "kms:Verify", Decision.IMPLICIT_DENY),
    ("deployer", "kms:Decrypt", Decision.IMPLICIT_DENY),
    ("machine", "kms:Sign", Decision.IMPLICIT_DENY),
    ("machine", "kms:GetPublicKey", Decision.IMPLICIT_DENY),
    ("machine", "kms:Verify", Decision.IMPLICIT_DENY),
    # Whatever an account's administrator's IAM policy says, the key is not theirs to sign with; they keep it manageable.
    ("admin", "kms:Sign", Decision.IMPLICIT_DENY),
    ("admin", "kms:PutKeyPolicy", Decision.ALLOW),
    ("admin", "kms:ScheduleKeyDeletion", Decision.ALLOW),
    # Nor can anyone add Sign to the machines' role: the account root is given no use of the key.
    ("machine with kms:*", "kms:Sign", Decision.IMPLICIT_DENY),
])
def test_the_deployer_alone_signs_and_the_machines_use_the_key_for_nothing(aws_documents, who, action, decision):
    docs = aws_documents
    caller, policies = {
        "deployer": (DEPLOYER_ROLE, []),
        "machine": (docs["machine_role"], [docs["machine"]]),
        "admin": (f"arn:aws:iam::{ACCOUNT}:user/admin", [ADMIN_POLICY]),
        "machine with kms:*": (docs["machine_role"], [docs["machine"], ADMIN_POLICY]),
    }[who]
    assert evaluate_key_policy(docs["key"], policies, caller=caller, request=Request(action, docs["key_arn"])) is decision


def test_the_evaluator_lets_the_account_root_delegate_to_iam():
    # AWS's default key policy: the root with kms:* lets any identity policy grant the key's use.
    default = {"Statement": [{"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
                              "Action": "kms:*", "Resource": "*"}]}
    req = Request("kms:Sign", "arn:aws:kms:eu-west-1:123456789012:key/k")
    assert evaluate_key_policy(default, [ADMIN_POLICY], caller=f"arn:aws:iam::{ACCOUNT}:role/m", request=req) is Decision.ALLOW
    assert evaluate_key_policy(default, [], caller=f"arn:aws:iam::{ACCOUNT}:role/m", request=req) is Decision.IMPLICIT_DENY


@pytest.fixture(scope="module")
def gcp_grants() -> tuple[list[dict], str]:
    from ops import synth

    r = synth.synthesize(GCP_STACK, stack="unit")
    grants = [x for x in r.resources if "IAMMember" in x["type"] or "IAMBinding" in x["type"] or "IAMPolicy" in x["type"]]
    (account,) = [x for x in r.resources if x["type"] == "gcp:serviceaccount/account:Account"
                  and x["parent"] == "trainstack-identity"]
    email = f"{account['inputs']['accountId']}@my-proj-123.iam.gserviceaccount.com"
    return grants, email


def _members(grant: dict) -> list[str]:
    inputs = grant["inputs"]
    return [inputs["member"]] if "member" in inputs else list(inputs.get("members") or [])


def test_the_deployer_gets_signer_and_public_key_viewer_on_the_one_crypto_key(gcp_grants):
    grants, _ = gcp_grants
    kms = [g for g in grants if g["type"].startswith("gcp:kms/")]
    assert sorted((g["type"], g["inputs"]["role"], *_members(g)) for g in kms) == sorted(
        ("gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember", role, "user:synth@example.com") for role in SIGNER_ROLES)
    assert {g["inputs"]["cryptoKeyId"] for g in kms} == {
        next(x["inputs"]["cryptoKeyId"] for x in kms)}
    assert next(iter({g["inputs"]["cryptoKeyId"] for g in kms})).endswith("/cryptoKeys/image-signing")
    # No project-wide grant of any Cloud KMS role, to anyone.
    assert not [g for g in grants if "cloudkms" in str(g["inputs"].get("role")) and not g["type"].startswith("gcp:kms/")]


def test_the_machines_account_has_nothing_of_cloud_kms(gcp_grants):
    grants, email = gcp_grants
    theirs = [g for g in grants if f"serviceAccount:{email}" in _members(g)]
    assert theirs, "the machines' account has its grants (bucket, repository, group)"
    assert not [g for g in theirs if g["type"].startswith("gcp:kms/") or "cloudkms" in str(g["inputs"].get("role"))]


def test_a_service_account_that_deploys_is_named_as_one():
    from components.gcp.signing_key import member

    assert member("ci@my-proj-123.iam.gserviceaccount.com") == "serviceAccount:ci@my-proj-123.iam.gserviceaccount.com"
    assert member("ada@example.com") == "user:ada@example.com"
    assert gcp.SigningKey is not aws.SigningKey
