"""Deterministic names for the AWS resources whose names others must know in advance.

The machines' env file names the Auto Scaling group and the bucket before either exists
(the launch template is an input of the group), so these names are computed from the
project, stack and account instead of being left to Pulumi's random suffixes.
"""

from __future__ import annotations

from components.common import short_digest, slug
from components.settings import bucket_name_problem


def default_bucket_name(*, project: str, stack: str, account_id: str, region: str) -> str:
    """A valid S3 bucket name, the same on every `pulumi up` of this stack in this account.

    S3 names are global across all AWS accounts: the account and region go into the hash
    so two users with a stack called `dev` do not collide.
    """
    digest = short_digest(project, stack, account_id, region, n=12)
    name = f"{slug(project, 20)}-{slug(stack, 28)}-{digest}"
    problem = bucket_name_problem("aws", name)
    if problem:  # unreachable for slugs; kept so a future change cannot ship a bad name
        raise ValueError(f"generated bucket name {name!r}: {problem}")
    return name


def group_name(*, project: str, stack: str, run_id: str | None = None) -> str:
    """The Auto Scaling group's name (unique per account and region, like the stack).

    A run id other than the stack's own name is part of it (after `--`, which no slug
    holds): a new `run.id` is a new group, launched at `nodes` with a fresh runtime cap,
    while the old run's group, already at zero, is deleted.
    """
    base = f"{slug(project, 40)}-{slug(stack, 160)}"
    if run_id and run_id != stack:
        run = slug(run_id, 63)
        # Auto Scaling group names stop at 255 characters (the placement group adds 10 more).
        if len(base) + 2 + len(run) + len("-gpu-placement") > 255:
            run = short_digest(run_id, n=8)
        base += f"--{run}"
    return f"{base}-gpu"


def repository_name(*, project: str, stack: str) -> str:
    """The ECR repository of this stack's trainer image."""
    return f"{slug(project, 40)}/{slug(stack, 160)}"
