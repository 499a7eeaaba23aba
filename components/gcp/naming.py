"""Deterministic names for the GCP resources whose names others must know in advance.

The machines' env file names the managed instance group and the bucket before either
exists, and the service account's IAM bindings name the group, so these names are
computed from the project, stack and GCP project instead of random suffixes. Custom role
ids are the exception: GCP keeps a deleted one reserved for weeks, so they end in random
hex kept in the stack's state (`custom_role_id`). Also the names of the APIs the stack
turns on, of those that must be on before it can, and of a gs:// URI's bucket (``split_gs_uri``).

No Pulumi provider is imported here: ``ops preflight`` reads these names without loading
``pulumi_gcp`` (seconds of start-up).
"""

from __future__ import annotations

import re

from components.common import short_digest, slug
from components.settings import bucket_name_problem

# Turned on first: project-level IAM grants (the resize and peer-listing roles) read and
# write the project's IAM policy through the Cloud Resource Manager API, and the
# provider's reads of the other APIs' state go through it too. A fresh project has it off.
RESOURCE_MANAGER_API = "cloudresourcemanager.googleapis.com"
# The APIs the stack's resources live in, turned on after the Resource Manager API; a new
# project has most of them off.
APIS = (
    RESOURCE_MANAGER_API,
    "artifactregistry.googleapis.com",
    "cloudscheduler.googleapis.com",
    "compute.googleapis.com",
    "iam.googleapis.com",
    "storage.googleapis.com",
)
# What must be on before the first `pulumi up`, because turning the others on goes through
# them: `gcloud services enable cloudresourcemanager.googleapis.com serviceusage.googleapis.com`.
PREREQUISITE_APIS = (RESOURCE_MANAGER_API, "serviceusage.googleapis.com")


def default_bucket_name(*, project: str, stack: str, gcp_project: str, region: str) -> str:
    """A valid GCS bucket name, the same on every `pulumi up` of this stack in this GCP project.

    GCS names are global: the GCP project and region go into the hash so two users with a
    stack called `dev` do not collide. GCS refuses "google" anywhere in a name.
    """
    stem = f"{slug(project, 20)}-{slug(stack, 28)}".replace("google", "g")
    name = f"{stem}-{short_digest(project, stack, gcp_project, region, n=12)}"
    problem = bucket_name_problem("gcp", name)
    if problem:  # unreachable for slugs; kept so a future change cannot ship a bad name
        raise ValueError(f"generated bucket name {name!r}: {problem}")
    return name


def _rfc1035(text: str, limit: int) -> str:
    """A GCE resource name: starts with a letter, lowercase, digits and '-', ends alphanumeric."""
    s = slug(text, limit)
    return s if s[0].isalpha() else f"t{s}"[:limit].rstrip("-")


def group_name(*, project: str, stack: str, run_id: str | None = None) -> str:
    """The regional managed instance group's name (unique per GCP project and region).

    A run id other than the stack's own name is part of it (after `--`, which no slug
    holds; a digest of it when the name would be too long): a new `run.id` is a new group,
    launched at `nodes` with a fresh runtime cap, while the old run's group is deleted.
    """
    stem = _rfc1035(f"{project}-{stack}", 50)
    if run_id and run_id != stack:
        run = slug(run_id, 63)
        if len(stem) + 2 + len(run) > 50:
            run = short_digest(run_id, n=8)
            stem = stem[: 50 - 2 - len(run)].rstrip("-")
        stem = f"{stem}--{run}"
    return f"{stem}-gpu"


def repository_name(*, project: str, stack: str) -> str:
    """The Artifact Registry repository of this stack's trainer image."""
    return _rfc1035(f"{project}-{stack}", 63)


def service_account_id(*, project: str, stack: str) -> str:
    """The machines' service account id: 6-30 characters, unique per stack."""
    return f"ts-{slug(stack, 18)}-{short_digest(project, stack, n=6)}"


def controller_account_ids(*, project: str, stack: str) -> tuple[str, str]:
    """The placement controller's service account id and its scheduler's invoker's: 6-30 characters each."""
    digest = short_digest(project, stack, "controller", n=6)
    return f"tc-{slug(stack, 18)}-{digest}", f"ti-{slug(stack, 18)}-{digest}"


def controller_build_account_id(*, project: str, stack: str) -> str:
    """The service account the placement controller's function is built as (Cloud Build): 6-30 characters."""
    digest = short_digest(project, stack, "controller", n=6)
    return f"tb-{slug(stack, 18)}-{digest}"


# The VPC network the machines and their firewall rules use (ops preflight checks it is there).
MACHINE_NETWORK = "default"


def network_tag(*, project: str, stack: str) -> str:
    """The network tag the firewall rules select this stack's machines by."""
    return _rfc1035(f"{project}-{stack}", 63)


# Random bytes in each custom role id (8 hex digits). A deleted custom role's id stays
# reserved for up to 37 days (7 soft-deleted, then up to 30 more), so an id fixed per stack
# could not be created again by `pulumi up` after `pulumi destroy`; the suffix is a
# RandomId kept in the stack's state: the same on every `up`, new after a `destroy`.
ROLE_SUFFIX_BYTES = 4


def custom_role_prefix(*, project: str, stack: str) -> str:
    """The part of this stack's custom role ids that names it (the random suffix follows)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", f"{project}_{stack}")[:47]


def custom_role_id(prefix: str, suffix: str, purpose: str) -> str:
    """A project custom role id: `prefix`, the random `suffix` (hex), and what the role is for.

    GCP takes 3-64 letters, digits, '_' and '.'; 47 + 1 + 8 + 1 + 6 ("resize") stays under 64.
    """
    return f"{prefix[:47]}_{suffix}_{purpose}"


def key_ring_name(prefix: str, suffix: str) -> str:
    """The signing key's key ring: `prefix` (the stack's name, `key_ring_prefix`) and the random `suffix` (hex).
    Cloud KMS never deletes a key ring, so a fixed name could not be made again after `pulumi destroy`; it takes
    1-63 letters, digits, '_' and '-'."""
    return f"{prefix[:54]}-{suffix}"


def key_ring_prefix(*, project: str, stack: str) -> str:
    """The part of this stack's key ring name that names it (the random suffix follows)."""
    return slug(f"{project}-{stack}", 54)


def split_gs_uri(uri: str) -> tuple[str, str]:
    """('bucket', 'prefix') of gs://bucket/prefix."""
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    return bucket, prefix


def placement_account_ids(*, project: str, stack: str, index: int) -> tuple[str, str]:
    """The service account ids of placement `index` in its own project (of an AWS home's stack, or of a GCP
    home's in another project than home's): its machines' and home's controller's (an AWS home's only).
    6-30 characters each."""
    digest = short_digest(project, stack, f"placement-{index}", n=6)
    return f"tm{index}-{slug(stack, 17)}-{digest}", f"tc{index}-{slug(stack, 17)}-{digest}"


def placement_role_prefix(*, project: str, stack: str, index: int) -> str:
    """The start of the custom role ids of placement `index` in its own project (`custom_role_prefix`, marked
    with the placement so that two placements in one project, or home's, never share an id)."""
    return f"{custom_role_prefix(project=project, stack=stack)[:44]}_p{index}"
