"""How home's AWS controller reaches a GCP placement's group in the placement's own project.

The placement's machines run as `components.gcp.identity.PlacementIdentity` (no grant in GCS); the run
folder is in the home S3 bucket, reached through `components/aws/federation.py`'s role with that
account's ID token.

- `ControllerAccess`: the AWS controller function's way in, with no key: a workload identity pool with
  an AWS provider trusting home's account, whose attribute condition admits the controller function's
  role only (`attribute.aws_role`, the assumed-role ARN without its session); a service account that
  principal set may impersonate (`roles/iam.workloadIdentityUser` on that one account); and on the
  group, through an IAM condition naming it, the group permissions a tick uses (read, list, resize).
  The controller takes `gcp_audience` (the provider's full name) and `service_account` from
  `controller_config`'s `access` and builds google-auth `external_account` credentials from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_random as random

from components.gcp.controller import GROUP_PERMISSIONS
from components.gcp.identity import groups_condition
from components.gcp.naming import ROLE_SUFFIX_BYTES, custom_role_id

# The AWS provider's own default mapping, written out: the condition and the binding below depend on
# `attribute.aws_role` being the assumed-role ARN without its session name.
AWS_ATTRIBUTE_MAPPING = {
    "google.subject": "assertion.arn",
    "attribute.aws_role": ("assertion.arn.contains('assumed-role')"
                           " ? assertion.arn.extract('{account_arn}assumed-role/')"
                           " + 'assumed-role/' + assertion.arn.extract('assumed-role/{role_name}/')"
                           " : assertion.arn"),
}
PROVIDER_ID = "aws-controller"
# What a caller's audience names: the provider's full resource name under iam.googleapis.com.
AUDIENCE_PREFIX = "//iam.googleapis.com/"


def assumed_role_arn(partition: pulumi.Input[str], account_id: pulumi.Input[str],
                     role_name: pulumi.Input[str]) -> pulumi.Output[str]:
    """`arn:aws:sts::ACCOUNT:assumed-role/ROLE`: what `attribute.aws_role` holds for any session of that role."""
    return pulumi.Output.concat("arn:", partition, ":sts::", account_id, ":assumed-role/", role_name)


def pool_id(stem: str, suffix: str) -> str:
    """A workload identity pool id: 4-32 of [a-z0-9-], not starting with `gcp-`. A deleted pool's id
    stays taken for 30 days, so a random suffix kept in state follows the stack's stem."""
    return f"ts-{stem[:20].strip('-')}-{suffix}"


@dataclass(kw_only=True)
class ControllerAccessArgs:
    """Inputs of a ControllerAccess."""

    gcp_project: str
    """The placement's project."""
    region: str
    """The placement's region."""
    group_name: str
    """The placement's group: the only one the controller's account may read and resize."""
    account_id: str
    """The controller's service account id in this project (6-30 characters)."""
    pool_stem: str
    """The stack's part of the pool's id (`pool_id`)."""
    custom_role_prefix: str
    """The start of the custom role's id; a random suffix kept in the stack's state follows."""
    aws_account_id: pulumi.Input[str]
    """Home's AWS account: the provider accepts its identities only."""
    aws_partition: pulumi.Input[str]
    """Home's AWS partition (`aws`)."""
    controller_role_name: pulumi.Input[str]
    """The controller function's IAM role: the one AWS identity admitted."""


class ControllerAccess(pulumi.ComponentResource):
    """Home's AWS controller reaching one GCP placement's group, by workload identity federation."""

    pool: gcp.iam.WorkloadIdentityPool
    provider: gcp.iam.WorkloadIdentityPoolProvider
    account: gcp.serviceaccount.Account
    audience: pulumi.Output[str]
    email: pulumi.Output[str]

    def __init__(self, name: str, args: ControllerAccessArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:ControllerAccess", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        suffix = random.RandomId(f"{name}-suffix", byte_length=ROLE_SUFFIX_BYTES, opts=child)
        self.pool = gcp.iam.WorkloadIdentityPool(
            f"{name}-pool",
            project=args.gcp_project,
            workload_identity_pool_id=suffix.hex.apply(lambda h: pool_id(args.pool_stem, h)),
            display_name="trainstack controller",
            description="home's AWS placement controller: resizes this project's trainstack group",
            opts=child,
        )
        role_arn = assumed_role_arn(args.aws_partition, args.aws_account_id, args.controller_role_name)
        self.provider = gcp.iam.WorkloadIdentityPoolProvider(
            f"{name}-provider",
            project=args.gcp_project,
            workload_identity_pool_id=self.pool.workload_identity_pool_id,
            workload_identity_pool_provider_id=PROVIDER_ID,
            display_name="trainstack AWS controller",
            description="the controller function's role in home's AWS account, nothing else",
            aws=gcp.iam.WorkloadIdentityPoolProviderAwsArgs(account_id=args.aws_account_id),
            attribute_mapping=AWS_ATTRIBUTE_MAPPING,
            attribute_condition=pulumi.Output.concat('attribute.aws_role == "', role_arn, '"'),
            opts=child,
        )
        self.account = gcp.serviceaccount.Account(
            f"{name}-sa",
            account_id=args.account_id,
            project=args.gcp_project,
            display_name="trainstack placement controller",
            description="home's AWS controller: this placement's group only",
            opts=child,
        )
        self.grants: list[pulumi.Resource] = [
            gcp.serviceaccount.IAMMember(
                f"{name}-impersonate",
                service_account_id=self.account.name,
                role="roles/iam.workloadIdentityUser",
                member=pulumi.Output.concat("principalSet://iam.googleapis.com/", self.pool.name,
                                            "/attribute.aws_role/", role_arn),
                opts=child,
            ),
        ]
        role = gcp.projects.IAMCustomRole(
            f"{name}-group-role",
            project=args.gcp_project,
            role_id=suffix.hex.apply(lambda h: custom_role_id(args.custom_role_prefix, h, "ctl")),
            title="trainstack: read and resize a placement's group",
            permissions=GROUP_PERMISSIONS,
            opts=child,
        )
        self.grants.append(gcp.projects.IAMMember(
            f"{name}-group", project=args.gcp_project, role=role.name,
            member=pulumi.Output.concat("serviceAccount:", self.account.email),
            condition=gcp.projects.IAMMemberConditionArgs(
                title="this placement's group", expression=groups_condition(args.gcp_project,
                                                                            [(args.region, args.group_name)])),
            opts=child,
        ))
        self.audience = pulumi.Output.concat(AUDIENCE_PREFIX, self.provider.name)
        self.email = self.account.email
        self.register_outputs({"audience": self.audience, "email": self.email})
