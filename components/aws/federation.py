"""FederatedRole: the IAM role a placement's machines on GCP assume with their Google identity.

A GCE machine of an AWS-home stack has no AWS keys and gets none: it asks its metadata server for a
Google ID token of its service account (`…/service-accounts/default/identity?audience=AUDIENCE`) and
exchanges it at STS (`AssumeRoleWithWebIdentity`) for this role's session. AWS trusts Google's issuer
natively (`accounts.google.com`, no OIDC provider to create). The trust names exactly one service
account and one audience, with the condition keys AWS documents for Google, each a different claim:

- `accounts.google.com:sub`: the token's `sub`, the service account's unique id (numeric);
- `accounts.google.com:aud`: the token's `azp` (its `aud` only when it has no `azp`), for a service
  account's token its unique id too;
- `accounts.google.com:oaud`: the token's `aud`, the audience the machine asked for.

The role may do in S3 what the home machines' role may (`identity.bucket_statements`: this run's prefix,
the trainer code, the package cache, the data read only) and nothing else: the machine's group, image and
notices are GCP's, reached with its own service account.

`ControllerRole` is the same trust the other way round: a GCP home's controller function (its service
account's ID tokens for `controller_audience`) reaching the stack's AWS placements' groups
(`controller.grants.aws_group_policy`: read them, size them up to the run's nodes, read their spot prices),
nothing in S3.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from components.aws.identity import bucket_statements, deployer_account, role_with_policy
from controller.grants import aws_group_policy

# The issuer of Google's ID tokens, as AWS names the federated principal.
GOOGLE = "accounts.google.com"
# A role session lasts at most this long unless the role says more; one hour is AWS's default and the
# token's own life: botocore refreshes the session from the token file before it ends.
MAX_SESSION_S = 3600


def google_trust(unique_id: pulumi.Input[str], audience: pulumi.Input[str]) -> pulumi.Output[str]:
    """The trust policy: the Google service account `unique_id`'s tokens for `audience`, nothing else."""
    return pulumi.Output.json_dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": {"Federated": GOOGLE},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {
                f"{GOOGLE}:sub": unique_id,
                f"{GOOGLE}:aud": unique_id,
                f"{GOOGLE}:oaud": audience,
            }},
        }],
    })


def audience(group: str) -> str:
    """The audience a placement's machines ask their token for: names the placement's group, so a token
    asked for another purpose (or another placement) is not this role's."""
    return f"trainstack/{group}"


def controller_audience(home_group: str) -> str:
    """The audience a GCP home's controller function asks its token for (`access.audience`): names the home
    group, and says it is the controller's, so that no machine's token is ever the controller role's."""
    return f"trainstack/{home_group}/controller"


def controller_role_name(home_group: str) -> str:
    """The name of a GCP home's controller role (`ControllerRole`), known before the role exists: the
    controller's configuration names its ARN, and the role's trust needs the function's account, made
    with the function (IAM role names take 64 characters)."""
    return f"{home_group[:49]}-gcp-controller"


@dataclass(kw_only=True)
class FederatedRoleArgs:
    """Inputs of a FederatedRole."""

    bucket_arn: pulumi.Input[str]
    """ARN of the stack's (home) bucket."""
    run_id: str
    """The run's folder: the role may write only under runs/<run_id>/."""
    service_account_unique_id: pulumi.Input[str]
    """The unique id (numeric) of the placement's machines' Google service account: the one identity trusted."""
    audience: str
    """The audience the machines ask their ID token for (`audience()`)."""
    data_uri: str | None = None
    """s3://BUCKET/PREFIX of the training data, read only; None for synthetic data."""
    validation_data_uri: str | None = None
    """s3://BUCKET/PREFIX of the validation data, read only; None without."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags for the role."""


class GoogleTrustedRole(pulumi.ComponentResource):
    """An IAM role that one Google service account's ID tokens for one audience may assume, with one inline
    policy: what `FederatedRole` and `ControllerRole` each build with their own policy."""

    role: aws.iam.Role
    policy: aws.iam.RolePolicy
    role_arn: pulumi.Output[str]

    def _trusted_role(self, name: str, *, unique_id: pulumi.Input[str], audience: str, description: str,
                      policy: pulumi.Input[str], tags: dict[str, str], role_name: str | None = None) -> None:
        """Declare the role and its policy, and register `role_arn` (the last step of a constructor)."""
        self.role, self.policy = role_with_policy(
            self, name, role_name=role_name, trust=google_trust(unique_id, audience), description=description,
            max_session_s=MAX_SESSION_S, tags=tags, policy=policy,
        )
        self.role_arn = self.role.arn
        self.register_outputs({"role_arn": self.role_arn})


class FederatedRole(GoogleTrustedRole):
    """An IAM role trusting one Google service account's ID tokens, with the machines' S3 access."""

    def __init__(self, name: str, args: FederatedRoleArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:aws:FederatedRole", name, None, opts)
        partition = aws.get_partition_output(opts=pulumi.InvokeOptions(parent=self)).partition
        self._trusted_role(
            name, unique_id=args.service_account_unique_id, audience=args.audience, tags=args.tags,
            description="trainstack machines on GCP: one run's bucket prefix, by their Google identity",
            policy=pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": bucket_statements(
                partition=partition, bucket_arn=args.bucket_arn, run_id=args.run_id, data_uri=args.data_uri,
                validation_data_uri=args.validation_data_uri)}),
        )


@dataclass(kw_only=True)
class ControllerRoleArgs:
    """Inputs of a ControllerRole."""

    role_name: str
    """The role's name (`controller_role_name`)."""
    service_account_unique_id: pulumi.Input[str]
    """The unique id (numeric) of the GCP home's controller function's service account: the one identity trusted."""
    audience: str
    """The audience the function asks its ID token for (`controller_audience`)."""
    groups: list[tuple[str, str]]
    """(region, name) of the stack's AWS groups: the only ones the role may read and size."""
    nodes: int
    """Machines of the run: the most the role may set a group to."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags for the role."""


class ControllerRole(GoogleTrustedRole):
    """The IAM role a GCP home's controller function assumes with its Google identity to size the AWS groups."""

    def __init__(self, name: str, args: ControllerRoleArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:aws:ControllerRole", name, None, opts)
        partition, account_id = deployer_account(self)
        groups, nodes = list(args.groups), args.nodes
        self._trusted_role(
            name, unique_id=args.service_account_unique_id, audience=args.audience, tags=args.tags,
            role_name=args.role_name,
            description="trainstack placement controller of a GCP home: this stack's AWS groups, by its Google identity",
            policy=pulumi.Output.all(partition, account_id).apply(lambda v: json.dumps(
                aws_group_policy(groups=groups, nodes=nodes, account_id=v[1], partition=v[0]))),
        )
