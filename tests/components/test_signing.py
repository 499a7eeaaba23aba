"""A digest signed by a KMS key (moto's AWS KMS; Cloud KMS's discovery client on HttpMockSequence), stored
as cosign stores it in a real OCI registry (Debian's docker-registry, one per test worker), read back and
verified with `cryptography` as cosign's spec reads it. (Debian's skopeo 1.9.3 cannot judge it: its
`sigstoreSigned` policy answers "Debian-local change: sigstore disabled".)"""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.request
import uuid

import boto3
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from googleapiclient.http import HttpMockSequence
from moto import mock_aws

from components import signing
from tests.fixtures.oci_images import oci_layout, push

DIGEST = "sha256:" + "a" * 64


@pytest.fixture
def kms():
    with mock_aws():
        client = boto3.client("kms", region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing")  # noqa: S106 (moto's)
        yield client


def _key(kms) -> tuple[str, bytes]:
    """A new ECC_NIST_P256 signing key in moto's KMS: (its id, its public key's PEM)."""
    key_id = kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["KeyId"]
    return key_id, signing.public_key_pem(kms.get_public_key(KeyId=key_id)["PublicKey"])


def _image(tmp_path, oci_registry) -> tuple[str, str]:
    repo = f"{oci_registry}/t/{uuid.uuid4().hex[:12]}"
    digest = oci_layout(tmp_path / "layout", "v1", text=repo)
    push(tmp_path / "layout", "v1", f"{repo}:v1")
    return repo, digest


def test_the_payload_is_cosigns_simple_signing_document_byte_for_byte():
    assert signing.payload("reg.example/a/b", DIGEST) == (
        b'{"critical":{"identity":{"docker-reference":"reg.example/a/b"},"image":{"docker-manifest-digest":"'
        + DIGEST.encode() + b'"},"type":"cosign container image signature"},"optional":null}')
    assert signing.signature_tag(DIGEST) == "sha256-" + "a" * 64 + ".sig"
    with pytest.raises(signing.SigningError, match="not a sha256 digest"):
        signing.payload("reg.example/a/b", "latest")


def test_a_kms_signature_is_stored_as_cosigns_artifact_and_verifies(tmp_path, oci_registry, kms):
    repo, digest = _image(tmp_path, oci_registry)
    key_id, pem = _key(kms)
    signing.push_signature(repo, digest, signing.aws_kms_signer(kms, key_id))

    loc = signing.registry.where(repo)
    req = urllib.request.Request(f"{loc.base}/manifests/{signing.signature_tag(digest)}",
                                 headers={"Accept": signing.OCI_MANIFEST})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (the tests' registry)
        manifest = json.loads(resp.read())
    [layer] = manifest["layers"]
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    with urllib.request.urlopen(f"{loc.base}/blobs/{layer['digest']}", timeout=10) as resp:  # noqa: S310
        body = resp.read()
    assert body == signing.payload(repo, digest)
    # Verified here with cryptography alone, as cosign's spec reads it: base64 DER ECDSA over the payload.
    sig = base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"])
    serialization.load_pem_public_key(pem).verify(sig, body, ec.ECDSA(hashes.SHA256()))

    [signed] = signing.fetch_signatures(repo, digest)
    signing.verify(pem, repo, digest, signed)


def test_another_keys_signature_another_digest_and_no_signature_are_each_refused(tmp_path, oci_registry, kms):
    repo, digest = _image(tmp_path, oci_registry)
    key_id, _ = _key(kms)
    _, other_pem = _key(kms)
    assert signing.fetch_signatures(repo, digest) == []
    signing.push_signature(repo, digest, signing.aws_kms_signer(kms, key_id))
    [signed] = signing.fetch_signatures(repo, digest)
    with pytest.raises(signing.SigningError, match="does not verify with the stack's public key"):
        signing.verify(other_pem, repo, digest, signed)
    with pytest.raises(signing.SigningError, match=f"the signature is of {digest}, not of sha256:b{{64}}$"):
        signing.verify(other_pem, repo, "sha256:" + "b" * 64, signed)


def test_cloud_kms_signs_the_payloads_sha256_and_its_crc32c_is_checked():
    import google_crc32c
    from googleapiclient import discovery
    from googleapiclient.discovery_cache import get_static_doc

    key = ec.generate_private_key(ec.SECP256R1())
    name = "projects/p/locations/global/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1"
    body = signing.payload("reg.example/a/b", DIGEST)
    sig = key.sign(body, ec.ECDSA(hashes.SHA256()))
    answers = []

    class _Http(HttpMockSequence):
        def request(self, uri, method="GET", body=None, headers=None, **kw):
            answers.append((uri, method, json.loads(body)))
            return super().request(uri, method, body, headers, **kw)

    ok = {"name": name, "signature": base64.b64encode(sig).decode(), "verifiedDigestCrc32c": True,
          "signatureCrc32c": str(google_crc32c.value(sig))}
    http = _Http([({"status": "200"}, json.dumps(ok)),
                  ({"status": "200"}, json.dumps({**ok, "signatureCrc32c": "1"}))])
    kms = discovery.build_from_document(get_static_doc("cloudkms", "v1"), http=http)
    signer = signing.gcp_kms_signer(kms, name)
    assert signer(body) == sig
    uri, method, sent = answers[0]
    assert method == "POST" and uri.split("?")[0].endswith(f"/v1/{name}:asymmetricSign")
    assert base64.b64decode(sent["digest"]["sha256"]) == hashlib.sha256(body).digest()
    with pytest.raises(signing.SigningError, match="damaged on the way"):
        signer(body)
