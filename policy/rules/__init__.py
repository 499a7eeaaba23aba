"""The security and cost rules every trainstack stack must pass, as plain functions.

A resource is a dict in the shape `ops synth` writes and the policy pack builds from the
engine's view: `{"type": "aws:s3/bucket:Bucket", "name", "parent", "inputs" (camelCase
property names), "options" ({"retainOnDelete", ...})}`. A rule is a function
`rule(resources, ctx) -> list[Violation]`; `RULES` registers each with its id, what it
checks and why. Rules with scope "resource" judge each resource alone (the pack runs them
as resource policies); "stack" rules need several resources at once (a bucket and its
public access block, a group and its schedule).

A value the engine cannot know yet (during `pulumi preview`) arrives as `UNKNOWN`; rules do
not judge such a value, the next preview or `pulumi up` does.

One module per section: `base` (resource shape, Violation, Context, readers), `buckets`,
`machines`, `network`, `identity` (IAM), `images` (pinned image, no secrets), `cost`,
`tags`; this module registers them. Standard library only: the policy pack runs it in
its own virtualenv.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from policy.rules.base import UNKNOWN, Context, Resource, Violation, context_from_config, context_from_settings
from policy.rules.buckets import (
    GCS_BUCKETS,
    PUBLIC_ACLS,
    PUBLIC_MEMBERS,
    S3_BUCKETS,
    bucket_encrypted,
    bucket_not_public,
    bucket_retained,
    bucket_tls_only,
    bucket_versioned,
    released_on_destroy,
)
from policy.rules.cost import ASGS, MIGS, spot_with_runtime_cap
from policy.rules.identity import GCP_BASIC_ROLES, GCP_PROJECT_IAM, WILDCARD_RESOURCE_ACTIONS, iam_least_privilege
from policy.rules.images import (
    SECRET_PATTERNS,
    image_pinned,
    image_problem,
    image_verified,
    no_secrets,
    secret_kind,
    user_data_texts,
)
from policy.rules.machines import (
    GCE_TEMPLATES,
    LAUNCH_TEMPLATES,
    gce_metadata_hardened,
    imdsv2_required,
    root_volume_encrypted,
)
from policy.rules.network import Ingress, no_world_ingress, ssh_only_from_allowed
from policy.rules.tags import IMAGE_BUILDS, RUN_TAG, STACK_TAG, TAGGABLE, tagged

__all__ = [
    "ASGS", "GCE_TEMPLATES", "GCP_BASIC_ROLES", "GCP_PROJECT_IAM", "GCS_BUCKETS", "IMAGE_BUILDS", "LAUNCH_TEMPLATES",
    "MIGS", "PUBLIC_ACLS", "PUBLIC_MEMBERS", "RULES", "RULES_BY_ID", "RUN_TAG", "S3_BUCKETS", "SECRET_PATTERNS",
    "STACK_TAG", "TAGGABLE", "UNKNOWN", "WILDCARD_RESOURCE_ACTIONS", "Context", "Ingress", "Resource", "Rule",
    "Violation", "bucket_encrypted", "bucket_not_public", "bucket_retained", "bucket_tls_only", "bucket_versioned",
    "check", "context_from_config", "context_from_settings", "gce_metadata_hardened", "iam_least_privilege",
    "image_pinned", "image_problem", "image_verified", "imdsv2_required", "no_secrets", "no_world_ingress", "released_on_destroy",
    "root_volume_encrypted", "secret_kind", "spot_with_runtime_cap", "ssh_only_from_allowed", "tagged",
    "user_data_texts",
]


@dataclass(frozen=True)
class Rule:
    """A rule: its id, what it checks, why, the function, and whether it judges one resource or the stack."""

    id: str
    description: str
    why: str
    check: Callable[[list[Resource], Context], list[Violation]] = field(repr=False)
    scope: str = "stack"


RULES: tuple[Rule, ...] = (
    Rule("bucket-not-public", "Buckets block all public access (S3 public access block, no public ACL or "
         "policy; GCS uniform access, public access prevention enforced).",
         "The bucket holds the user's data and models.", bucket_not_public),
    Rule("bucket-encrypted", "S3 buckets have default server-side encryption configured.",
         "Data at rest is encrypted by a setting the stack owns, not by an account default.", bucket_encrypted),
    Rule("bucket-versioned", "Buckets keep noncurrent versions.",
         "An overwritten or deleted checkpoint can be recovered.", bucket_versioned),
    Rule("bucket-tls-only", "The S3 bucket policy denies requests without TLS.",
         "Checkpoints and data never travel in clear text.", bucket_tls_only),
    Rule("bucket-retained", "The bucket survives `pulumi destroy` unless storage.keepOnDestroy is false.",
         "Destroying compute must not destroy the results.", bucket_retained),
    Rule("released-on-destroy", "Everything but the bucket is neither retained nor protected.",
         "`pulumi destroy` must stop every cost; only the data stays.", released_on_destroy, "resource"),
    Rule("imdsv2-required", "Launch templates require IMDSv2 tokens with hop limit 1.",
         "Stops SSRF and containers on a bridge network from reading the role's credentials.", imdsv2_required, "resource"),
    Rule("gce-metadata-hardened", "GCE templates keep legacy metadata endpoints off and vTPM/integrity monitoring on.",
         "The GCP counterpart of IMDSv2 and a verified boot chain.", gce_metadata_hardened, "resource"),
    Rule("root-volume-encrypted", "Launch templates define an encrypted root volume.",
         "The disk holds the data set and checkpoints in flight.", root_volume_encrypted, "resource"),
    Rule("no-world-ingress", "No inbound rule from 0.0.0.0/0 or ::/0.",
         "A training machine needs no inbound traffic; SSH goes to named CIDRs.", no_world_ingress, "resource"),
    Rule("ssh-only-from-allowed", "Inbound traffic is only TCP 22 from access.allowedCidrs (and within the group).",
         "Nothing else listens for the outside world.", ssh_only_from_allowed, "resource"),
    Rule("iam-least-privilege", "IAM policies grant no `*` action and no `*` resource except where the API needs it.",
         "A stolen machine credential reaches this stack's bucket, repository and group only.", iam_least_privilege, "resource"),
    Rule("image-pinned", "Machines run an image pinned by tag or digest (never latest); ECR tags are immutable.",
         "A moving image would change a running job; a resumed run must run the same code.", image_pinned, "resource"),
    Rule("image-verified", "In a stack that signs its image, every machine holds the key that verifies it.",
         "A machine without the public key would run an image nobody vouched for.", image_verified),
    Rule("no-secrets", "No credentials in user data or any resource input.",
         "User data is readable from the instance without auth and inputs are kept in the state.", no_secrets, "resource"),
    Rule("spot-with-runtime-cap", "Groups run spot unless on-demand is explicit, and the cloud stops them after the runtime cap.",
         "A forgotten run must not bill GPUs forever.", spot_with_runtime_cap),
    Rule("tagged", "Every taggable resource carries the stack and run tags/labels.",
         "Cost and cleanup are found by tag.", tagged, "resource"),
)
RULES_BY_ID: dict[str, Rule] = {r.id: r for r in RULES}


def check(resources: Iterable[Resource], ctx: Context | None = None, rules: Iterable[Rule] = RULES) -> list[Violation]:
    """Every violation of `rules` (all by default) in `resources`."""
    res = list(resources)
    ctx = ctx or Context()
    return [v for rule in rules for v in rule.check(res, ctx)]
