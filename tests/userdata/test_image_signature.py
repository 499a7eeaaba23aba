"""A machine runs a signed image only with a signature over its digest by the stack's key, read from the
real registry (Debian's docker-registry, one per test worker) as cosign stores it (components/signing.py).

`bootstrap.sh`'s `image` step with a shell `docker` that records its calls: signed by the key goes on to
the pull; unsigned, a signature of another digest, or one by another key is each a verdict with its
reason in `failure-reason`, and docker is never called (no pull, no run).
"""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.request
import uuid

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from components import signing
from tests.fixtures.oci_images import oci_layout, push
from tests.userdata.helpers import group_size, s3_keys
from tests.userdata.script_functions import run_script
from tests.userdata.test_image_digest import DOCKER


def _signer(key: ec.EllipticCurvePrivateKey) -> signing.Signer:
    return lambda data: key.sign(data, ec.ECDSA(hashes.SHA256()))


def _public(key: ec.EllipticCurvePrivateKey) -> str:
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(der).decode()


def _pushed(tmp_path, repo: str, text: str) -> str:
    layout = tmp_path / f"layout-{text}"
    digest = oci_layout(layout, text, text=text)
    push(layout, text, f"{repo}:{text}")
    return digest


def _copy_signature(repo: str, source: str, target: str) -> None:
    """Store `source`'s signature manifest at `target`'s signature tag, as one who swaps images would."""
    base = signing.registry.where(repo).base
    req = urllib.request.Request(f"{base}/manifests/{signing.signature_tag(source)}",
                                 headers={"Accept": signing.OCI_MANIFEST})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (the tests' registry)
        raw = resp.read()
    put = urllib.request.Request(f"{base}/manifests/{signing.signature_tag(target)}", data=raw, method="PUT",
                                 headers={"Content-Type": signing.OCI_MANIFEST})
    urllib.request.urlopen(put, timeout=10).close()  # noqa: S310


@pytest.fixture
def images(tmp_path, oci_registry):
    """A repository with a signed image `a` and an unsigned `b`, and the stack's key."""
    repo = f"{oci_registry}/t/{uuid.uuid4().hex[:12]}"
    key = ec.generate_private_key(ec.SECP256R1())
    a, b = _pushed(tmp_path, repo, "a"), _pushed(tmp_path, repo, "b")
    signing.push_signature(repo, a, _signer(key))
    return repo, a, b, key


def _image(tmp_path, ref: str, public: str):
    ran = run_script(tmp_path, "bootstrap.sh", DOCKER + "image; record ready",
                     env=f"TRAINSTACK_IMAGE={ref}\nTRAINSTACK_IMAGE_PUBLIC_KEY={public}\n",
                     extra_env={"PULLED": ref})
    reason = tmp_path / "root/run/trainstack/failure-reason"
    return ran, reason.read_text().strip() if reason.exists() else ""


def test_an_image_signed_by_the_stacks_key_goes_on_to_its_pull(tmp_path, images):
    repo, a, _, key = images
    ran, reason = _image(tmp_path, f"{repo}@{a}", _public(key))
    assert ran.rc == 0, ran.log
    assert reason == "" and ran.lines[-1] == "ready"
    assert f"docker pull -q {repo}@{a}" in ran.starting("docker")
    assert f"image {repo}@{a} signed by the stack's key" in ran.log


def _refused(tmp_path, ref: str, public: str) -> str:
    ran, reason = _image(tmp_path, ref, public)
    assert ran.rc != 0
    assert ran.starting("docker") == [] and "ready" not in ran.lines, ran.log
    assert not (tmp_path / "root/run/trainstack/image.ready").exists()
    return reason


def test_an_unsigned_image_is_a_verdict_and_never_pulled(tmp_path, images):
    repo, _, b, key = images
    assert _refused(tmp_path, f"{repo}@{b}", _public(key)) == (
        f"the image {repo}@{b} has no signature ({b.replace(':', '-')}.sig): refusing to run it")


def test_a_signature_by_another_key_is_a_verdict_and_never_pulled(tmp_path, images):
    repo, a, _, _ = images
    other = _public(ec.generate_private_key(ec.SECP256R1()))
    named = hashlib.sha256(base64.b64decode(other)).hexdigest()[:16]
    assert _refused(tmp_path, f"{repo}@{a}", other) == (
        f"the signature of {repo}@{a} does not verify with the stack's public key (TRAINSTACK_IMAGE_PUBLIC_KEY, "
        f"sha256 {named}): refusing to run it")


def test_another_images_signature_at_the_digests_tag_is_a_verdict_and_never_pulled(tmp_path, images):
    repo, a, b, key = images
    _copy_signature(repo, a, b)
    assert _refused(tmp_path, f"{repo}@{b}", _public(key)) == (
        f"the signature of {repo}@{b} is of {a} in {repo}, not of {b} in {repo}: refusing to run it")


def test_a_signature_manifest_without_cosigns_layer_is_a_verdict(tmp_path, images):
    repo, a, b, key = images
    base = signing.registry.where(repo).base
    with urllib.request.urlopen(urllib.request.Request(  # noqa: S310 (the tests' registry)
            f"{base}/manifests/{signing.signature_tag(a)}", headers={"Accept": signing.OCI_MANIFEST})) as resp:
        manifest = json.loads(resp.read())
    manifest["layers"][0]["annotations"] = {}
    urllib.request.urlopen(urllib.request.Request(  # noqa: S310
        f"{base}/manifests/{signing.signature_tag(b)}", data=json.dumps(manifest).encode(), method="PUT",
        headers={"Content-Type": signing.OCI_MANIFEST}), timeout=10).close()
    assert _refused(tmp_path, f"{repo}@{b}", _public(key)) == (
        f"the signature manifest of {repo}@{b} holds no cosign signature: refusing to run it")


def test_the_registry_credential_reaches_curl_in_a_file_never_on_its_command_line(tmp_path, images):
    repo, a, _, key = images
    body = ('registry_auth() { printf "Authorization: Bearer s3cret-t0ken"; }\n'
            'curl() { record "curl $*"; for f in "$@"; do [[ "$f" != @* ]] || record "header $(cat "${f#@}")"; done;'
            ' command curl "$@"; }\n')
    ran = run_script(tmp_path, "bootstrap.sh", DOCKER + body + "image; record ready",
                     env=f"TRAINSTACK_IMAGE={repo}@{a}\nTRAINSTACK_IMAGE_PUBLIC_KEY={_public(key)}\n",
                     extra_env={"PULLED": f"{repo}@{a}"})
    assert ran.rc == 0, ran.log
    curls = ran.starting("curl")
    assert len(curls) == 2 and not [c for c in curls if "s3cret" in c], curls
    assert ran.starting("header") == ["header Authorization: Bearer s3cret-t0ken"] * 2
    assert not list((tmp_path / "root/run/trainstack").glob(".sig.*/*.auth"))


def test_without_a_public_key_the_registry_is_not_asked(tmp_path):
    # An image the stack does not sign (a public one, pinned by digest) is held by its digest alone.
    ref = "127.0.0.1:9/t/x@sha256:" + "ab" * 32
    ran, reason = _image(tmp_path, ref, "")
    assert ran.rc == 0, ran.log
    assert reason == "" and "signed by the stack's key" not in ran.log


@pytest.mark.slow
@pytest.mark.parametrize("signed_by_stack", [True, False])
def test_the_sandbox_machine_reads_the_signature_from_the_registry_and_runs_only_a_signed_image(
        sandbox_factory, s3_run, group, images, signed_by_stack):
    repo, a, _, key = images
    public = _public(key if signed_by_stack else ec.generate_private_key(ec.SECP256R1()))
    box = sandbox_factory(env_overrides={"TRAINSTACK_IMAGE": f"{repo}@{a}", "TRAINSTACK_IMAGE_PUBLIC_KEY": public})
    assert box.boot().wait(timeout=240) == 0, box.journal()
    objects = s3_keys(s3_run)
    runs = [argv for argv in box.argvs("docker") if argv[:1] == ["run"] and "trainer" in argv]
    if signed_by_stack:
        assert "COMPLETE" in objects and "FAILED" not in objects, sorted(objects)
        assert [argv for argv in box.argvs("docker") if argv[:1] == ["pull"]] == [["pull", "-q", f"{repo}@{a}"]]
        assert len(runs) == 1 and runs[0][-4:] == [f"{repo}@{a}", "python", "-m", "trainer"]
    else:
        assert "FAILED" in objects and "COMPLETE" not in objects, sorted(objects)
        assert objects["FAILED"].decode().find(
            f"the signature of {repo}@{a} does not verify with the stack's public key") >= 0, objects["FAILED"]
        assert not [argv for argv in box.argvs("docker") if argv[:1] in (["pull"], ["run"])]
    assert group_size(s3_run, group) == (0, 0, 0)


def test_a_digest_signed_by_the_stacks_kms_key_at_pulumi_up_is_what_the_machine_accepts(tmp_path, images):
    """The chain end to end: the key as the stack declares it, made in moto's KMS; ImageSignature's step of
    `pulumi up` signs the digest in the real registry and hands on the public key; the machine, given that key
    as its user data would, verifies the signature and goes on to the pull. The image signed by the other key
    (the fixture's) is refused with the KMS key."""
    import boto3
    from moto import mock_aws

    from components import image_signature
    from components.aws.signing_key import KEY_SPEC, KEY_USAGE, key_policy

    repo, _, b, _ = images
    with mock_aws():
        kms = boto3.client("kms", region_name="us-east-1", aws_access_key_id="testing",
                           aws_secret_access_key="testing")  # noqa: S106 (moto's)
        arn = kms.create_key(KeySpec=KEY_SPEC, KeyUsage=KEY_USAGE, Policy=key_policy(
            partition="aws", account_id="123456789012", signer_arn="arn:aws:iam::123456789012:user/d"))["KeyMetadata"]["Arn"]
        props = {"cloud": "aws", "key": arn, "key_region": "us-east-1", "repository_urls": [repo], "digest": b}
        public = image_signature.sign(props, lambda p: (signing.aws_kms_signer(kms, arn),
                                                        kms.get_public_key(KeyId=arn)["PublicKey"], lambda url: None))
    ran, reason = _image(tmp_path / "b", f"{repo}@{b}", public)
    assert ran.rc == 0 and reason == "", ran.log
    assert f"docker pull -q {repo}@{b}" in ran.starting("docker")
    _, a, _, _ = images
    assert _refused(tmp_path / "a", f"{repo}@{a}", public).startswith(
        f"the signature of {repo}@{a} does not verify with the stack's public key (TRAINSTACK_IMAGE_PUBLIC_KEY")
