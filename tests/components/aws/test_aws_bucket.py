"""TrainingBucket: private, versioned, encrypted, TLS-only, lifecycle, kept on destroy."""

import json

import pytest

from components.aws.naming import default_bucket_name
from components.settings import bucket_name_problem
from runfolder import layout
from tests.components.aws.helpers import one, synth_raw

BUCKET = "aws:s3/bucket:Bucket"
SETTINGS_TYPES = [
    "aws:s3/bucketVersioning:BucketVersioning",
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
    "aws:s3/bucketPolicy:BucketPolicy",
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
]


def test_bucket_is_versioned_encrypted_private_and_owner_enforced():
    r = synth_raw({"storage": {"bucketName": "my-train-bucket"}})
    bucket = one(r, BUCKET)
    assert bucket["inputs"]["bucket"] == "my-train-bucket"
    assert bucket["parent"] == "trainstack-bucket"
    versioning = one(r, SETTINGS_TYPES[0])["inputs"]
    assert versioning["bucket"] == "my-train-bucket"
    assert versioning["versioningConfiguration"]["status"] == "Enabled"
    (rule,) = one(r, SETTINGS_TYPES[1])["inputs"]["rules"]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] in ("AES256", "aws:kms")
    assert rule["bucketKeyEnabled"] is True
    pab = one(r, SETTINGS_TYPES[2])["inputs"]
    flags = ["blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"]
    assert [pab[f] for f in flags] == [True, True, True, True]
    assert one(r, SETTINGS_TYPES[3])["inputs"]["rule"]["objectOwnership"] == "BucketOwnerEnforced"


def test_bucket_policy_denies_plain_http_on_bucket_and_objects():
    r = synth_raw({"storage": {"bucketName": "my-train-bucket"}})
    policy = json.loads(one(r, "aws:s3/bucketPolicy:BucketPolicy")["inputs"]["policy"])
    denies = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert len(denies) == 1
    deny = denies[0]
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert deny["Principal"] == "*" and deny["Action"] == "s3:*"
    assert sorted(deny["Resource"]) == ["arn:aws:s3:::my-train-bucket", "arn:aws:s3:::my-train-bucket/*"]


def test_lifecycle_expires_noncurrent_versions_and_aborts_uploads():
    r = synth_raw({"storage": {"noncurrentDays": 45}})
    lifecycle = one(r, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    rules = {rule["id"]: rule for rule in lifecycle["inputs"]["rules"]}
    assert sorted(rules) == ["abort-incomplete-uploads", "expire-noncurrent-checkpoints", "expire-noncurrent-versions",
                             "remove-expired-delete-markers"]
    assert all(rule["status"] == "Enabled" for rule in rules.values())
    expiring = {i: (x["filter"], x["noncurrentVersionExpiration"]["noncurrentDays"])
                for i, x in rules.items() if "noncurrentVersionExpiration" in x}
    # Checkpoint objects (tagged by the trainer) go after 1 day; every other version after noncurrentDays.
    assert expiring == {
        "expire-noncurrent-checkpoints": ({"tag": {"key": layout.CHECKPOINT_TAG_KEY,
                                                   "value": layout.CHECKPOINT_TAG_VALUE}}, 1),
        "expire-noncurrent-versions": ({"prefix": ""}, 45),
    }
    assert rules["remove-expired-delete-markers"]["expiration"] == {"expiredObjectDeleteMarker": True}
    assert rules["remove-expired-delete-markers"]["filter"] == {"prefix": ""}
    assert rules["abort-incomplete-uploads"]["abortIncompleteMultipartUpload"] == {"daysAfterInitiation": 1}
    # Noncurrent rules need versioning on first.
    assert "trainstack-bucket-versioning" in lifecycle["options"]["dependsOn"]


@pytest.mark.parametrize(
    ("keep", "retain", "force"),
    [(None, True, False), (True, True, False), (False, False, True)],
)
def test_keep_on_destroy_decides_retain_and_force_destroy(keep, retain, force):
    r = synth_raw({"storage": {} if keep is None else {"keepOnDestroy": keep}})
    bucket = one(r, BUCKET)
    assert bucket["inputs"]["forceDestroy"] is force
    kept = [bucket] + [one(r, t) for t in SETTINGS_TYPES]
    assert len(kept) == 7
    assert [x["options"]["retainOnDelete"] for x in kept] == [retain] * 7


def test_generated_name_is_valid_deterministic_and_per_stack():
    first = synth_raw(stack="alpha").outputs["bucketName"]
    again = synth_raw({"run": {"steps": 101}}, stack="alpha").outputs["bucketName"]
    other = synth_raw(stack="beta").outputs["bucketName"]
    assert first == again != other
    assert first.startswith("trainstack-alpha-")
    assert bucket_name_problem("aws", first) is None
    assert first == default_bucket_name(project="trainstack", stack="alpha", account_id="123456789012", region="eu-west-1")


@pytest.mark.parametrize("stack", ["Dev_Stack.with.DOTS", "x" * 120, "a"])
def test_generated_names_stay_valid_for_odd_stack_names(stack):
    names = [default_bucket_name(project="trainstack", stack=stack, account_id=a, region="us-east-1")
             for a in ("111111111111", "222222222222")]
    assert names[0] != names[1]  # the account is part of the name: S3 names are global
    assert [bucket_name_problem("aws", n) for n in names] == [None, None]
