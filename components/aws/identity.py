"""InstanceIdentity: the IAM role and instance profile a stack's machines run as.

Least privilege for one run: read/write only under this run's prefix of this stack's
bucket, read the trainer code, read the data set when it is in S3, pull from this
stack's image repository (and its copy in each placement's region, with a built image), and set only this stack's Auto Scaling group to zero (the
machine's finish path; IAM conditions refuse any other size). Nothing else: the machine reads its
identity and region from IMDS, and a group of several machines finds its peers through the
run folder (its `rendezvous/`, docs/multinode.md), not by listing instances.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

from runfolder import layout

# What the machine may do to its group: set it to zero (and nothing else, see the conditions).
SCALE_ACTIONS = ["autoscaling:UpdateAutoScalingGroup"]

_EC2_TRUST = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}


@dataclass(kw_only=True)
class InstanceIdentityArgs:
    """Inputs of an InstanceIdentity."""

    bucket_arn: pulumi.Input[str] | None
    """ARN of the stack's bucket; None when the run folder is in GCS (a GCP home's AWS placement, whose
    machines reach it through components/gcp/federation.py's `MachineAccess`): then no S3 grant at all."""
    run_id: str
    """The run's folder: the role may write only under runs/<run_id>/."""
    repository_arn: pulumi.Input[str] | None
    """ARN of the stack's ECR repository (pull only); None for a public image (no ECR grant)."""
    other_repository_arns: list[pulumi.Input[str]] = field(default_factory=list)
    """ARNs of the built image's repositories in the other placements' regions (pull only): a
    placement's machines pull from their own region's."""
    group_name: str
    """Name of the stack's Auto Scaling group (the only group the role may resize)."""
    region: str
    """The stack's region (part of the group's ARN)."""
    other_groups: list[tuple[str, str]] = field(default_factory=list)
    """(region, group name) of the stack's other placements: the role works in every region, and may set
    each of these groups to zero too (a machine scales its own group; one role serves them all)."""
    data_uri: str | None = None
    """s3://BUCKET/PREFIX of the training data, read only; None for synthetic data."""
    validation_data_uri: str | None = None
    """s3://BUCKET/PREFIX of the validation data (run.validationDataUri), read only; None without."""
    nodes: int = 1
    """Machines in the group (they find each other under the run folder: no extra grant)."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags for the role and instance profile."""


def split_s3_uri(uri: str) -> tuple[str, str]:
    """('bucket', 'prefix') of s3://bucket/prefix."""
    rest = uri.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix


def ecr_pull_statements(resource: Any) -> list[dict]:
    """Log in to ECR and pull the images of `resource` (a repository's ARN, or a list of them), nothing more."""
    return [
        {
            # GetAuthorizationToken has no resource-level permissions: AWS only accepts "*".
            # The token alone grants nothing; the pull itself is scoped below.
            "Sid": "EcrLogin",
            "Effect": "Allow",
            "Action": "ecr:GetAuthorizationToken",
            "Resource": "*",
        },
        {
            "Sid": "PullStackImage",
            "Effect": "Allow",
            "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
            "Resource": resource,
        },
    ]


def policy_document(
    *,
    partition: pulumi.Input[str],
    account_id: pulumi.Input[str],
    bucket_arn: pulumi.Input[str] | None,
    run_id: str,
    repository_arn: pulumi.Input[str] | None,
    group_name: str,
    region: str,
    data_uri: str | None,
    validation_data_uri: str | None = None,
    other_groups: list[tuple[str, str]] | None = None,
    other_repository_arns: list[pulumi.Input[str]] | None = None,
) -> pulumi.Output[str]:
    """The role's permissions as an IAM policy JSON document: without `bucket_arn` no S3 statement, without
    `repository_arn` no ECR one."""
    statements = [] if bucket_arn is None else bucket_statements(
        partition=partition, bucket_arn=bucket_arn, run_id=run_id, data_uri=data_uri,
        validation_data_uri=validation_data_uri)
    if repository_arn is not None:
        # The stack's repository; with a built image and several placements, each placement region's
        # repository too (one string for one, as a one-placement stack has always written it).
        statements += ecr_pull_statements(
            [repository_arn, *other_repository_arns] if other_repository_arns else repository_arn)
    statements += [
        {
            # The finish path's one call: update-auto-scaling-group --min-size 0 --max-size 0
            # --desired-capacity 0 (userdata/lib.sh). The group's ARN holds a UUID known
            # only after it exists; the name part pins it to this stack's group. The
            # conditions let the call only shrink the group to nothing: a request must set
            # MinSize and MaxSize, both to 0 (a missing key fails NumericEquals), and the
            # desired capacity can never exceed MaxSize. There is no DesiredCapacity key.
            # Numbers as strings, as AWS's own example policies write them.
            "Sid": "ScaleOwnGroup",
            "Effect": "Allow",
            "Action": SCALE_ACTIONS,
            "Resource": group_arns(partition, account_id, [(region, group_name), *(other_groups or [])]),
            "Condition": {"NumericEquals": {"autoscaling:MinSize": "0", "autoscaling:MaxSize": "0"}},
        },
    ]
    return pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": statements})


def bucket_statements(*, partition: pulumi.Input[str], bucket_arn: pulumi.Input[str], run_id: str,
                      data_uri: str | None, validation_data_uri: str | None = None) -> list[dict]:
    """What a machine may do in S3: this run's prefix of the bucket, the trainer code, the package cache and
    the data sets (read only). The machines' role holds these and more; a placement's federated role
    (components/aws/federation.py) exactly these."""
    # runs/<run_id>/ and below: the run folder of runfolder/layout.py. Listing is granted for the
    # prefix with its slash only: a bare runs/<run_id> would also list a sibling runs/<run_id>0/.
    run_prefix = layout.run_prefix(run_id).rstrip("/")
    statements: list[dict] = [
        {
            "Sid": "ListRunPrefix",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": bucket_arn,
            "Condition": {"StringLike": {"s3:prefix": [f"{run_prefix}/", f"{run_prefix}/*"]}},
        },
        {
            "Sid": "ReadWriteRun",
            "Effect": "Allow",
            "Action": [
                "s3:GetObject",
                "s3:PutObject",
                # Checkpoint uploads carry the tag the bucket's short noncurrent rule filters on;
                # S3 checks this action too for a write with x-amz-tagging (on the new object only:
                # no s3:PutObjectVersionTagging, and pruning is s3:DeleteObject, never a version delete).
                "s3:PutObjectTagging",
                "s3:DeleteObject",
                "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts",
            ],
            "Resource": pulumi.Output.concat(bucket_arn, f"/{run_prefix}/*"),
        },
        {
            "Sid": "ReadTrainerCode",
            "Effect": "Allow",
            "Action": "s3:GetObject",
            "Resource": pulumi.Output.concat(bucket_arn, f"/{layout.CODE_PREFIX}*"),
        },
        # cache/: the trainer's packages, archived by the first machine that installs them and
        # unpacked by the later ones (trainer/pip_cache.sh), and each data set's record counts
        # (trainer/staging.py). Listing tells a key not cached yet (an empty listing) from an
        # outage; no delete: an entry is written once.
        {
            "Sid": "ListPackageCache",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": bucket_arn,
            "Condition": {"StringLike": {"s3:prefix": [f"{layout.CACHE_PREFIX}*"]}},
        },
        {
            "Sid": "ReadWritePackageCache",
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
            "Resource": pulumi.Output.concat(bucket_arn, f"/{layout.CACHE_PREFIX}*"),
        },
    ]
    for sid, uri in (("Data", data_uri), ("ValidationData", validation_data_uri)):
        if not uri:
            continue
        data_bucket, prefix = split_s3_uri(uri)
        data_arn = pulumi.Output.concat("arn:", partition, ":s3:::", data_bucket)
        statements += [
            {
                "Sid": f"List{sid}",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": data_arn,
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
            },
            {
                "Sid": f"Read{sid}",
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": pulumi.Output.concat(data_arn, "/", prefix, "*"),
            },
        ]
    return statements


def group_arns(partition: pulumi.Input[str], account_id: pulumi.Input[str],
               groups: list[tuple[str, str]]) -> pulumi.Output[str] | list[pulumi.Output[str]]:
    """The ARN pattern of each (region, name) Auto Scaling group: one string for one group (as a
    one-placement stack has always written it), a list for several."""
    arns = [pulumi.Output.concat("arn:", partition, ":autoscaling:", region, ":", account_id,
                                 ":autoScalingGroup:*:autoScalingGroupName/", name) for region, name in groups]
    return arns[0] if len(arns) == 1 else arns


def deployer_account(parent: pulumi.Resource) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
    """The partition (`aws`, `aws-cn`, ...) and account id the stack deploys into, asked through `parent`'s
    provider: what the ARNs in a policy are made of."""
    invoke = pulumi.InvokeOptions(parent=parent)
    return aws.get_partition_output(opts=invoke).partition, aws.get_caller_identity_output(opts=invoke).account_id


def role_with_policy(parent: pulumi.Resource, name: str, *, trust: pulumi.Input[str], description: str,
                     policy: pulumi.Input[str], tags: dict[str, str], role_name: str | None = None,
                     max_session_s: int | None = None) -> tuple[aws.iam.Role, aws.iam.RolePolicy]:
    """An IAM role (`{name}-role`, named `role_name` or by Pulumi) that `trust` lets assume it, and its
    inline policy (`{name}-policy`), both children of `parent`."""
    child = pulumi.ResourceOptions(parent=parent)
    role = aws.iam.Role(f"{name}-role", name=role_name, assume_role_policy=trust, description=description,
                        max_session_duration=max_session_s, tags=tags, opts=child)
    return role, aws.iam.RolePolicy(f"{name}-policy", role=role.id, policy=policy, opts=child)


class InstanceIdentity(pulumi.ComponentResource):
    """IAM role, instance profile and scoped inline policy for a stack's machines."""

    role: aws.iam.Role
    profile: aws.iam.InstanceProfile
    policy: aws.iam.RolePolicy
    role_arn: pulumi.Output[str]
    profile_arn: pulumi.Output[str]
    profile_name: pulumi.Output[str]

    def __init__(self, name: str, args: InstanceIdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:aws:InstanceIdentity", name, None, opts)
        partition, account_id = deployer_account(self)
        self.role, self.policy = role_with_policy(
            self, name,
            trust=pulumi.Output.json_dumps(_EC2_TRUST),
            description="trainstack machines: one run's bucket prefix, image pull, own group" if args.bucket_arn is not None
            else "trainstack machines of a GCP home: own group; the run's GCS bucket by workload identity federation",
            tags=args.tags,
            policy=policy_document(
                partition=partition,
                account_id=account_id,
                bucket_arn=args.bucket_arn,
                run_id=args.run_id,
                repository_arn=args.repository_arn,
                group_name=args.group_name,
                region=args.region,
                data_uri=args.data_uri,
                validation_data_uri=args.validation_data_uri,
                other_groups=list(args.other_groups),
                other_repository_arns=list(args.other_repository_arns),
            ),
        )
        self.profile = aws.iam.InstanceProfile(f"{name}-profile", role=self.role.name, tags=args.tags,
                                               opts=pulumi.ResourceOptions(parent=self))
        self.role_arn = self.role.arn
        self.profile_arn = self.profile.arn
        self.profile_name = self.profile.name
        self.register_outputs({"role_arn": self.role_arn, "profile_arn": self.profile_arn})
