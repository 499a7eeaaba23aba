"""An image digest signed by a KMS key, stored beside the image as cosign stores it, so standard tools verify it.

The signature is cosign's (sigstore/cosign `specs/SIGNATURE_SPEC.md`), made without cosign:

- the payload is a simple-signing document naming the repository and the digest (`payload`);
- it is signed with ECDSA P-256 over SHA-256 by a key that never leaves the cloud's KMS: AWS KMS
  `Sign` (`aws_kms_signer`) or Cloud KMS `asymmetricSign` (`gcp_kms_signer`); both give an ASN.1 DER
  signature over the payload's sha256, which is what cosign and containers/image verify;
- it is stored as an OCI artifact in the image's own repository, tagged `sha256-<hex>.sig` after the
  signed digest: a manifest whose one layer is the payload (media type
  `application/vnd.dev.cosign.simplesigning.v1+json`) carrying the base64 signature in its annotation
  `dev.cosignproject.cosign/signature` (`signature_manifest`, `push_signature`).

Everything goes over the registry HTTP API v2 (`components/registry.py` names the repository); the
caller gives the `Authorization` header its registry wants (ECR's token, an access token), none for
the tests' registry on the loopback address. `fetch_signatures` and `verify` read it back, as a machine
does before `docker run` (userdata/bootstrap.sh does the same with curl and openssl).
"""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from components import registry

PAYLOAD_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
PAYLOAD_KIND = "cosign container image signature"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
TIMEOUT_S = 10.0

Signer = Callable[[bytes], bytes]
"""Signs a payload: its bytes in, the DER-encoded ECDSA P-256 signature over their sha256 out."""


class SigningError(Exception):
    """A signature could not be made, stored or read: the message says why (one line)."""


def signature_tag(digest: str) -> str:
    """The tag cosign gives the signatures of `digest` (`sha256:<hex>` -> `sha256-<hex>.sig`)."""
    if not registry.DIGEST_RE.fullmatch(digest):
        raise SigningError(f"{digest!r} is not a sha256 digest")
    return digest.replace(":", "-") + ".sig"


def payload(repository: str, digest: str) -> bytes:
    """cosign's simple-signing payload for `repository@digest`, byte for byte as cosign writes it."""
    signature_tag(digest)
    doc = {"critical": {"identity": {"docker-reference": repository},
                        "image": {"docker-manifest-digest": digest},
                        "type": PAYLOAD_KIND},
           "optional": None}
    return json.dumps(doc, separators=(",", ":")).encode()


def aws_kms_signer(kms, key_id: str) -> Signer:
    """A Signer by the AWS KMS key `key_id` (ECC_NIST_P256, SIGN_VERIFY): `Sign` of the payload itself
    (MessageType RAW: KMS hashes it with SHA-256; a payload is a few hundred bytes, under RAW's 4096)."""
    def sign(data: bytes) -> bytes:
        if len(data) > 4096:
            raise SigningError(f"a payload of {len(data)} bytes is over AWS KMS's 4096 for a RAW message")
        answer = kms.sign(KeyId=key_id, Message=data, MessageType="RAW", SigningAlgorithm="ECDSA_SHA_256")
        return answer["Signature"]
    return sign


def gcp_kms_signer(kms, key_version: str) -> Signer:
    """A Signer by the Cloud KMS key version `key_version` (EC_SIGN_P256_SHA256), through the discovery
    client of `cloudkms` v1: `asymmetricSign` of the payload's sha256, its CRC32C checked both ways."""
    import google_crc32c

    def sign(data: bytes) -> bytes:
        digest = hashlib.sha256(data).digest()
        body = {"digest": {"sha256": base64.b64encode(digest).decode()},
                "digestCrc32c": str(google_crc32c.value(digest))}
        answer = (kms.projects().locations().keyRings().cryptoKeys().cryptoKeyVersions()
                  .asymmetricSign(name=key_version, body=body).execute())
        if not answer.get("verifiedDigestCrc32c") or answer.get("name") != key_version:
            raise SigningError(f"Cloud KMS did not confirm the digest it signed with {key_version}")
        signature = base64.b64decode(answer["signature"])
        if int(answer.get("signatureCrc32c", -1)) != google_crc32c.value(signature):
            raise SigningError(f"the signature Cloud KMS sent for {key_version} was damaged on the way")
        return signature
    return sign


def _blob(data: bytes) -> dict:
    return {"digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}


def signature_manifest(body: bytes, signature: bytes) -> tuple[bytes, bytes, dict]:
    """(config bytes, the manifest, its blobs by digest) of the artifact cosign stores for one signature:
    `body` the payload, `signature` its DER signature (stored in base64)."""
    layer = {"mediaType": PAYLOAD_TYPE, **_blob(body),
             "annotations": {SIGNATURE_ANNOTATION: base64.b64encode(signature).decode()}}
    # cosign's own config for a signature image: no platform, one layer (the payload).
    config = json.dumps({"architecture": "", "config": {}, "created": "0001-01-01T00:00:00Z",
                         "history": [{"created": "0001-01-01T00:00:00Z"}], "os": "",
                         "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]}},
                        separators=(",", ":")).encode()
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, **_blob(config)}, "layers": [layer]}
    raw = json.dumps(manifest, separators=(",", ":")).encode()
    return config, raw, {_blob(config)["digest"]: config, layer["digest"]: body}


@dataclass(frozen=True)
class Signed:
    """One signature read back: the payload and its DER signature."""

    payload: bytes
    signature: bytes


def _call(method: str, url: str, auth: str | None, data: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    # Only the registry's URLs (registry.Where.base, and the upload Location it answers) reach here.
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})  # noqa: S310
    if auth:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310 (the registry's URLs)
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read()
    except (urllib.error.URLError, OSError) as e:
        raise SigningError(f"cannot reach {url.split('/')[2]}: {getattr(e, 'reason', e)}") from e


def push_signature(repository: str, digest: str, signer: Signer, *, auth: str | None = None) -> str:
    """Sign `repository@digest` with `signer` and store the signature at its `.sig` tag; returns the
    signature manifest's digest. `auth` is the `Authorization` header the registry wants, if any."""
    loc = registry.where(repository)
    body = payload(repository, digest)
    config, raw, blobs = signature_manifest(body, signer(body))
    for blob_digest, data in blobs.items():
        status, _, _ = _call("HEAD", f"{loc.base}/blobs/{blob_digest}", auth)
        if status == 200:
            continue
        status, headers, text = _call("POST", f"{loc.base}/blobs/uploads/", auth)
        location = {k.lower(): v for k, v in headers.items()}.get("location", "")
        if status != 202 or not location:
            raise SigningError(f"{loc.host} refused an upload to {loc.name} (HTTP {status}): {text[:200]!r}")
        if location.startswith("/"):
            location = loc.base.split("/v2/", 1)[0] + location
        sep = "&" if "?" in location else "?"
        status, _, text = _call("PUT", f"{location}{sep}digest={blob_digest}", auth, data,
                                {"Content-Type": "application/octet-stream"})
        if status != 201:
            raise SigningError(f"{loc.host} refused blob {blob_digest} in {loc.name} (HTTP {status}): {text[:200]!r}")
    status, _, text = _call("PUT", f"{loc.base}/manifests/{signature_tag(digest)}", auth, raw,
                            {"Content-Type": OCI_MANIFEST})
    if status != 201:
        raise SigningError(f"{loc.host} refused the signature of {digest} in {loc.name} (HTTP {status}): "
                           f"{text[:200]!r}")
    return _blob(raw)["digest"]


def fetch_signatures(repository: str, digest: str, *, auth: str | None = None) -> list[Signed]:
    """The signatures stored for `repository@digest` (none when its `.sig` tag does not exist)."""
    loc = registry.where(repository)
    status, _, raw = _call("GET", f"{loc.base}/manifests/{signature_tag(digest)}", auth,
                           headers={"Accept": OCI_MANIFEST})
    if status == 404:
        return []
    if status != 200:
        raise SigningError(f"{loc.host} answered HTTP {status} for the signature of {digest} in {loc.name}")
    found = []
    for layer in json.loads(raw).get("layers", []):
        note = (layer.get("annotations") or {}).get(SIGNATURE_ANNOTATION)
        if layer.get("mediaType") != PAYLOAD_TYPE or not note:
            continue
        status, _, body = _call("GET", f"{loc.base}/blobs/{layer['digest']}", auth)
        if status != 200 or _blob(body)["digest"] != layer["digest"]:
            raise SigningError(f"{loc.host} gave no intact payload {layer['digest']} in {loc.name} (HTTP {status})")
        found.append(Signed(body, base64.b64decode(note)))
    return found


def verify(public_key_pem: bytes, repository: str, digest: str, signed: Signed) -> None:
    """Raise SigningError unless `signed` is a signature of `repository@digest` by the key: the payload
    names that digest (and repository), and the ECDSA P-256 signature over it verifies."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        doc = json.loads(signed.payload)
        critical = doc["critical"]
        said = critical["image"]["docker-manifest-digest"]
        kind, ref = critical["type"], critical["identity"]["docker-reference"]
    except (ValueError, KeyError, TypeError) as e:
        raise SigningError(f"the signature's payload is not cosign's simple signing: {e}") from e
    if kind != PAYLOAD_KIND:
        raise SigningError(f"the signature's payload is of type {kind!r}, not {PAYLOAD_KIND!r}")
    if said != digest:
        raise SigningError(f"the signature is of {said}, not of {digest}")
    if ref != repository:
        raise SigningError(f"the signature is for {ref}, not {repository}")
    key = serialization.load_pem_public_key(public_key_pem)
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise SigningError("the public key is not an ECDSA P-256 key")
    try:
        key.verify(signed.signature, signed.payload, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as e:
        raise SigningError(f"the signature of {digest} does not verify with the stack's public key") from e


def public_key_pem(der: bytes) -> bytes:
    """The PEM of a SubjectPublicKeyInfo in DER (what AWS KMS `GetPublicKey` returns)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_der_public_key(der)
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
