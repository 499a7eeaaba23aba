"""The bucket rules: not public, encrypted, versioned, TLS only, kept on destroy; and what
`pulumi destroy` must release.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy import iam
from policy.rules import base
from policy.rules.base import UNKNOWN, Context, Resource, Violation

S3_BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
GCS_BUCKETS = ("gcp:storage/bucket:Bucket",)
PUBLIC_ACLS = ("public-read", "public-read-write", "authenticated-read")
PUBLIC_MEMBERS = ("allUsers", "allAuthenticatedUsers")


def _bucket_children(resources: list[Resource], bucket: Resource, *types: str) -> list[Resource]:
    buckets = base.of_type(resources, *S3_BUCKETS)
    return [c for c in base.of_type(resources, *types) if base.linked(c, bucket, "bucket", ("bucket", "id"), buckets, engine_ids=True)]


def _bucket_policies(resources: list[Resource], bucket: Resource) -> list[dict[str, Any]]:
    docs = [base.json_doc(base.inputs_of(bucket).get("policy"))]
    docs += [base.json_doc(base.inputs_of(p).get("policy")) for p in _bucket_children(resources, bucket, "aws:s3/bucketPolicy:BucketPolicy")]
    return [d for d in docs if isinstance(d, dict)]


def _principal_is_anyone(principal: Any) -> bool:
    if principal == "*":
        return True
    if isinstance(principal, Mapping):
        return any("*" in base.as_list(v) for v in principal.values())
    return False


def bucket_not_public(resources: list[Resource], ctx: Context) -> list[Violation]:
    """S3: all four public access blocks on, no public ACL, no policy allowing anyone. GCS: uniform
    bucket-level access, public access prevention enforced, no allUsers/allAuthenticatedUsers member."""
    out: list[Violation] = []
    flags = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    for b in base.of_type(resources, *S3_BUCKETS):
        blocks = _bucket_children(resources, b, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
        if not blocks:
            out.append(Violation("bucket-not-public", b["name"], "no BucketPublicAccessBlock; add one with all four flags true"))
        for blk in blocks:
            off = [f for f in flags if base.known(base.get(blk, f)) and not base.is_true(base.get(blk, f))]
            if off:
                out.append(Violation("bucket-not-public", blk["name"], f"{', '.join(off)} not true; set all four flags true"))
        acls = [base.inputs_of(b).get("acl")] + [base.inputs_of(a).get("acl") for a in _bucket_children(resources, b, "aws:s3/bucketAcl:BucketAcl", "aws:s3/bucketAclV2:BucketAclV2")]
        for acl in acls:
            if acl in PUBLIC_ACLS:
                out.append(Violation("bucket-not-public", b["name"], f"ACL {acl!r} makes objects public; use private (the default)"))
        for doc in _bucket_policies(resources, b):
            for st in iam.statements(doc):
                if st.get("Effect") == "Allow" and _principal_is_anyone(st.get("Principal")):
                    out.append(Violation("bucket-not-public", b["name"], "bucket policy allows Principal '*'; name the role instead"))
    for b in base.of_type(resources, *GCS_BUCKETS):
        if not base.is_true(base.get(b, "uniformBucketLevelAccess")) and base.known(base.get(b, "uniformBucketLevelAccess")):
            out.append(Violation("bucket-not-public", b["name"], "uniformBucketLevelAccess not true; set it so no object ACL can make data public"))
        pap = base.get(b, "publicAccessPrevention")
        if base.known(pap) and pap != "enforced":
            out.append(Violation("bucket-not-public", b["name"], f"publicAccessPrevention is {pap!r}; set 'enforced'"))
    for m in base.of_type(resources, "gcp:storage/bucketIAMMember:BucketIAMMember", "gcp:storage/bucketIAMBinding:BucketIAMBinding"):
        members = base.as_list(base.get(m, "member")) + base.as_list(base.get(m, "members"))
        public = [x for x in members if x in PUBLIC_MEMBERS]
        if public:
            out.append(Violation("bucket-not-public", m["name"], f"grants {', '.join(public)}; grant the machines' service account only"))
    return out


def bucket_encrypted(resources: list[Resource], ctx: Context) -> list[Violation]:
    """S3 buckets have default server-side encryption configured (SSE-S3 or KMS)."""
    out: list[Violation] = []
    ok_algorithms = ("AES256", "aws:kms", "aws:kms:dsse")
    for b in base.of_type(resources, *S3_BUCKETS):
        algos = [base.get(b, "serverSideEncryptionConfiguration.rule.applyServerSideEncryptionByDefault.sseAlgorithm")]
        for c in _bucket_children(resources, b, "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
                                  "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2"):
            algos += [(base.get({"inputs": rule}, "applyServerSideEncryptionByDefault.sseAlgorithm")) for rule in base.as_list(base.get(c, "rules"))]
        if any(a == UNKNOWN for a in algos):
            continue
        if not any(a in ok_algorithms for a in algos):
            out.append(Violation("bucket-encrypted", b["name"], "no default server-side encryption; add a "
                                 "BucketServerSideEncryptionConfiguration with sseAlgorithm AES256 or aws:kms"))
    return out


def bucket_versioned(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Buckets keep old versions, so an overwritten or deleted checkpoint can be recovered."""
    out: list[Violation] = []
    for b in base.of_type(resources, *S3_BUCKETS):
        states = [("Enabled" if base.is_true(base.get(b, "versioning.enabled")) else None)]
        states += [base.get(v, "versioningConfiguration.status") for v in _bucket_children(
            resources, b, "aws:s3/bucketVersioning:BucketVersioning", "aws:s3/bucketVersioningV2:BucketVersioningV2")]
        if UNKNOWN not in states and "Enabled" not in states:
            out.append(Violation("bucket-versioned", b["name"], "versioning not enabled; add a BucketVersioning with status Enabled"))
    for b in base.of_type(resources, *GCS_BUCKETS):
        if base.known(base.get(b, "versioning.enabled")) and not base.is_true(base.get(b, "versioning.enabled")):
            out.append(Violation("bucket-versioned", b["name"], "versioning.enabled not true; set it"))
    return out


def _denies_plain_http(st: Mapping[str, Any]) -> bool:
    if st.get("Effect") != "Deny" or not _principal_is_anyone(st.get("Principal")):
        return False
    if not {"s3:*", "*"} & set(base.as_list(st.get("Action"))):
        return False
    cond = st.get("Condition") or {}
    secure = (cond.get("Bool") or {}).get("aws:SecureTransport")
    if not any(base.is_false(v) for v in base.as_list(secure)):
        return False
    res = base.as_list(st.get("Resource"))
    return any(str(x).endswith("/*") for x in res) and any(not str(x).endswith("/*") for x in res)


def bucket_tls_only(resources: list[Resource], ctx: Context) -> list[Violation]:
    """The S3 bucket policy denies every request not made over TLS (aws:SecureTransport false),
    on the bucket and its objects. GCS serves HTTPS only, so it has no such rule."""
    out: list[Violation] = []
    for b in base.of_type(resources, *S3_BUCKETS):
        docs = _bucket_policies(resources, b)
        unknown = base.inputs_of(b).get("policy") == UNKNOWN or any(
            base.inputs_of(p).get("policy") == UNKNOWN for p in _bucket_children(resources, b, "aws:s3/bucketPolicy:BucketPolicy"))
        if unknown:
            continue
        if not any(_denies_plain_http(st) for d in docs for st in iam.statements(d)):
            out.append(Violation("bucket-tls-only", b["name"], "no policy statement denies s3:* when aws:SecureTransport is "
                                 "false on the bucket and bucket/*; add one"))
    return out


def bucket_retained(resources: list[Resource], ctx: Context) -> list[Violation]:
    """The bucket survives `pulumi destroy` (retainOnDelete, no forceDestroy) unless storage.keepOnDestroy is false."""
    if not ctx.keep_bucket:
        return []
    out: list[Violation] = []
    for b in base.of_type(resources, *S3_BUCKETS, *GCS_BUCKETS):
        retain = (b.get("options") or {}).get("retainOnDelete", False)
        if base.known(retain) and retain is not True:
            out.append(Violation("bucket-retained", b["name"], "not retainOnDelete; `pulumi destroy` would delete the "
                                 "checkpoints (set storage.keepOnDestroy: false only to mean that)"))
        if base.is_true(base.get(b, "forceDestroy")):
            out.append(Violation("bucket-retained", b["name"], "forceDestroy is true; it empties the bucket on delete"))
    return out


def released_on_destroy(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Everything but the bucket and its own settings goes on `pulumi destroy`: machines, groups,
    schedules, roles and repositories are neither retained nor protected."""
    out: list[Violation] = []
    for r in resources:
        if r.get("type", "").startswith(("aws:s3/", "gcp:storage/", "pulumi:")):
            continue
        opts = r.get("options") or {}
        for flag in ("retainOnDelete", "protect"):
            if opts.get(flag) is True:
                out.append(Violation("released-on-destroy", r["name"], f"has {flag}; `pulumi destroy` must release it "
                                     "(only the bucket is kept)"))
    return out
