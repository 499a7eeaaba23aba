"""The image and secret rules: a pinned image in every machine's user data, no credentials in any input."""

from __future__ import annotations

import base64
import binascii
import gzip
import re
from collections.abc import Iterable, Mapping
from typing import Any

from components import config_shared
from policy.rules import base
from policy.rules.base import Context, Resource, Violation
from policy.rules.machines import GCE_TEMPLATES, LAUNCH_TEMPLATES

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def image_problem(ref: str) -> str | None:
    """Why an image reference is not pinned, or None when it is (repo:tag or repo@sha256:…)."""
    if "@" in ref:
        digest = ref.rsplit("@", 1)[1]
        return None if _DIGEST.fullmatch(digest) else f"digest {digest!r} is not sha256:<64 hex>"
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return "no tag or digest (docker would pull latest); pin a tag such as 2.21.0-gpu"
    tag = last.rsplit(":", 1)[1]
    if not _TAG.fullmatch(tag):
        return f"tag {tag!r} is not a docker tag"
    if "latest" in tag.lower():
        return f"tag {tag!r} moves under a running job; pin a version tag or a digest"
    return None


def user_data_texts(resources: list[Resource]) -> list[tuple[Resource, str]]:
    """The user data each machine template boots with, decoded (launch templates hold base64, maybe gzipped)."""
    out: list[tuple[Resource, str]] = []
    for lt in base.of_type(resources, *LAUNCH_TEMPLATES, "aws:ec2/instance:Instance"):
        ud = base.get(lt, "userData")
        if isinstance(ud, str) and base.known(ud):
            try:
                # Base64 wrapped over lines (MIME's 76 columns, `base64` without -w0) is base64 too;
                # text, such as a shell script, has characters base64 has not and stays text.
                raw = base64.b64decode("".join(ud.split()), validate=True)
                # cloud-init takes gzipped user data (EC2's 16 KiB limit makes it necessary)
                text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8")
            except (binascii.Error, ValueError):
                text = ud
            out.append((lt, text))
    for t in base.of_type(resources, *GCE_TEMPLATES):
        for k in ("user-data", "startup-script"):
            ud = base.get(t, f"metadata.{k}")
            if isinstance(ud, str) and base.known(ud):
                out.append((t, ud))
        ud = base.get(t, "metadataStartupScript")
        if isinstance(ud, str) and base.known(ud):
            out.append((t, ud))
    return out


_IMAGE_LINE = re.compile(r"^\s*TRAINSTACK_IMAGE=['\"]?([^'\"\s]*)['\"]?\s*$", re.M)


def image_pinned(resources: list[Resource], ctx: Context) -> list[Violation]:
    """The image every machine runs (TRAINSTACK_IMAGE in its user data's env file) is pinned
    by its sha256 digest: a tag (`latest` above all) can move under a running job."""
    out: list[Violation] = []
    for r, text in user_data_texts(resources):
        refs = _IMAGE_LINE.findall(text)
        if not refs:
            out.append(Violation("image-pinned", r["name"], "user data sets no TRAINSTACK_IMAGE; render it with components.userdata"))
        for ref in refs:
            problem = image_problem(ref) if ref else "empty image reference"
            if not problem and "@" not in ref:
                # A tag is a name the registry can move; the machine refuses one (userdata/bootstrap.sh).
                problem = "pinned by tag only; a machine runs its image by digest (pulumi up resolves the tag: docs/images.md)"
            if problem:
                out.append(Violation("image-pinned", r["name"], f"TRAINSTACK_IMAGE={ref}: {problem}"))
    for repo in base.of_type(resources, "aws:ecr/repository:Repository"):
        if base.known(base.get(repo, "imageTagMutability")) and base.get(repo, "imageTagMutability") != "IMMUTABLE":
            out.append(Violation("image-pinned", repo["name"], "imageTagMutability is not IMMUTABLE; a pushed tag could be replaced"))
    return out


_KEY_LINE = re.compile(r"^\s*TRAINSTACK_IMAGE_PUBLIC_KEY=['\"]?([A-Za-z0-9+/]+=*)['\"]?\s*$", re.M)
# The keys a stack signs the image it builds with (components/aws/signing_key.py, components/gcp/signing_key.py).
SIGNING_KEYS = ("aws:kms/key:Key", "gcp:kms/cryptoKey:CryptoKey")


def image_verified(resources: list[Resource], ctx: Context) -> list[Violation]:
    """In a stack that signs its image (a KMS signing key), every machine's user data holds the public key it
    verifies the signature with before `docker run` (TRAINSTACK_IMAGE_PUBLIC_KEY): without it the machine would
    run the image unverified."""
    keys = [k["name"] for k in base.of_type(resources, *SIGNING_KEYS)]
    if not keys:
        return []
    return [Violation("image-verified", r["name"], f"the stack signs its image with {keys[0]}, and this user data "
                      "sets no TRAINSTACK_IMAGE_PUBLIC_KEY: its machines would run the image unverified")
            for r, text in user_data_texts(resources) if not _KEY_LINE.search(text)]


# The patterns are shared with the config checks (components.settings): one definition.
SECRET_PATTERNS = config_shared.SECRET_PATTERNS
secret_kind = config_shared.secret_kind


def _strings(value: Any, path: str = "") -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")


def no_secrets(resources: list[Resource], ctx: Context) -> list[Violation]:
    """No credential in user data or any other input (AWS keys, private keys, service account
    JSON): instances read user data unauthenticated from the metadata service, and inputs land
    in the state file. The machines get credentials from their role / service account."""
    out: list[Violation] = []
    for r, text in user_data_texts(resources):
        kind = secret_kind(text)
        if kind:
            out.append(Violation("no-secrets", r["name"], f"user data holds {kind}; the machine's role gives it credentials"))
    for r in resources:
        for path, text in _strings(base.inputs_of(r)):
            if path == "userData":
                continue
            kind = secret_kind(text)
            if kind:
                out.append(Violation("no-secrets", r["name"], f"input {path} holds {kind}; remove it"))
    return out
