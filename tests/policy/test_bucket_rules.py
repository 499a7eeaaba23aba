"""The bucket rules (policy/rules/buckets.py) line by line: each way a bucket can be public,
unencrypted, unversioned, reachable over plain HTTP or lost on destroy, in the words a user reads,
and what passes (a value unknown during preview is not judged)."""

from __future__ import annotations

import json

import pytest

from policy.rules import UNKNOWN, Context, buckets
from tests.policy import resources as R

B = "dev-bucket"
CTX = Context(stack=R.STACK, run_id=R.RUN)


def _lines(rule, res: list[dict], ctx: Context = CTX) -> list[str]:
    return [f"{v.resource}: {v.message}" for v in rule(res, ctx)]


def _inputs(res: list[dict], name: str) -> dict:
    return R.by_name(res, name)["inputs"]


def _child(type_: str, name: str, **inputs) -> dict:
    return {"type": type_, "name": name, "parent": B, "inputs": {"bucket": R.BUCKET, **inputs},
            "options": {"retainOnDelete": True}}


def test_the_clean_stacks_pass_every_bucket_rule():
    for rule in (buckets.bucket_not_public, buckets.bucket_encrypted, buckets.bucket_versioned,
                 buckets.bucket_tls_only, buckets.bucket_retained, buckets.released_on_destroy):
        assert _lines(rule, R.aws_stack()) == [] and _lines(rule, R.gcp_stack()) == [], rule.__name__


# -- bucket-not-public --


def test_a_missing_public_access_block_is_named():
    res = [r for r in R.aws_stack() if r["name"] != "dev-bucket-public-access"]
    assert _lines(buckets.bucket_not_public, res) == [
        "dev-bucket: no BucketPublicAccessBlock; add one with all four flags true"]


def test_each_public_access_flag_off_is_named_and_unknown_ones_wait():
    res = R.aws_stack()
    pab = _inputs(res, "dev-bucket-public-access")
    pab.update(blockPublicAcls=False, ignorePublicAcls="false", blockPublicPolicy="true", restrictPublicBuckets=UNKNOWN)
    assert _lines(buckets.bucket_not_public, res) == [
        "dev-bucket-public-access: blockPublicAcls, ignorePublicAcls not true; set all four flags true"]


@pytest.mark.parametrize("acl", buckets.PUBLIC_ACLS)
def test_a_public_acl_on_the_bucket_or_its_acl_resource_is_named(acl):
    res = R.aws_stack()
    _inputs(res, B)["acl"] = acl
    line = f"dev-bucket: ACL {acl!r} makes objects public; use private (the default)"
    assert _lines(buckets.bucket_not_public, res) == [line]
    res = R.aws_stack()
    res.append(_child("aws:s3/bucketAclV2:BucketAclV2", "dev-bucket-acl", acl=acl))
    assert _lines(buckets.bucket_not_public, res) == [line]
    _inputs(res, "dev-bucket-acl")["acl"] = "private"
    assert _lines(buckets.bucket_not_public, res) == []


@pytest.mark.parametrize(("principal", "public"), [
    ("*", True), ({"AWS": "*"}, True), ({"AWS": ["arn:aws:iam::123456789012:root", "*"]}, True),
    ({"AWS": "arn:aws:iam::123456789012:root"}, False), ({"Service": "ec2.amazonaws.com"}, False), (None, False),
])
def test_a_bucket_policy_allowing_anyone_is_named(principal, public):
    st = {"Effect": "Allow", "Principal": principal, "Action": "s3:GetObject", "Resource": f"{R.BUCKET_ARN}/*"}
    res = R.aws_stack()
    doc = R.bucket_policy()
    doc["Statement"].append(st)
    _inputs(res, "dev-bucket-policy")["policy"] = json.dumps(doc)
    want = ["dev-bucket: bucket policy allows Principal '*'; name the role instead"] if public else []
    assert _lines(buckets.bucket_not_public, res) == want
    # The same statement in the bucket's own policy input.
    res = R.aws_stack()
    _inputs(res, B)["policy"] = {"Statement": [st]}
    assert _lines(buckets.bucket_not_public, res) == want
    # A Deny for anyone is the TLS rule's statement, not a grant.
    res = R.aws_stack()
    _inputs(res, B)["policy"] = {"Statement": [{**st, "Effect": "Deny"}]}
    assert _lines(buckets.bucket_not_public, res) == []


def test_a_gcs_bucket_needs_uniform_access_and_enforced_prevention():
    res = R.gcp_stack()
    _inputs(res, B).update(uniformBucketLevelAccess=False, publicAccessPrevention="inherited")
    assert _lines(buckets.bucket_not_public, res) == [
        "dev-bucket: uniformBucketLevelAccess not true; set it so no object ACL can make data public",
        "dev-bucket: publicAccessPrevention is 'inherited'; set 'enforced'"]
    _inputs(res, B).update(uniformBucketLevelAccess=UNKNOWN, publicAccessPrevention=UNKNOWN)
    assert _lines(buckets.bucket_not_public, res) == []


def test_a_gcs_grant_to_everyone_is_named_with_its_members():
    res = R.gcp_stack()
    res.append({"type": "gcp:storage/bucketIAMBinding:BucketIAMBinding", "name": "dev-bucket-readers", "parent": B,
                "inputs": {"bucket": "trainstack-dev-0123", "role": "roles/storage.objectViewer",
                           "members": ["serviceAccount:x@p.iam.gserviceaccount.com", "allAuthenticatedUsers",
                                       "allUsers"]}, "options": {}})
    assert _lines(buckets.bucket_not_public, res) == [
        "dev-bucket-readers: grants allAuthenticatedUsers, allUsers; grant the machines' service account only"]


# -- bucket-encrypted --

NO_SSE = ("dev-bucket: no default server-side encryption; add a BucketServerSideEncryptionConfiguration with "
          "sseAlgorithm AES256 or aws:kms")


@pytest.mark.parametrize(("algorithm", "ok"), [("AES256", True), ("aws:kms", True), ("aws:kms:dsse", True),
                                               ("none", False), (None, False), (UNKNOWN, True)])
def test_default_encryption_by_any_of_its_resources(algorithm, ok):
    want = [] if ok else [NO_SSE]
    for type_ in ("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
                  "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2"):
        res = [r for r in R.aws_stack() if r["name"] != "dev-bucket-encryption"]
        res.append(_child(type_, "dev-sse", rules=[{"applyServerSideEncryptionByDefault": {"sseAlgorithm": algorithm}}]))
        assert _lines(buckets.bucket_encrypted, res) == want, type_
    # The bucket's own (older) input.
    res = [r for r in R.aws_stack() if r["name"] != "dev-bucket-encryption"]
    _inputs(res, B)["serverSideEncryptionConfiguration"] = {
        "rule": {"applyServerSideEncryptionByDefault": {"sseAlgorithm": algorithm}}}
    assert _lines(buckets.bucket_encrypted, res) == want


# -- bucket-versioned --

NOT_VERSIONED = "dev-bucket: versioning not enabled; add a BucketVersioning with status Enabled"


@pytest.mark.parametrize(("status", "want"), [("Enabled", []), ("Suspended", [NOT_VERSIONED]),
                                              ("Disabled", [NOT_VERSIONED]), (UNKNOWN, [])])
def test_versioning_by_its_resource_of_either_version(status, want):
    for type_ in ("aws:s3/bucketVersioning:BucketVersioning", "aws:s3/bucketVersioningV2:BucketVersioningV2"):
        res = [r for r in R.aws_stack() if r["name"] != "dev-bucket-versioning"]
        res.append(_child(type_, "dev-v", versioningConfiguration={"status": status}))
        assert _lines(buckets.bucket_versioned, res) == want, type_


def test_versioning_by_the_buckets_own_input():
    res = [r for r in R.aws_stack() if r["name"] != "dev-bucket-versioning"]
    assert _lines(buckets.bucket_versioned, res) == [NOT_VERSIONED]
    _inputs(res, B)["versioning"] = {"enabled": "true"}
    assert _lines(buckets.bucket_versioned, res) == []


@pytest.mark.parametrize(("enabled", "want"), [
    (True, []), (UNKNOWN, []), (False, ["dev-bucket: versioning.enabled not true; set it"]),
    (None, ["dev-bucket: versioning.enabled not true; set it"])])
def test_a_gcs_bucket_is_versioned(enabled, want):
    res = R.gcp_stack()
    _inputs(res, B)["versioning"] = {"enabled": enabled}
    assert _lines(buckets.bucket_versioned, res) == want


# -- bucket-tls-only --

NO_TLS = ("dev-bucket: no policy statement denies s3:* when aws:SecureTransport is false on the bucket and bucket/*; "
          "add one")
DENY = R.bucket_policy()["Statement"][0]


@pytest.mark.parametrize(("change", "ok"), [
    ({}, True),
    ({"Action": "*"}, True),
    ({"Action": ["s3:GetObject", "s3:*"]}, True),
    ({"Principal": {"AWS": "*"}}, True),
    ({"Condition": {"Bool": {"aws:SecureTransport": False}}}, True),
    ({"Condition": {"Bool": {"aws:SecureTransport": ["false"]}}}, True),
    ({"Effect": "Allow"}, False),
    ({"Principal": {"AWS": "arn:aws:iam::123456789012:root"}}, False),
    ({"Action": "s3:GetObject"}, False),
    ({"Condition": {"Bool": {"aws:SecureTransport": "true"}}}, False),
    ({"Condition": {"StringEquals": {"aws:SecureTransport": "false"}}}, False),
    ({"Condition": None}, False),
    ({"Resource": R.BUCKET_ARN}, False),
    ({"Resource": [f"{R.BUCKET_ARN}/*"]}, False),
])
def test_the_statement_that_denies_plain_http(change, ok):
    res = R.aws_stack()
    _inputs(res, "dev-bucket-policy")["policy"] = json.dumps({"Statement": [{**DENY, **change}]})
    assert _lines(buckets.bucket_tls_only, res) == ([] if ok else [NO_TLS])


def test_the_tls_statement_may_be_in_the_buckets_own_policy_and_an_unknown_one_waits():
    res = [r for r in R.aws_stack() if r["name"] != "dev-bucket-policy"]
    assert _lines(buckets.bucket_tls_only, res) == [NO_TLS]
    _inputs(res, B)["policy"] = json.dumps(R.bucket_policy())
    assert _lines(buckets.bucket_tls_only, res) == []
    _inputs(res, B)["policy"] = UNKNOWN
    assert _lines(buckets.bucket_tls_only, res) == []
    res = R.aws_stack()
    _inputs(res, "dev-bucket-policy")["policy"] = UNKNOWN
    assert _lines(buckets.bucket_tls_only, res) == []


# -- bucket-retained and released-on-destroy --


@pytest.mark.parametrize("stack", [R.aws_stack, R.gcp_stack])
def test_the_bucket_is_kept_on_destroy_unless_the_stack_says_otherwise(stack):
    res = stack()
    R.by_name(res, B)["options"] = {}
    _inputs(res, B)["forceDestroy"] = "true"
    assert _lines(buckets.bucket_retained, res) == [
        "dev-bucket: not retainOnDelete; `pulumi destroy` would delete the checkpoints (set storage.keepOnDestroy: "
        "false only to mean that)",
        "dev-bucket: forceDestroy is true; it empties the bucket on delete"]
    assert _lines(buckets.bucket_retained, res, Context(keep_bucket=False)) == []
    R.by_name(res, B)["options"] = {"retainOnDelete": UNKNOWN}
    _inputs(res, B)["forceDestroy"] = False
    assert _lines(buckets.bucket_retained, res) == []


def test_everything_but_the_bucket_is_released_on_destroy():
    res = R.aws_stack()
    R.by_name(res, "dev-repo")["options"] = {"protect": True, "retainOnDelete": True}
    R.by_name(res, "dev-group-asg")["options"] = {"protect": "true"}  # only a real true protects
    res.append({"type": "pulumi:providers:aws", "name": "default", "parent": None, "inputs": {},
                "options": {"protect": True}})
    res.append({"type": "gcp:storage/bucketIAMMember:BucketIAMMember", "name": "dev-kept-grant", "parent": B,
                "inputs": {}, "options": {"retainOnDelete": True}})
    assert _lines(buckets.released_on_destroy, res) == [
        "dev-repo: has retainOnDelete; `pulumi destroy` must release it (only the bucket is kept)",
        "dev-repo: has protect; `pulumi destroy` must release it (only the bucket is kept)"]


# -- two buckets in one component: each setting belongs to the bucket it names --


def _two_buckets(ref_a: str, ref_b: str, *, outputs: bool = False) -> list[dict]:
    """Two buckets under one parent, each with its full settings naming it by `ref_*`."""
    res = []
    for name, ref in (("dev-a", ref_a), ("dev-b", ref_b)):
        bucket = {"type": "aws:s3/bucket:Bucket", "name": name, "parent": "dev-data", "options": {"retainOnDelete": True},
                  "inputs": {"bucket": f"trainstack-{name}", "tags": dict(R.TAGS)}}
        if outputs:
            del bucket["inputs"]["bucket"]
            bucket["outputs"] = {"id": ref}
        res.append(bucket)
        arn = f"arn:aws:s3:::{ref}"
        for type_, suffix, inputs in (
            ("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", "pab",
             dict.fromkeys(("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"), True)),
            ("aws:s3/bucketVersioning:BucketVersioning", "versioning", {"versioningConfiguration": {"status": "Enabled"}}),
            ("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration", "sse",
             {"rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}]}),
            ("aws:s3/bucketPolicy:BucketPolicy", "policy", {"policy": json.dumps({"Statement": [
                {**DENY, "Resource": [arn, f"{arn}/*"]}]})}),
        ):
            res.append({"type": type_, "name": f"{name}-{suffix}", "parent": "dev-data", "options": {},
                        "inputs": {"bucket": ref, **inputs}})
    return res


@pytest.mark.parametrize("by", ["name", "engine id"])
def test_two_buckets_in_one_component_each_keep_their_own_settings(by):
    if by == "name":
        res = _two_buckets("trainstack-dev-a", "trainstack-dev-b")
    else:
        res = _two_buckets("dev-a-7f3e", "dev-b-91c2", outputs=True)
    rules = (buckets.bucket_not_public, buckets.bucket_encrypted, buckets.bucket_versioned, buckets.bucket_tls_only)
    assert [line for rule in rules for line in _lines(rule, res)] == []
    # The second bucket's settings go: the first keeps its own and the second is refused.
    res = [r for r in res if not r["name"].startswith("dev-b-")]
    assert [line for rule in rules for line in _lines(rule, res)] == [
        "dev-b: no BucketPublicAccessBlock; add one with all four flags true", NO_SSE.replace("dev-bucket", "dev-b"),
        NOT_VERSIONED.replace("dev-bucket", "dev-b"), NO_TLS.replace("dev-bucket", "dev-b")]


@pytest.mark.parametrize("type_", ["aws:s3/bucketAcl:BucketAcl", "aws:s3/bucketAclV2:BucketAclV2"])
def test_a_public_acl_resource_of_either_version_is_named(type_):
    res = R.aws_stack()
    res.append(_child(type_, "dev-bucket-acl", acl="public-read"))
    assert _lines(buckets.bucket_not_public, res) == [
        "dev-bucket: ACL 'public-read' makes objects public; use private (the default)"]


def test_the_buckets_own_encryption_is_enough_beside_a_resource_that_sets_none():
    res = [r for r in R.aws_stack() if r["name"] != "dev-bucket-encryption"]
    _inputs(res, B)["serverSideEncryptionConfiguration"] = {
        "rule": {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}}}
    res.append(_child("aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
                      "dev-sse", rules=[{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "none"}}]))
    assert _lines(buckets.bucket_encrypted, res) == []


def test_a_bucket_after_one_with_unknown_settings_is_still_judged():
    res = _two_buckets("trainstack-dev-a", "trainstack-dev-b")
    _inputs(res, "dev-a-sse")["rules"] = [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": UNKNOWN}}]
    _inputs(res, "dev-a-policy")["policy"] = UNKNOWN
    res = [r for r in res if r["name"] not in ("dev-b-sse", "dev-b-policy")]
    assert _lines(buckets.bucket_encrypted, res) == [NO_SSE.replace("dev-bucket", "dev-b")]
    assert _lines(buckets.bucket_tls_only, res) == [NO_TLS.replace("dev-bucket", "dev-b")]


def test_a_resource_without_a_type_is_judged_like_any_other():
    res = [{"name": "odd", "inputs": {}, "options": {"protect": True}}]
    assert _lines(buckets.released_on_destroy, res) == [
        "odd: has protect; `pulumi destroy` must release it (only the bucket is kept)"]
