"""What both clouds' fake answers share: plain-JSON inputs, stable fake hex, the built image's digest."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import pulumi

DOCKER_IMAGE = "docker-build:index:Image"
RANDOM_ID = "random:index/randomId:RandomId"


def jsonable(value: Any) -> Any:
    """Inputs as plain JSON: assets become {"fileAsset": path} etc., whole floats become ints."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        # The wire format has only doubles; 200.0 GiB is the 200 the program wrote.
        return int(value) if math.isfinite(value) and value.is_integer() else value
    if isinstance(value, pulumi.FileAsset):
        return {"fileAsset": str(value.path)}
    if isinstance(value, pulumi.StringAsset):
        return {"stringAsset": value.text}
    if isinstance(value, pulumi.FileArchive):
        return {"fileArchive": str(value.path)}
    if isinstance(value, pulumi.AssetArchive):
        return {"assetArchive": {str(k): jsonable(v) for k, v in value.assets.items()}}
    if isinstance(value, pulumi.Resource):
        return {"resource": type(value).__name__}
    return str(value)


def urn_name(urn: str) -> str:
    """The resource name at the end of a URN (the URN itself when it is not one)."""
    return urn.split("::")[3] if urn.count("::") >= 3 else urn


def fake_hex(*parts: str, n: int = 17) -> str:
    """n hex digits that depend only on `parts`: the same stack gives the same fake ids."""
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:n]


def docker_image(name: str, inputs: dict, h: str) -> tuple[str, dict]:
    """A pushed image: its digest follows from what was built (tags, context, Dockerfile)."""
    digest = "sha256:" + hashlib.sha256(json.dumps(jsonable(inputs), sort_keys=True).encode()).hexdigest()
    tags = list(inputs.get("tags") or [])
    return digest, {"digest": digest, "ref": f"{tags[0]}@{digest}" if tags else "", "contextHash": h}


DYNAMIC = "pulumi-python:dynamic:Resource"


def signing_public_key(h: str) -> str:
    """An image signature's public key (base64 DER of an EC P-256 SubjectPublicKeyInfo): a real key's shape, made
    from the resource's fake hex, whose private half nobody holds for signing. Under the mocks no KMS is asked."""
    import base64

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.derive_private_key(int(h, 16) or 1, ec.SECP256R1()).public_key()
    return base64.b64encode(key.public_bytes(serialization.Encoding.DER,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)).decode()


def random_id(inputs: dict, h: str) -> tuple[str, dict]:
    """A RandomId: `byteLength` bytes from the resource's fake hex, in the provider's encodings."""
    raw = bytes.fromhex((h * 8)[: 2 * int(inputs.get("byteLength") or 8)])
    return random_id_outputs(raw)


def random_id_outputs(raw: bytes) -> tuple[str, dict]:
    """The id and outputs the random provider gives a RandomId of these bytes (id: base64url, unpadded)."""
    import base64

    b64_url = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return b64_url, {"hex": raw.hex(), "b64Url": b64_url, "b64Std": base64.b64encode(raw).decode(),
                     "dec": str(int.from_bytes(raw, "big"))}
