"""ImageSignature: a digest that passed the findings gate, signed at `pulumi up` by the stack's KMS key and
stored beside the image in each repository it was pushed to (components/signing.py), as a Pulumi dynamic
resource after ScanGate.

Its outputs are the signed `digest` (what the user data may name) and the key's `public_key` (base64 DER
of its SubjectPublicKeyInfo, `TRAINSTACK_IMAGE_PUBLIC_KEY` on the machines: public, never a secret), read
from the KMS with the same call that proves the key signs (AWS `GetPublicKey`, Cloud KMS `getPublicKey`).
The signature is made again when the digest, the key or the repositories change, in a repository whose
`.sig` tag holds no signature by the key yet (the repositories' tags are immutable: a tag is written once). Like `components/scan_gate.py`, it does nothing under the SDK's mocks.
"""

from __future__ import annotations

import base64
from typing import Any

import pulumi
import pulumi.dynamic


def _aws(props: dict[str, Any]):
    """(signer, public key DER, the Authorization header of each repository) through boto3."""
    import boto3

    from components import signing

    kms = boto3.client("kms", region_name=props["key_region"])
    key = props["key"]
    der = kms.get_public_key(KeyId=key)["PublicKey"]

    def auth(url: str) -> str:
        region = url.split(".dkr.ecr.", 1)[1].split(".amazonaws.com", 1)[0]
        token = boto3.client("ecr", region_name=region).get_authorization_token()
        return "Basic " + token["authorizationData"][0]["authorizationToken"]
    return signing.aws_kms_signer(kms, key), der, auth


def _gcp(props: dict[str, Any]):
    """(signer, public key DER, the Authorization header of each repository) through google-auth."""
    import google.auth
    import google.auth.transport.requests
    from cryptography.hazmat.primitives import serialization
    from googleapiclient import discovery
    from googleapiclient.discovery_cache import get_static_doc

    from components import signing

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    kms = discovery.build_from_document(get_static_doc("cloudkms", "v1"), credentials=credentials)
    versions = kms.projects().locations().keyRings().cryptoKeys().cryptoKeyVersions()
    pem = versions.getPublicKey(name=props["key"]).execute()["pem"].encode()
    der = serialization.load_pem_public_key(pem).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)

    def auth(_url: str) -> str:
        credentials.refresh(google.auth.transport.requests.Request())
        return f"Bearer {credentials.token}"
    return signing.gcp_kms_signer(kms, props["key"]), der, auth


def sign(props: dict[str, Any], clients=None) -> str:
    """Sign props' digest in each of props' repositories; returns the public key (base64 DER).
    `clients(props)` gives (signer, public key DER, auth per repository URL); the cloud's by default."""
    from components import signing

    key, digest = props["key"], props["digest"]
    try:
        signer, der, auth = (clients or {"aws": _aws, "gcp": _gcp}[props["cloud"]])(props)
        pem = signing.public_key_pem(der)
    except Exception as e:  # noqa: BLE001 - the cloud's own error, whatever its kind, said on one line
        raise signing.SigningError(f"cannot read the public key of the signing key {key}: {_one_line(e)}") from e
    for url in props["repository_urls"]:
        try:
            header = auth(url)
            if not _signed(pem, url, digest, header):
                signing.push_signature(url, digest, signer, auth=header)
        except Exception as e:  # noqa: BLE001 - as above
            raise signing.SigningError(f"cannot sign {url}@{digest} with the signing key {key}: {_one_line(e)}") from e
    return base64.b64encode(der).decode()


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _signed(pem: bytes, url: str, digest: str, header: str | None) -> bool:
    """Whether `url@digest` holds a signature by the key already. The repositories' tags are immutable,
    so a `.sig` tag is written once: a second `pulumi up` finds it and signs nothing; one by another
    key (the key was replaced) is refused by the registry, and says so."""
    from components import signing

    for signed in signing.fetch_signatures(url, digest, auth=header):
        try:
            signing.verify(pem, url, digest, signed)
            return True
        except signing.SigningError:
            continue
    return False


class _Signer(pulumi.dynamic.ResourceProvider):
    """Signs on create, and again when the digest, the key or the repositories change."""

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        return pulumi.dynamic.CreateResult(id_=props["digest"], outs={**props, "public_key": sign(props)})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        changed = [k for k in ("digest", "key", "key_region", "repository_urls") if olds.get(k) != news.get(k)]
        return pulumi.dynamic.DiffResult(changes=bool(changed), replaces=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        return pulumi.dynamic.UpdateResult(outs={**news, "public_key": sign(news)})


class ImageSignature(pulumi.dynamic.Resource):
    """`digest`, passed on once signed in every repository, and the signing key's `public_key`."""

    digest: pulumi.Output[str]
    public_key: pulumi.Output[str]

    def __init__(self, name: str, *, cloud: str, key: pulumi.Input[str], key_region: str,
                 repository_urls: list[pulumi.Input[str]], digest: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None):
        """`key`: AWS the KMS key's ARN, GCP the crypto key version's name; `key_region`: AWS the key's
        region (home's)."""
        props = {"cloud": cloud, "key": key, "key_region": key_region, "repository_urls": repository_urls,
                 "digest": digest, "public_key": None}
        super().__init__(_Signer(), name, props, opts)
