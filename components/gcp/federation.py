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
- `MachineAccess`: a GCP home's AWS placement, the other way round: its EC2 machines, whose run folder is
  in home's bucket, reach it with no key. A pool in home's project with an AWS provider trusting the
  placement's AWS account, whose attribute condition admits the machines' role only; a service account
  of home's project that principal set may impersonate, granted on home's bucket what home's machines
  get there (`components.gcp.identity.bucket_grants`). The machines take the provider (`audience`) and
  the account (`email`) from their env file (`components.userdata.gcs_store_env`).

Both build the pool and its provider with `aws_pool`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_random as random

from components.gcp.controller import GROUP_PERMISSIONS
from components.gcp.identity import BucketAccess, bucket_grants, groups_condition
from components.gcp.naming import ROLE_SUFFIX_BYTES, custom_role_id

# The assumed-role ARN without its session name: what the condition and the binding below compare.
AWS_ROLE_EXPRESSION = ("assertion.arn.contains('assumed-role')"
                       " ? assertion.arn.extract('{account_arn}assumed-role/')"
                       " + 'assumed-role/' + assertion.arn.extract('assumed-role/{role_name}/')"
                       " : assertion.arn")
# The AWS provider's default mapping, except the subject. Google's STS refuses a mapped `google.subject` over
# 127 bytes, and the default (`assertion.arn`, the whole assumed-role ARN) carries the session name: a Lambda's
# is its function's name, which the ARN then holds twice (40 + 2 x 64 bytes at most). Without the session the
# subject is bounded by IAM's 64-character role names (`subject_bytes_worst_case`). No binding names a
# `principal://…/subject/`: the grants name the principal set of `attribute.aws_role`.
AWS_ATTRIBUTE_MAPPING = {
    "google.subject": AWS_ROLE_EXPRESSION,
    "attribute.aws_role": AWS_ROLE_EXPRESSION,
}
# Google's limit on a mapped `google.subject`, in bytes.
SUBJECT_MAX_BYTES = 127
# The longest of each part of an assumed-role ARN: the partition (`aws-us-gov`), the account, an IAM role's
# name and a session's name (a Lambda's is its function's name; an EC2 machine's, its instance id).
LONGEST_PARTITION = "aws-us-gov"
LONGEST_NAME = 64
PROVIDER_ID = "aws-controller"
MACHINES_PROVIDER_ID = "aws-machines"
# What a caller's audience names: the provider's full resource name under iam.googleapis.com.
AUDIENCE_PREFIX = "//iam.googleapis.com/"


def _cel_value(expression: str, arn: str) -> str:
    """The value of the few CEL forms the mapping uses (`assertion.arn`, its `contains`/`extract`, string
    literals, `+`, `? :`), for a caller whose ARN is `arn`; anything else is refused."""
    expression = expression.strip()
    cond, sep, branches = expression.partition(" ? ")
    if sep:
        then, colon, otherwise = branches.rpartition(" : ")
        test = re.fullmatch(r"assertion\.arn\.contains\('([^']*)'\)", cond.strip())
        if not (colon and test):
            raise ValueError(f"unsupported CEL condition: {expression!r}")
        return _cel_value(then if test.group(1) in arn else otherwise, arn)
    out = []
    for term in (t.strip() for t in expression.split(" + ")):
        if term == "assertion.arn":
            out.append(arn)
        elif literal := re.fullmatch(r"'([^']*)'", term):
            out.append(literal.group(1))
        elif extract := re.fullmatch(r"assertion\.arn\.extract\('([^{']*)\{\w+\}([^']*)'\)", term):
            # Google's `extract`: the text between the template's prefix and suffix, or "" when absent.
            prefix, suffix = extract.groups()
            found = re.search(re.escape(prefix) + "(.*?)" + re.escape(suffix), arn)
            out.append(found.group(1) if found else "")
        else:
            raise ValueError(f"unsupported CEL term: {term!r}")
    return "".join(out)


def mapped_subject(arn: str, mapping: dict[str, str] | None = None) -> str:
    """The `google.subject` the provider's mapping gives a caller whose (assumed-role) ARN is `arn`."""
    return _cel_value((mapping or AWS_ATTRIBUTE_MAPPING)["google.subject"], arn)


def worst_case_arn(role_name: str) -> str:
    """The longest assumed-role ARN a session of `role_name` can present: the longest partition and a
    session name of IAM's longest."""
    return f"arn:{LONGEST_PARTITION}:sts::123456789012:assumed-role/{role_name}/{'s' * LONGEST_NAME}"


def subject_bytes_worst_case(role_name: str, mapping: dict[str, str] | None = None) -> int:
    """The bytes of the longest `google.subject` a session of `role_name` is mapped to."""
    return len(mapped_subject(worst_case_arn(role_name), mapping).encode())


def assumed_role_arn(partition: pulumi.Input[str], account_id: pulumi.Input[str],
                     role_name: pulumi.Input[str]) -> pulumi.Output[str]:
    """`arn:aws:sts::ACCOUNT:assumed-role/ROLE`: what `attribute.aws_role` holds for any session of that role."""
    return pulumi.Output.concat("arn:", partition, ":sts::", account_id, ":assumed-role/", role_name)


def pool_id(stem: str, suffix: str) -> str:
    """A workload identity pool id: 4-32 of [a-z0-9-], not starting with `gcp-`. A deleted pool's id
    stays taken for 30 days, so a random suffix kept in state follows the stack's stem."""
    return f"ts-{stem[:20].strip('-')}-{suffix}"


@dataclass(frozen=True)
class AwsPool:
    """A workload identity pool whose one AWS provider admits the sessions of one IAM role."""

    suffix: random.RandomId
    """The random part of the pool's id, kept in state (other ids of the same owner may use it too)."""
    pool: gcp.iam.WorkloadIdentityPool
    provider: gcp.iam.WorkloadIdentityPoolProvider
    principal_set: pulumi.Output[str]
    """`principalSet://iam.googleapis.com/<pool name>/attribute.aws_role/<assumed-role ARN>`: that role's sessions."""
    audience: pulumi.Output[str]
    """What a caller's token exchange names: `//iam.googleapis.com/` + the provider's full name."""


def aws_pool(name: str, *, gcp_project: str, pool_stem: str, provider_id: str, aws_account_id: pulumi.Input[str],
             aws_partition: pulumi.Input[str], role_name: pulumi.Input[str], display_name: str, description: str,
             provider_display_name: str, provider_description: str, child: pulumi.ResourceOptions) -> AwsPool:
    """A pool in `gcp_project` with an AWS provider trusting `aws_account_id`, whose attribute condition admits
    the role `role_name`'s sessions only (`attribute.aws_role`, the assumed-role ARN without its session)."""
    suffix = random.RandomId(f"{name}-suffix", byte_length=ROLE_SUFFIX_BYTES, opts=child)
    pool = gcp.iam.WorkloadIdentityPool(
        f"{name}-pool",
        project=gcp_project,
        workload_identity_pool_id=suffix.hex.apply(lambda h: pool_id(pool_stem, h)),
        display_name=display_name,
        description=description,
        opts=child,
    )
    role_arn = assumed_role_arn(aws_partition, aws_account_id, role_name)
    provider = gcp.iam.WorkloadIdentityPoolProvider(
        f"{name}-provider",
        project=gcp_project,
        workload_identity_pool_id=pool.workload_identity_pool_id,
        workload_identity_pool_provider_id=provider_id,
        display_name=provider_display_name,
        description=provider_description,
        aws=gcp.iam.WorkloadIdentityPoolProviderAwsArgs(account_id=aws_account_id),
        attribute_mapping=AWS_ATTRIBUTE_MAPPING,
        attribute_condition=pulumi.Output.concat('attribute.aws_role == "', role_arn, '"'),
        opts=child,
    )
    return AwsPool(
        suffix=suffix, pool=pool, provider=provider,
        principal_set=pulumi.Output.concat("principalSet://iam.googleapis.com/", pool.name, "/attribute.aws_role/",
                                           role_arn),
        audience=pulumi.Output.concat(AUDIENCE_PREFIX, provider.name),
    )


def impersonation(name: str, account: gcp.serviceaccount.Account, trusted: AwsPool,
                  child: pulumi.ResourceOptions) -> gcp.serviceaccount.IAMMember:
    """`roles/iam.workloadIdentityUser` on `account` for the principal set `trusted` admits, and no one else."""
    return gcp.serviceaccount.IAMMember(
        f"{name}-impersonate",
        service_account_id=account.name,
        role="roles/iam.workloadIdentityUser",
        member=trusted.principal_set,
        opts=child,
    )


@dataclass(kw_only=True)
class FederatedAccountArgs:
    """What both ways an AWS role reaches GCP share: a pool trusting that role, and the account it impersonates."""

    gcp_project: str
    """The project the pool, the provider and the service account are made in."""
    account_id: str
    """The service account's id in that project (6-30 characters)."""
    pool_stem: str
    """The stack's part of the pool's id (`pool_id`)."""
    aws_account_id: pulumi.Input[str]
    """The AWS account of the admitted role: the provider accepts its identities only."""
    aws_partition: pulumi.Input[str]
    """That account's AWS partition (`aws`)."""


@dataclass(kw_only=True)
class ControllerAccessArgs(FederatedAccountArgs):
    """Inputs of a ControllerAccess (the placement's project; the controller's service account id there)."""

    region: str
    """The placement's region."""
    group_name: str
    """The placement's group: the only one the controller's account may read and resize."""
    custom_role_prefix: str
    """The start of the custom role's id; a random suffix kept in the stack's state follows."""
    controller_role_name: pulumi.Input[str]
    """The controller function's IAM role: the one AWS identity admitted."""


@dataclass(kw_only=True)
class MachineAccessArgs(FederatedAccountArgs):
    """Inputs of a MachineAccess (home's project; the machines' service account id there)."""

    bucket: BucketAccess
    """Home's bucket and the run's data: the account gets there what home's machine account gets."""
    machine_role_name: pulumi.Input[str]
    """The placement's machines' IAM role (their instance profile's): the one AWS identity admitted."""


class FederatedAccount(pulumi.ComponentResource):
    """An AWS role's sessions reaching GCP as one service account: a pool trusting that role, the account, and
    the role's right to impersonate it (`grants`). Each kind below adds what the account may do."""

    pool: gcp.iam.WorkloadIdentityPool
    provider: gcp.iam.WorkloadIdentityPoolProvider
    account: gcp.serviceaccount.Account
    audience: pulumi.Output[str]
    email: pulumi.Output[str]

    def _trust(self, name: str, args: FederatedAccountArgs, *, role_name: pulumi.Input[str], provider_id: str,
               pool_texts: tuple[str, str], provider_texts: tuple[str, str], account_texts: tuple[str, str],
               child: pulumi.ResourceOptions) -> AwsPool:
        """Make the pool, its provider and the account ((display name, description) of each); returns the pool."""
        trusted = aws_pool(
            name, gcp_project=args.gcp_project, pool_stem=args.pool_stem, provider_id=provider_id,
            aws_account_id=args.aws_account_id, aws_partition=args.aws_partition, role_name=role_name,
            display_name=pool_texts[0], description=pool_texts[1], provider_display_name=provider_texts[0],
            provider_description=provider_texts[1], child=child)
        self.pool, self.provider = trusted.pool, trusted.provider
        self.account = gcp.serviceaccount.Account(
            f"{name}-sa", account_id=args.account_id, project=args.gcp_project, display_name=account_texts[0],
            description=account_texts[1], opts=child,
        )
        self.audience = trusted.audience
        self.email = self.account.email
        return trusted


class ControllerAccess(FederatedAccount):
    """Home's AWS controller reaching one GCP placement's group, by workload identity federation."""

    def __init__(self, name: str, args: ControllerAccessArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:ControllerAccess", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        trusted = self._trust(
            name, args, role_name=args.controller_role_name, provider_id=PROVIDER_ID,
            pool_texts=("trainstack controller", "home's AWS placement controller: resizes this project's trainstack group"),
            provider_texts=("trainstack AWS controller",
                            "the controller function's role in home's AWS account, nothing else"),
            account_texts=("trainstack placement controller", "home's AWS controller: this placement's group only"),
            child=child)
        self.grants: list[pulumi.Resource] = [impersonation(name, self.account, trusted, child)]
        role = gcp.projects.IAMCustomRole(
            f"{name}-group-role",
            project=args.gcp_project,
            role_id=trusted.suffix.hex.apply(lambda h: custom_role_id(args.custom_role_prefix, h, "ctl")),
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
        self.register_outputs({"audience": self.audience, "email": self.email})


class MachineAccess(FederatedAccount):
    """A GCP home's AWS placement's machines reaching home's bucket, by workload identity federation."""

    def __init__(self, name: str, args: MachineAccessArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:MachineAccess", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        trusted = self._trust(
            name, args, role_name=args.machine_role_name, provider_id=MACHINES_PROVIDER_ID,
            pool_texts=("trainstack AWS machines",
                        "a trainstack run's machines on AWS: one run's prefix of this project's bucket"),
            provider_texts=("trainstack AWS machines", "the machines' role in the placement's AWS account, nothing else"),
            account_texts=("trainstack machines (AWS placement)",
                           "one run's prefix of home's bucket, for the AWS placement's machine role"),
            child=child)
        self.grants: list[pulumi.Resource] = [
            *bucket_grants(name, args.bucket, member=pulumi.Output.concat("serviceAccount:", self.account.email),
                           child=child),
            impersonation(name, self.account, trusted, child),
        ]
        self.register_outputs({"audience": self.audience, "email": self.email})
