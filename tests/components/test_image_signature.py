"""ImageSignature's step of `pulumi up`: the gated digest signed by moto's KMS key in every repository it
was pushed to (the tests' real registry), the public key it hands the user data, and when it signs again."""

from __future__ import annotations

import base64
import re
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


# ---- in the stack: after the gate, by the stack's key, into every machine's user data

STACK = {"region": "us-east-1", "run": {"synthetic": True}}
GCP = {"project": "my-proj-123", "region": "us-central1", "compute": {"instanceTypes": ["g2-standard-8"]}}
# What must exist before the signature is made: the gate that passed the digest, and the key with its grants.
BEFORE_SIGNING = {
    "aws": {"trainstack-image-scan-gate", "trainstack-signing-key"},
    "gcp": {"trainstack-image-scan-gate", "trainstack-signing-version", "trainstack-signing-signer",
            "trainstack-signing-publickeyviewer"},
}
GROUP_TEMPLATE = {"aws": "aws:ec2/launchTemplate:LaunchTemplate", "gcp": "gcp:compute/instanceTemplate:InstanceTemplate"}


def _stack(cloud: str, **image) -> dict:
    return {**STACK, "cloud": cloud, **(GCP if cloud == "gcp" else {}), "image": image}


def _by_name(r) -> dict[str, dict]:
    return {x["name"]: x for x in r.resources}


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_gated_digest_is_signed_by_the_stacks_key_before_any_machine_is_told_of_it(cloud):
    from ops import synth

    r = synth.synthesize(_stack(cloud, build=True), stack="unit")
    made = _by_name(r)
    signature, gate = made["trainstack-image-signature"], made["trainstack-image-scan-gate"]
    assert signature["parent"] == "trainstack-image" and signature["type"] == "pulumi-python:dynamic:Resource"
    assert BEFORE_SIGNING[cloud] <= set(signature["options"]["dependsOn"])
    inputs = signature["inputs"]
    # The digest the gate passed, in the one repository of a one-placement stack, by the stack's own key.
    assert inputs["digest"] == gate["inputs"]["digest"] and inputs["cloud"] == cloud
    assert inputs["repository_urls"] == [gate["inputs"]["repository_url"]]
    if cloud == "aws":
        key = made["trainstack-signing-key"]["inputs"]
        assert inputs["key"].startswith("arn:aws:kms:us-east-1:") and inputs["key_region"] == "us-east-1"
        assert key["customerMasterKeySpec"] == "ECC_NIST_P256" and key["keyUsage"] == "SIGN_VERIFY"
    else:
        ring = made["trainstack-signing-ring"]["inputs"]
        assert inputs["key"] == (f"projects/my-proj-123/locations/us-central1/keyRings/{ring['name']}"
                                 "/cryptoKeys/image-signing/cryptoKeyVersions/1")
    # Each group's template reads the signed digest and the key's public half, so it waits for the signature.
    (template,) = [x for x in r.resources if x["type"] == GROUP_TEMPLATE[cloud]]
    assert "trainstack-image-signature" in template["options"]["dependsOn"]
    (text,) = r.user_data.values()
    public = re.findall(r"^\s*TRAINSTACK_IMAGE_PUBLIC_KEY='([^']*)'$", text, re.M)
    assert public == [_stand_in_public_key(made)]
    assert re.findall(r"^\s*TRAINSTACK_IMAGE='([^']*)'$", text, re.M) == [f"{inputs['repository_urls'][0]}@{inputs['digest']}"]


def _stand_in_public_key(made: dict[str, dict]) -> str:
    """The fake cloud's public key of the signature (a P-256 key, base64 DER)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_der_public_key

    from ops.fakes import fake_hex
    from ops.fakes.common import DYNAMIC, signing_public_key

    public = signing_public_key(fake_hex(DYNAMIC, "trainstack-image-signature"))
    assert isinstance(load_der_public_key(base64.b64decode(public)), ec.EllipticCurvePublicKey)
    assert "trainstack-image-signature" in made
    return public


def test_every_placement_region_of_a_built_image_holds_the_signature_and_every_machine_the_key():
    from ops import synth

    r = synth.synthesize({"cloud": "aws", "region": "eu-west-1", "run": {"synthetic": True}, "image": {"build": True},
                          "placements": [{"cloud": "aws", "region": "eu-west-1", "instanceTypes": ["g5.xlarge"]},
                                         {"cloud": "aws", "region": "us-west-2", "instanceTypes": ["g5.xlarge"]}]},
                         stack="places")
    inputs = _by_name(r)["trainstack-image-signature"]["inputs"]
    hosts = [u.split("/", 1)[0] for u in inputs["repository_urls"]]
    assert hosts == ["123456789012.dkr.ecr.eu-west-1.amazonaws.com", "123456789012.dkr.ecr.us-west-2.amazonaws.com"]
    images, keys = [], set()
    for text in r.user_data.values():
        images += re.findall(r"^\s*TRAINSTACK_IMAGE='([^']*)'$", text, re.M)
        keys.update(re.findall(r"^\s*TRAINSTACK_IMAGE_PUBLIC_KEY='([^']*)'$", text, re.M))
    assert sorted(images) == sorted(f"{u}@{inputs['digest']}" for u in inputs["repository_urls"])
    assert len(keys) == 1 and "" not in keys


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_a_stack_that_runs_a_pinned_image_has_no_key_and_verifies_nothing(cloud):
    from ops import synth

    pinned = "sha256:" + "a" * 64
    r = synth.synthesize(_stack(cloud, build=False, digest=pinned), stack="unit")
    assert not [x for x in r.resources if "kms" in x["type"] or "signing" in x["name"] or "signature" in x["name"]]
    (text,) = r.user_data.values()
    assert re.findall(r"^\s*TRAINSTACK_IMAGE='([^']*)'$", text, re.M) == [f"tensorflow/tensorflow@{pinned}"]
    assert re.findall(r"^\s*TRAINSTACK_IMAGE_PUBLIC_KEY=", text, re.M) == []


def test_a_signature_that_cannot_be_made_names_the_key_and_the_repository():
    def refused(_data):
        raise RuntimeError("User: arn:aws:iam::123456789012:user/x is not authorized to perform: kms:Sign")

    props = {"cloud": "aws", "key": "arn:aws:kms:us-east-1:123456789012:key/k", "key_region": "us-east-1",
             "repository_urls": ["127.0.0.1:9/t/r"], "digest": "sha256:" + "b" * 64}
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    der = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(signing.SigningError) as e:
        image_signature.sign(props, lambda p: (refused, der, lambda url: None))
    assert str(e.value).startswith(f"cannot sign 127.0.0.1:9/t/r@{props['digest']} with the signing key "
                                   "arn:aws:kms:us-east-1:123456789012:key/k: cannot reach 127.0.0.1:9")
    assert "\n" not in str(e.value)
    with pytest.raises(signing.SigningError, match="cannot read the public key of the signing key arn:aws:kms:"):
        image_signature.sign(props, lambda p: (refused, b"not a key", lambda url: None))
