"""The IAM rule: least privilege in AWS policy documents and GCP project grants."""

from __future__ import annotations

from typing import Any

from policy import iam
from policy.rules import base
from policy.rules.base import UNKNOWN, Context, Resource, Violation
from policy.rules.buckets import _principal_is_anyone

# Actions whose API has no resource-level permission, so a statement that grants them must
# name Resource "*". Each entry says why; any other action on "*" is refused.
WILDCARD_RESOURCE_ACTIONS: dict[str, str] = {
    "ecr:GetAuthorizationToken": "ECR issues a registry login token for the whole account; the API takes no resource",
    "autoscaling:DescribeAutoScalingGroups": "Auto Scaling Describe* calls support no resource-level permission",
    "autoscaling:DescribeAutoScalingInstances": "Auto Scaling Describe* calls support no resource-level permission",
    "autoscaling:DescribeScalingActivities": "Auto Scaling Describe* calls support no resource-level permission",
    "ec2:DescribeInstances": "EC2 Describe* calls support no resource-level permission",
    "ec2:DescribeTags": "EC2 Describe* calls support no resource-level permission",
    "ec2:DescribeSpotInstanceRequests": "EC2 Describe* calls support no resource-level permission",
    "cloudwatch:PutMetricData": "CloudWatch metrics take no resource; scope with the cloudwatch:namespace condition",
    "ec2:DescribeSpotPriceHistory": "EC2 Describe* calls support no resource-level permission (the placement "
                                    "controller's spot prices)",
    "ec2:GetSpotPlacementScores": "EC2's spot placement scores take no resource (the placement controller's "
                                  "capacity signal)",
}


def _wildcard_action(a: Any) -> bool:
    return a == "*" or (isinstance(a, str) and a.endswith(":*"))


GCP_PROJECT_IAM = ("gcp:projects/iAMMember:IAMMember", "gcp:projects/iAMBinding:IAMBinding")
GCP_BASIC_ROLES = ("roles/owner", "roles/editor", "roles/viewer")


def _gcp_project_grants(resources: list[Resource]) -> list[Violation]:
    """Project-wide grants: never a basic role; an admin role only under an IAM condition that
    narrows it to this stack's resources (e.g. resource.name of its instance group)."""
    out: list[Violation] = []
    for r in base.of_type(resources, *GCP_PROJECT_IAM):
        role, cond = base.get(r, "role"), base.get(r, "condition")
        if not isinstance(role, str) or not base.known(role):
            continue
        if role in GCP_BASIC_ROLES:
            out.append(Violation("iam-least-privilege", r["name"], f"grants {role} on the whole project; grant "
                                 "a predefined role on the bucket or repository instead"))
        elif "admin" in role.lower() and not cond:
            out.append(Violation("iam-least-privilege", r["name"], f"grants {role} on the whole project without "
                                 "an IAM condition; narrow it to this stack's resources"))
    return out


def iam_least_privilege(resources: list[Resource], ctx: Context) -> list[Violation]:
    """AWS policy documents grant no `*` or `service:*` action, no NotAction/NotResource, and no
    `*` resource except for actions that have no resource-level permission (WILDCARD_RESOURCE_ACTIONS).
    GCP: no basic role, and no project-wide admin role without a condition."""
    out: list[Violation] = _gcp_project_grants(resources)
    for d in iam.policy_documents(resources):
        if d.text == UNKNOWN:
            continue
        where = f"{d.field}"
        try:
            doc = d.parsed()
        except ValueError:
            out.append(Violation("iam-least-privilege", d.resource, f"{where} is not a JSON policy document"))
            continue
        for i, st in enumerate(iam.statements(doc)):
            if st.get("Effect") != "Allow":
                continue
            sid = f"{where} Statement[{i}]" + (f" ({st['Sid']})" if st.get("Sid") else "")
            actions = base.as_list(st.get("Action"))
            if "NotAction" in st or "NotResource" in st:
                out.append(Violation("iam-least-privilege", d.resource, f"{sid} uses NotAction/NotResource with Allow; list what is allowed"))
            wild = [a for a in actions if _wildcard_action(a)]
            if wild:
                out.append(Violation("iam-least-privilege", d.resource, f"{sid} allows {', '.join(wild)}; list the actions needed"))
            if d.kind == "trust":
                if _principal_is_anyone(st.get("Principal")):
                    out.append(Violation("iam-least-privilege", d.resource, f"{sid} lets anyone assume the role; name the service"))
                continue
            if d.kind in ("resource", "key"):
                # Who may use a bucket is bucket-not-public's business; resources are the bucket's own. A key
                # policy's Resource "*" is the key itself.
                continue
            if "*" in base.as_list(st.get("Resource")):
                unjustified = [a for a in actions if a not in WILDCARD_RESOURCE_ACTIONS]
                if unjustified:
                    out.append(Violation("iam-least-privilege", d.resource, f"{sid} grants {', '.join(unjustified)} on "
                                         "Resource '*'; name this stack's ARNs"))
    return out
