"""The tag rule: every taggable resource carries the stack and run tags (labels on GCP)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from policy.rules import base
from policy.rules.base import UNKNOWN, Context, Resource, Violation
from policy.rules.machines import LAUNCH_TEMPLATES

# Resource types that take tags (AWS) or labels (GCP) and that a trainstack stack creates.
# Any other resource whose inputs carry tags/labels is checked too.
TAGGABLE = frozenset({
    "aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2", "aws:iam/role:Role", "aws:iam/policy:Policy",
    "aws:iam/instanceProfile:InstanceProfile", "aws:ecr/repository:Repository",
    "aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/securityGroup:SecurityGroup",
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", "aws:autoscaling/group:Group",
    "aws:ec2/instance:Instance", "aws:scheduler/scheduleGroup:ScheduleGroup",
    "gcp:storage/bucket:Bucket", "gcp:compute/instanceTemplate:InstanceTemplate",
    "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate",
})
# A docker-build image is no cloud resource: its `tags` are image tags (repo:tag), and
# what it costs is storage in the repository, which carries the stack and run tags.
IMAGE_BUILDS = ("docker-build:",)
STACK_TAG = re.compile(r"^trainstack[:_-]stack$")
RUN_TAG = re.compile(r"^trainstack[:_-]run$")


def _tag_map(r: Resource) -> dict[str, Any] | None:
    """The resource's tags/labels as a dict (ASG tags are a list of key/value), or None if unknown."""
    if r.get("type") == "aws:autoscaling/group:Group":
        tags = base.get(r, "tags", [])
        if base.has_unknown(tags):
            return None
        return {t.get("key"): t.get("value") for t in base.as_list(tags) if isinstance(t, Mapping)}
    for key in ("tags", "labels"):
        v = base.inputs_of(r).get(key)
        if v == UNKNOWN:
            return None
        if isinstance(v, Mapping):
            return dict(v)
    return {}


def _tag_problem(tags: Mapping[str, Any], ctx: Context, *, labels: bool = False) -> str | None:
    """What the stack/run tags lack; GCP labels hold values lowercased, so they compare so."""
    missing = []
    for pat, want, what in ((STACK_TAG, ctx.stack, "stack"), (RUN_TAG, ctx.run_id, "run")):
        vals = [v for k, v in tags.items() if isinstance(k, str) and pat.match(k)]
        if not vals or any(not base.known(v) for v in vals):
            if not vals:
                missing.append(f"trainstack-{what}")
            continue
        have = str(vals[0]).lower() if labels else str(vals[0])
        if want is not None and have != (want.lower() if labels else want):
            missing.append(f"trainstack-{what}={want} (has {vals[0]!r})")
    return ", ".join(missing) or None


def tagged(resources: list[Resource], ctx: Context) -> list[Violation]:
    """Every taggable resource carries the stack and run tags (labels on GCP), so a bill or a
    console search finds everything a run created; launch templates pass them to instances and volumes."""
    out: list[Violation] = []
    for r in resources:
        inputs = base.inputs_of(r)
        if r.get("type", "").startswith(IMAGE_BUILDS):
            continue
        if r.get("type") not in TAGGABLE and "tags" not in inputs and "labels" not in inputs:
            continue
        tags = _tag_map(r)
        if tags is None:
            continue
        problem = _tag_problem(tags, ctx, labels=r.get("type", "").startswith("gcp:"))
        if problem:
            out.append(Violation("tagged", r["name"], f"missing tag(s) {problem}; tag it from the one tags function"))
        if r.get("type") in LAUNCH_TEMPLATES:
            specs = base.get(r, "tagSpecifications", [])
            if base.has_unknown(specs):
                continue
            by_type = {s.get("resourceType"): s.get("tags") or {} for s in base.as_list(specs) if isinstance(s, Mapping)}
            for rt in ("instance", "volume"):
                p = _tag_problem(by_type.get(rt, {}), ctx) if rt in by_type else "all"
                if p:
                    out.append(Violation("tagged", r["name"], f"tagSpecifications for {rt} lack {p}; "
                                         "machines and disks must carry the stack and run tags"))
    return out
