"""TrainingBucket: the S3 bucket that holds a stack's checkpoints, logs, model and code.

Private, versioned, encrypted (SSE-S3 with a bucket key), owner-enforced, TLS-only, with
a lifecycle that removes pruned checkpoints' versions within two days, other old versions
after `storage.noncurrentDays`, and abandoned multipart uploads after a day.
By default the bucket outlives `pulumi destroy` (the checkpoints are the run's value);
`storage.keepOnDestroy: false` lets destroy empty and remove it. A kept bucket is
adopted by the next `pulumi up` (imported, not created) when the stack says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from components.common import ABORT_UPLOAD_DAYS, kept_bucket
from runfolder import layout


@dataclass(kw_only=True)
class TrainingBucketArgs:
    """Inputs of a TrainingBucket."""

    bucket_name: pulumi.Input[str]
    """The bucket's (global) name."""
    keep_on_destroy: bool = True
    """Keep the bucket and its objects when the stack is destroyed."""
    adopt: bool = False
    """Import the existing bucket of this name (kept by an earlier destroy) instead of creating it."""
    noncurrent_days: int = 30
    """Days an overwritten or deleted object version is kept."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags for the bucket."""


def lifecycle_rules(noncurrent_days: int) -> list[aws.s3.BucketLifecycleConfigurationRuleArgs]:
    """The bucket's lifecycle: pruned checkpoints go within days, every other old version after `noncurrent_days`.

    S3 expires a noncurrent version `NoncurrentDays` after its successor (the next version or
    the delete marker a prune leaves) was created, rounded up to the next midnight UTC, and
    stops billing it from then on (S3 User Guide, "How Amazon S3 calculates when an object
    became noncurrent", "Lifecycle and other bucket configurations"). 1 is the least S3
    accepts ("a non-zero positive integer"), so a pruned checkpoint bills for 1 to 2 days. Where
    rules overlap, the earliest expiration is taken, so the 1-day rule wins for checkpoints.
    Lifecycle filters are a prefix or tags, not wildcards: runs/<id>/checkpoints/ cannot be a
    prefix, so the rule filters on the tag the trainer puts on every checkpoint object
    (`runfolder.layout.CHECKPOINT_TAG_KEY`; tags are kept per version).
    """

    def enabled(rule_id: str, *, only: aws.s3.BucketLifecycleConfigurationRuleFilterArgs | None = None,
                **action) -> aws.s3.BucketLifecycleConfigurationRuleArgs:
        """A rule in force, on the objects `only` matches (every object when None)."""
        return aws.s3.BucketLifecycleConfigurationRuleArgs(
            id=rule_id, status="Enabled", filter=only or aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
            **action,
        )

    return [
        enabled(
            "expire-noncurrent-checkpoints",
            only=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(
                tag=aws.s3.BucketLifecycleConfigurationRuleFilterTagArgs(
                    key=layout.CHECKPOINT_TAG_KEY, value=layout.CHECKPOINT_TAG_VALUE,
                ),
            ),
            noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                noncurrent_days=layout.CHECKPOINT_NONCURRENT_DAYS,
            ),
        ),
        enabled(
            "expire-noncurrent-versions",
            noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                noncurrent_days=noncurrent_days,
            ),
        ),
        # A pruned key keeps its delete marker after its versions expire; S3 removes such an
        # "expired object delete marker" only when a rule says so (it cannot take a tag filter).
        enabled(
            "remove-expired-delete-markers",
            expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(expired_object_delete_marker=True),
        ),
        # A checkpoint upload cut off by preemption leaves its parts billed until aborted;
        # an upload takes minutes, so a day is far beyond any live one.
        enabled(
            "abort-incomplete-uploads",
            abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                days_after_initiation=ABORT_UPLOAD_DAYS,
            ),
        ),
    ]


class TrainingBucket(pulumi.ComponentResource):
    """A private, versioned, encrypted, TLS-only bucket for one stack."""

    bucket: aws.s3.Bucket
    name: pulumi.Output[str]
    arn: pulumi.Output[str]

    # long function: the bucket and its settings, declared top to bottom, one resource each
    def __init__(self, name: str, args: TrainingBucketArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:aws:TrainingBucket", name, None, opts)
        own = kept_bucket(self, args.bucket_name, keep_on_destroy=args.keep_on_destroy, adopt=args.adopt)
        self.bucket = aws.s3.Bucket(
            f"{name}-s3",
            bucket=args.bucket_name,
            # Without keepOnDestroy, destroy empties the bucket: even a targeted delete fails while objects remain.
            force_destroy=not args.keep_on_destroy,
            tags=args.tags,
            opts=own,
        )
        bucket_id = self.bucket.id
        # The settings below are separate resources in the v2 S3 model; each must be
        # retained with the bucket, or destroy would strip them from the kept bucket.
        kept = pulumi.ResourceOptions(parent=self, retain_on_delete=args.keep_on_destroy)
        ownership = aws.s3.BucketOwnershipControls(
            f"{name}-ownership",
            bucket=bucket_id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=kept,
        )
        public_block = aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access",
            bucket=bucket_id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=kept,
        )
        versioning = aws.s3.BucketVersioning(
            f"{name}-versioning",
            bucket=bucket_id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=kept,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption",
            bucket=bucket_id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="AES256",
                    ),
                    bucket_key_enabled=True,
                )
            ],
            opts=kept,
        )
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle",
            bucket=bucket_id,
            rules=lifecycle_rules(args.noncurrent_days),
            # A lifecycle configuration on an unversioned bucket is refused for noncurrent rules.
            opts=pulumi.ResourceOptions.merge(kept, pulumi.ResourceOptions(depends_on=[versioning])),
        )
        policy = pulumi.Output.json_dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Sid": "DenyInsecureTransport",
                        "Effect": "Deny",
                        "Principal": "*",
                        "Action": "s3:*",
                        "Resource": [self.bucket.arn, pulumi.Output.concat(self.bucket.arn, "/*")],
                        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                    }
                ],
            }
        )
        aws.s3.BucketPolicy(
            f"{name}-policy",
            bucket=bucket_id,
            policy=policy,
            # S3 refuses a bucket policy while the public access block is being written.
            opts=pulumi.ResourceOptions.merge(kept, pulumi.ResourceOptions(depends_on=[public_block, ownership])),
        )
        self.name = self.bucket.bucket
        self.arn = self.bucket.arn
        self.register_outputs({"name": self.name, "arn": self.arn})
