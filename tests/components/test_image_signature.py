"""ImageSignature's step of `pulumi up`: the gated digest signed by moto's KMS key in every repository it
was pushed to (the tests' real registry), the public key it hands the user data, and when it signs again."""

from __future__ import annotations

import base64
import uuid

import boto3
import pytest
from moto import mock_aws

from components import image_signature, signing
from tests.fixtures.oci_images import oci_layout, push


@pytest.fixture
def kms():
    with mock_aws():
        yield boto3.client("kms", region_name="us-east-1", aws_access_key_id="testing",
                           aws_secret_access_key="testing")  # noqa: S106 (moto's)


def test_the_digest_is_signed_in_every_repository_and_the_public_key_is_the_kms_keys(tmp_path, oci_registry, kms):
    digest = oci_layout(tmp_path / "layout", "v1")
    repos = [f"{oci_registry}/t/{uuid.uuid4().hex[:12]}" for _ in range(2)]
    for repo in repos:
        push(tmp_path / "layout", "v1", f"{repo}:v1")
    key = kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
    der = kms.get_public_key(KeyId=key)["PublicKey"]
    asked = []

    def clients(props):
        assert props["key"] == key
        return signing.aws_kms_signer(kms, key), der, lambda url: asked.append(url)

    props = {"cloud": "aws", "key": key, "key_region": "us-east-1", "repository_urls": repos, "digest": digest}
    public = image_signature.sign(props, clients)
    assert base64.b64decode(public) == der and asked == repos
    for repo in repos:
        [signed] = signing.fetch_signatures(repo, digest)
        signing.verify(signing.public_key_pem(der), repo, digest, signed)

    # A second `pulumi up` finds the signatures and signs nothing (the repositories' tags are immutable).
    def refused(_data):
        raise AssertionError("signed again")
    assert image_signature.sign(props, lambda p: (refused, der, lambda url: None)) == public


@pytest.mark.parametrize(("change", "again"), [
    ({}, False), ({"digest": "sha256:" + "c" * 64}, True), ({"key": "other"}, True),
    ({"repository_urls": ["a", "b"]}, True), ({"public_key": "x"}, False),
])
def test_it_signs_again_only_when_the_digest_the_key_or_the_repositories_change(change, again):
    olds = {"cloud": "aws", "key": "k", "key_region": "us-east-1", "repository_urls": ["a"],
            "digest": "sha256:" + "b" * 64, "public_key": "p"}
    assert image_signature._Signer().diff("id", olds, {**olds, **change}).changes is again
