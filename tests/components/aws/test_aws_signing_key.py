"""SigningKey (AWS): the KMS key a build stack signs its image with: the values KMS documents for an ECDSA P-256
signing key, its key policy, and the key as declared signing in moto, verified as a machine verifies."""

from __future__ import annotations

import base64
import json

import boto3
import botocore.session
import pytest
from moto import mock_aws

from components import signing
from components.aws import signing_key
from tests.components.aws.helpers import one, synth_raw

KEY = "aws:kms/key:Key"


@pytest.fixture(scope="module")
def key() -> dict:
    return one(synth_raw({"image": {"build": True}}), KEY)


def test_a_build_stack_has_one_ecdsa_p256_signing_key_in_home_and_a_pinned_image_none(key):
    inputs = key["inputs"]
    model = botocore.session.get_session().get_service_model("kms")
    assert inputs["customerMasterKeySpec"] == "ECC_NIST_P256" in model.shape_for("KeySpec").enum
    assert inputs["keyUsage"] == "SIGN_VERIFY" in model.shape_for("KeyUsageType").enum
    # The algorithm ImageSignature asks for is the key spec's.
    assert "ECDSA_SHA_256" in model.shape_for("SigningAlgorithmSpec").enum
    assert 7 <= inputs["deletionWindowInDays"] <= 30
    assert key["parent"] == "trainstack-signing" and inputs["tags"]["trainstack-stack"] == "unit"
    assert not synth_raw().of_type(KEY)


def test_the_key_policy_lets_the_deployer_sign_and_the_account_administer_without_using_it(key):
    statements = json.loads(key["inputs"]["policy"])["Statement"]
    by_sid = {s["Sid"]: s for s in statements}
    assert set(by_sid) == {"AccountAdministersTheKey", "TheDeployerSignsImages"}
    # The synth's caller is a user (ops/fakes): its own ARN signs.
    assert by_sid["TheDeployerSignsImages"]["Principal"] == {"AWS": "arn:aws:iam::123456789012:user/synth"}
    assert sorted(by_sid["TheDeployerSignsImages"]["Action"]) == ["kms:GetPublicKey", "kms:Sign"]
    admin = by_sid["AccountAdministersTheKey"]
    assert admin["Principal"] == {"AWS": "arn:aws:iam::123456789012:root"}
    assert "kms:PutKeyPolicy" in admin["Action"]
    assert not [a for a in admin["Action"] if a in ("kms:Sign", "kms:Verify", "kms:CreateGrant") or "*" in a]


def test_the_key_as_declared_signs_in_moto_and_its_signature_verifies_as_the_machine_checks_it(key):
    inputs = key["inputs"]
    digest, repo = "sha256:" + "e" * 64, "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainstack/unit"
    with mock_aws():
        kms = boto3.client("kms", region_name="us-east-1", aws_access_key_id="testing",
                           aws_secret_access_key="testing")  # noqa: S106 (moto's)
        arn = kms.create_key(KeySpec=inputs["customerMasterKeySpec"], KeyUsage=inputs["keyUsage"],
                             Policy=inputs["policy"])["KeyMetadata"]["Arn"]
        body = signing.payload(repo, digest)
        signed = signing.Signed(body, signing.aws_kms_signer(kms, arn)(body))
        pem = signing.public_key_pem(kms.get_public_key(KeyId=arn)["PublicKey"])
    signing.verify(pem, repo, digest, signed)
    with pytest.raises(signing.SigningError, match="not of sha256:f"):
        signing.verify(pem, repo, "sha256:" + "f" * 64, signed)
    assert base64.b64encode(signed.signature)


def test_the_signer_actions_are_what_image_signature_calls():
    # ImageSignature's AWS clients: get_public_key, then sign (components/image_signature.py); nothing else.
    assert signing_key.SIGNER_ACTIONS == ("kms:GetPublicKey", "kms:Sign")
