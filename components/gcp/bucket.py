"""TrainingBucket: the GCS bucket that holds a stack's checkpoints, logs, model and code.

Private (uniform bucket-level access, public access prevention enforced), versioned, with
a lifecycle that deletes old noncurrent versions and aborts abandoned multipart uploads.
GCS encrypts every object at rest with Google-managed keys. By default the bucket
outlives `pulumi destroy`; `storage.keepOnDestroy: false` lets destroy empty and remove it. A kept bucket is
adopted by the next `pulumi up` (imported, not created) when the stack says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

from components.common import adopted_bucket


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


class TrainingBucket(pulumi.ComponentResource):
    """A private, versioned bucket for one stack."""

    bucket: gcp.storage.Bucket
    name: pulumi.Output[str]
    url: pulumi.Output[str]

    def __init__(self, name: str, args: TrainingBucketArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:TrainingBucket", name, None, opts)
        self.bucket = gcp.storage.Bucket(
            f"{name}-gcs",
            name=args.bucket_name,
            location=args.location.upper(),
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            versioning=gcp.storage.BucketVersioningArgs(enabled=True),
            lifecycle_rules=[
                gcp.storage.BucketLifecycleRuleArgs(
                    action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                    condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                        days_since_noncurrent_time=args.noncurrent_days, with_state="ARCHIVED",
                    ),
                ),
                gcp.storage.BucketLifecycleRuleArgs(
                    action=gcp.storage.BucketLifecycleRuleActionArgs(type="AbortIncompleteMultipartUpload"),
                    condition=gcp.storage.BucketLifecycleRuleConditionArgs(age=7),
                ),
            ],
            # keepOnDestroy: Pulumi forgets the bucket instead of deleting it, and even a
            # targeted delete fails while objects remain.
            force_destroy=not args.keep_on_destroy,
            labels=args.labels,
            opts=pulumi.ResourceOptions(
                parent=self, retain_on_delete=args.keep_on_destroy, import_=adopted_bucket(args.bucket_name, args.adopt),
            ),
        )
        self.name = self.bucket.name
        self.url = pulumi.Output.concat("gs://", self.bucket.name)
        self.register_outputs({"name": self.name, "url": self.url})
