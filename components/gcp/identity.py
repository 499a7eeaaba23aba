"""InstanceIdentity: the service account a stack's machines run as, and what it may do.

Least privilege for one run, granted on the resources themselves: objects under this
run's prefix of this stack's bucket (read/write/delete), the trainer code (read), the
data set's bucket when it is in GCS (read, unless run.dataGrant is false), this stack's image repository (pull;
with a built image, its copy in each placement's region too), and resizing
only this stack's instance group (a custom role with two permissions, under an IAM
condition naming the group, and one to follow the resize's operation). The machine reads its identity from the metadata server;
several machines find each other under the run folder (`rendezvous/`), not by listing instances.

PlacementIdentity: the account of a placement's machines in another project than home's (its own
group only; on a GCP home's bucket, what the home account has there: `bucket_grants`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp
import pulumi_random as random

from components.gcp.naming import ROLE_SUFFIX_BYTES, custom_role_id, split_gs_uri
from runfolder import layout

# What the machine's finish step needs to set its own group's size to zero. GCE's IAM
# cannot look at the size a resize asks for (no request attributes in its conditions), so
# the narrowest grant is this pair on the one group, by name.
RESIZE_PERMISSIONS = ["compute.instanceGroupManagers.get", "compute.instanceGroupManagers.update"]
# `gcloud compute instance-groups managed resize` then waits on the region operation the
# resize started; without this it reports failure although the resize went through. The
# operation is another resource than the group, so the group-name condition above can
# never match it: a separate, read-only grant (operation metadata of the project's region
# operations, nothing else).
OPERATION_PERMISSIONS = ["compute.regionOperations.get"]


@dataclass(kw_only=True)
class InstanceIdentityArgs:
    """Inputs of an InstanceIdentity."""

    account_id: str
    """The service account id (6-30 characters)."""
    gcp_project: str
    """The GCP project of every resource."""
    bucket_name: pulumi.Input[str]
    """The stack's bucket."""
    run_id: str
    """The run's folder: the account may write only under runs/<run_id>/."""
    repository_id: pulumi.Input[str]
    """The stack's Artifact Registry repository (pull only)."""
    other_repositories: list[tuple[str, pulumi.Input[str]]] = field(default_factory=list)
    """(region, repository id) of the built image's repositories in the other placements' regions (pull
    only): a placement's machines pull from their own region's."""
    region: str
    """The region of the repository and the group."""
    group_name: str
    """The managed instance group the account may resize (and nothing else)."""
    other_groups: list[tuple[str, str]] = field(default_factory=list)
    """(region, group name) of the stack's other placements in this project: the account may resize
    these too (one service account serves every placement's machines)."""
    custom_role_prefix: str
    """The start of the custom roles' ids; a random suffix kept in the stack's state follows."""
    data_uri: str | None = None
    """gs://BUCKET/PREFIX of the training data, read only; None for synthetic data."""
    validation_data_uri: str | None = None
    """gs://BUCKET/PREFIX of the validation data (run.validationDataUri), read only; None without."""
    data_grant: bool = True
    """Grant the account read access on the data buckets; False when they are public or their owner grants it."""
    nodes: int = 1
    """Machines in the group (they find each other under the run folder: no extra grant)."""


def prefix_condition(bucket: pulumi.Input[str], prefix: str) -> pulumi.Output[str]:
    """CEL: objects under `prefix` of `bucket`, plus listing the bucket.

    GCS checks `objects.list` against the bucket itself, so a prefix-only condition would
    forbid listing; allowing the bucket resource lets the trainer list (names only) while
    reads and writes stay inside the prefix.
    """
    return pulumi.Output.concat(
        'resource.type == "storage.googleapis.com/Bucket" || resource.name.startsWith("projects/_/buckets/',
        bucket, "/objects/", prefix, '")',
    )


def groups_condition(gcp_project: str, groups: list[tuple[str, str]]) -> str:
    """The IAM condition naming each (region, name) managed instance group, and nothing else."""
    return " || ".join(
        f'resource.name == "projects/{gcp_project}/regions/{region}/instanceGroupManagers/{name}"'
        for region, name in groups)


def group_grants(name: str, *, gcp_project: str, custom_role_prefix: str, groups: list[tuple[str, str]],
                 member: pulumi.Input[str], child: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    """What a machine's finish step needs on its groups (each (region, name) in `gcp_project`): resize them,
    by name (a custom role under an IAM condition), and follow the resize's region operation."""
    # GCP reserves a deleted custom role's id for up to 37 days: a suffix drawn once and
    # kept in state keeps the ids stable across `up`s, and new after a `destroy`.
    suffix = random.RandomId(f"{name}-role-suffix", byte_length=ROLE_SUFFIX_BYTES, opts=child)
    role, operations = [
        gcp.projects.IAMCustomRole(
            f"{name}-{resource}-role",
            project=gcp_project,
            role_id=suffix.hex.apply(lambda h, kind=kind: custom_role_id(custom_role_prefix, h, kind)),
            title=title,
            permissions=permissions,
            opts=child,
        )
        for resource, kind, title, permissions in (
            ("resize", "resize", "trainstack: resize own instance group", RESIZE_PERMISSIONS),
            ("operations", "ops", "trainstack: follow own resize operations", OPERATION_PERMISSIONS),
        )
    ]
    return [
        gcp.projects.IAMMember(
            f"{name}-resize",
            project=gcp_project,
            role=role.name,
            member=member,
            condition=gcp.projects.IAMMemberConditionArgs(
                title="own group only" if len(groups) == 1 else "own groups only",
                expression=groups_condition(gcp_project, groups),
            ),
            opts=child,
        ),
        gcp.projects.IAMMember(
            f"{name}-operations", project=gcp_project, role=operations.name, member=member, opts=child
        ),
    ]


@dataclass(kw_only=True)
class BucketAccess:
    """What a machine account may reach of home's bucket and the run's data: the run's prefix
    (read/write/delete), the trainer code (read), `cache/` (read and create) and the data
    buckets (read, unless `data_grant` is False)."""

    bucket_name: pulumi.Input[str]
    """Home's bucket."""
    run_id: str
    """The run's folder: the account may write only under runs/<run_id>/."""
    data_uri: str | None = None
    """gs://BUCKET/PREFIX of the training data, read only; None for synthetic data."""
    validation_data_uri: str | None = None
    """gs://BUCKET/PREFIX of the validation data (run.validationDataUri), read only; None without."""
    data_grant: bool = True
    """Grant the account read access on the data buckets; False when they are public or their owner grants it."""


def bucket_grants(name: str, access: BucketAccess, *, member: pulumi.Input[str],
                  child: pulumi.ResourceOptions, code: bool = True) -> list[pulumi.Resource]:
    """The grants `access` describes, to `member`: on home's bucket under IAM conditions naming the
    prefixes, and on each data bucket as a whole. Without `code` no read of the trainer code: an identity
    whose image has the code baked in (a managed job's) reads none."""
    bucket = access.bucket_name

    def under(suffix: str, role: str, title: str, prefix: str) -> gcp.storage.BucketIAMMember:
        return gcp.storage.BucketIAMMember(
            f"{name}-{suffix}", bucket=bucket, role=role, member=member,
            condition=gcp.storage.BucketIAMMemberConditionArgs(title=title, expression=prefix_condition(bucket, prefix)),
            opts=child,
        )

    grants: list[pulumi.Resource] = [
        under("run-objects", "roles/storage.objectUser", "this run's prefix", layout.run_prefix(access.run_id)),
        *([under("code-read", "roles/storage.objectViewer", "trainer code", layout.CODE_PREFIX)] if code else []),
        # cache/: the trainer's packages, archived by the first machine that installs them and
        # unpacked by the later ones (trainer/pip_cache.sh), and each data set's record counts
        # (trainer/staging.py). Read, and create only:
        # objectCreator cannot overwrite or delete, so an entry is written once.
        under("cache-read", "roles/storage.objectViewer", "package cache (read)", layout.CACHE_PREFIX),
        under("cache-write", "roles/storage.objectCreator", "package cache (create)", layout.CACHE_PREFIX),
    ]
    granted: set[str] = set()
    for suffix, uri in (("data-read", access.data_uri), ("validation-read", access.validation_data_uri)):
        if not uri or not access.data_grant:
            continue
        data_bucket, _ = split_gs_uri(uri)
        if data_bucket in granted:
            continue  # the validation data beside the training data: one grant covers both
        granted.add(data_bucket)
        # The whole bucket, read only, with no condition: IAM conditions need uniform
        # bucket-level access and policy version 3 on that bucket, and a user's bucket with
        # fine-grained ACLs refuses them (412). A bucket whose policy the deployer cannot set
        # (a public data set of another project: 403) takes run.dataGrant: false.
        grants.append(
            gcp.storage.BucketIAMMember(
                f"{name}-{suffix}",
                bucket=data_bucket,
                role="roles/storage.objectViewer",
                member=member,
                opts=child,
            )
        )
    return grants


class MachineAccount(pulumi.ComponentResource):
    """A service account machines run as, and its grants: what `InstanceIdentity` and `PlacementIdentity`
    each grant their own way."""

    account: gcp.serviceaccount.Account
    email: pulumi.Output[str]
    grants: list[pulumi.Resource]
    """Every grant, in the order declared: what the machines' group waits for."""

    def _account(self, name: str, *, account_id: str, display_name: str, description: str,
                 gcp_project: str | None = None) -> pulumi.Output[str]:
        """Declare the account (`{name}-sa`, in the provider's project unless `gcp_project`); its IAM member."""
        self.account = gcp.serviceaccount.Account(
            f"{name}-sa", account_id=account_id, project=gcp_project, display_name=display_name,
            description=description, opts=pulumi.ResourceOptions(parent=self),
        )
        self.email = self.account.email
        return pulumi.Output.concat("serviceAccount:", self.account.email)


class InstanceIdentity(MachineAccount):
    """Service account plus the narrow grants one run needs."""

    def __init__(self, name: str, args: InstanceIdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:InstanceIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        member = self._account(name, account_id=args.account_id, display_name="trainstack machines",
                               description="one run's bucket prefix, image pull, own group")
        self.grants = bucket_grants(
            name, BucketAccess(bucket_name=args.bucket_name, run_id=args.run_id, data_uri=args.data_uri,
                               validation_data_uri=args.validation_data_uri, data_grant=args.data_grant),
            member=member, child=child)
        self.grants += [
            gcp.artifactregistry.RepositoryIamMember(
                f"{name}-image-pull",
                repository=args.repository_id,
                location=args.region,
                role="roles/artifactregistry.reader",
                member=member,
                opts=child,
            ),
            *[gcp.artifactregistry.RepositoryIamMember(
                f"{name}-image-pull-{location}",
                repository=repository,
                location=location,
                role="roles/artifactregistry.reader",
                member=member,
                opts=child,
            ) for location, repository in args.other_repositories],
        ]
        self.grants += group_grants(
            name, gcp_project=args.gcp_project, custom_role_prefix=args.custom_role_prefix,
            groups=[(args.region, args.group_name), *args.other_groups], member=member, child=child)
        self.register_outputs({"email": self.email})


@dataclass(kw_only=True)
class PlacementIdentityArgs:
    """Inputs of a PlacementIdentity."""

    account_id: str
    """The service account id (6-30 characters)."""
    gcp_project: str
    """The placement's project."""
    region: str
    """The placement's region."""
    group_name: str
    """The placement's managed instance group: the only one the account may resize."""
    custom_role_prefix: str
    """The start of the custom roles' ids; a random suffix kept in the stack's state follows."""
    bucket: BucketAccess | None = None
    """Home's bucket and the run's data, when home is on GCP: the account gets there what home's machine
    account gets. None when the run folder is in S3 (reached through components/aws/federation.py's role)."""


class PlacementIdentity(MachineAccount):
    """The service account of the machines of a placement in another project than home's.

    Made in the placement's project: GCE runs a group's machines only as an account of the group's own
    project unless the organization lifts `iam.disableCrossProjectServiceAccountUsage`. It may resize its
    own group (the finish step; the runtime cap's scheduler job runs as it too) and follow that resize's
    operation. With `bucket` (a GCP home), home grants it on its bucket directly, as it grants its own
    machines; without (an AWS home), it has nothing in GCS.
    """

    unique_id: pulumi.Output[str]

    def __init__(self, name: str, args: PlacementIdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainstack:gcp:PlacementIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        member = self._account(
            name, account_id=args.account_id, gcp_project=args.gcp_project,
            display_name="trainstack machines (placement)",
            description="own group's size; the run's bucket through its AWS role" if args.bucket is None
            else "own group's size; one run's prefix of home's bucket")
        self.grants = [] if args.bucket is None else bucket_grants(name, args.bucket, member=member, child=child)
        self.grants += group_grants(name, gcp_project=args.gcp_project, custom_role_prefix=args.custom_role_prefix,
                                    groups=[(args.region, args.group_name)], member=member, child=child)
        self.unique_id = self.account.unique_id
        self.register_outputs({"email": self.email, "unique_id": self.unique_id})
