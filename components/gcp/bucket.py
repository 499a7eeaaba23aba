"""TrainingBucket: the GCS bucket that holds a stack's checkpoints, logs, model and code.

Private (uniform bucket-level access, public access prevention enforced), versioned, without
soft delete, with a lifecycle that deletes pruned checkpoints' versions after a day, other old
versions after `storage.noncurrentDays`, and abandoned multipart uploads after a day.
GCS encrypts every object at rest with Google-managed keys. By default the bucket
outlives `pulumi destroy`; `storage.keepOnDestroy: false` lets destroy empty and remove it. A kept bucket is
adopted by the next `pulumi up` (imported, not created) when the stack says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

from components.common import ABORT_UPLOAD_DAYS, kept_bucket
from runfolder import layout


@dataclass(kw_only=True)
class TrainingBucketArgs:
    """Inputs of a TrainingBucket."""

    bucket_name: pulumi.Input[str]
    """The bucket's (global) name."""
    location: str
    """The bucket's region (kept next to the machines: no cross-region traffic)."""
    keep_on_destroy: bool = True
    """Keep the bucket and its objects when the stack is destroyed."""
    adopt: bool = False
    """Import the existing bucket of this name (kept by an earlier destroy) instead of creating it."""
    noncurrent_days: int = 30
    """Days an overwritten or deleted object version is kept."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels for the bucket."""


def lifecycle_rules(noncurrent_days: int) -> list[gcp.storage.BucketLifecycleRuleArgs]:
    """The bucket's lifecycle: pruned checkpoints go within days, every other old version after `noncurrent_days`.

    Each rule's conditions must all hold ("Object Lifecycle Management"): `daysSinceNoncurrentTime`
    holds once the version has been noncurrent that many days, `daysSinceCustomTime` once that
    many days have passed since the object's Custom-Time; an object without Custom-Time does not
    meet it ("If no custom timestamp is specified on an object, the condition does not apply",
    JSON API bucket resource; salesforce/multicloudj#623 marks objects for a lifecycle rule with
    Custom-Time the same way, world-federation-of-advertisers/cross-media-measurement#3467 adds
    an age rule for objects without one, which such a rule never reaches). Name conditions match a prefix or suffix of the whole name, and
    runs/<id>/checkpoints/ is neither, so the rule matches the Custom-Time the trainer sets on
    every checkpoint object and upload part (`runfolder.layout`), and nothing else sets one.
    Both at 1 day: a pruned checkpoint stays restorable a day, then stops billing (soft delete is
    off, see the bucket). 0 days is not sent by the provider (a documented Terraform bug).
    """
    return [
        gcp.storage.BucketLifecycleRuleArgs(
            action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
            condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                days_since_noncurrent_time=layout.CHECKPOINT_NONCURRENT_DAYS,
                days_since_custom_time=layout.CHECKPOINT_NONCURRENT_DAYS,
                with_state="ARCHIVED",
            ),
        ),
        gcp.storage.BucketLifecycleRuleArgs(
            action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
            condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                days_since_noncurrent_time=noncurrent_days, with_state="ARCHIVED",
            ),
        ),
        gcp.storage.BucketLifecycleRuleArgs(
            action=gcp.storage.BucketLifecycleRuleActionArgs(type="AbortIncompleteMultipartUpload"),
            condition=gcp.storage.BucketLifecycleRuleConditionArgs(age=ABORT_UPLOAD_DAYS),
        ),
    ]


class TrainingBucket(pulumi.ComponentResource):
    """A private, versioned bucket for one stack."""

    bucket: gcp.storage.Bucket
    name: pulumi.Output[str]
    url: pulumi.Output[str]

    def __init__(self, name: str, args: TrainingBucketArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:TrainingBucket", name, None, opts)
        own = kept_bucket(self, args.bucket_name, keep_on_destroy=args.keep_on_destroy, adopt=args.adopt)
        self.bucket = gcp.storage.Bucket(
            f"{name}-gcs",
            name=args.bucket_name,
            location=args.location.upper(),
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            versioning=gcp.storage.BucketVersioningArgs(enabled=True),
            lifecycle_rules=lifecycle_rules(args.noncurrent_days),
            # New buckets keep every deleted object (a noncurrent version a rule deletes too) 7 more
            # days, billed; versioning already keeps what was replaced or deleted, so soft delete
            # only stretches every window above. 0 turns it off ("To disable the soft delete policy
            # on a bucket, This field must be set to 0"; otherwise 7 to 90 days).
            soft_delete_policy=gcp.storage.BucketSoftDeletePolicyArgs(retention_duration_seconds=0),
            # Without keepOnDestroy, destroy empties the bucket: even a targeted delete fails while objects remain.
            force_destroy=not args.keep_on_destroy,
            labels=args.labels,
            opts=own,
        )
        self.name = self.bucket.name
        self.url = pulumi.Output.concat("gs://", self.bucket.name)
        self.register_outputs({"name": self.name, "url": self.url})
