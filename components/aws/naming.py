"""Deterministic names for the AWS resources whose names others must know in advance, the
names of what the stack looks up (the Deep Learning AMI), and the zone several machines
share (``choose_zone``), which ``ops preflight`` must name as the program does.

The machines' env file names the Auto Scaling group and the bucket before either exists
(the launch template is an input of the group), so these names are computed from the
project, stack and account instead of being left to Pulumi's random suffixes.

No Pulumi provider is imported here: ``ops preflight`` reads these names without loading
``pulumi_aws`` (seconds of start-up).
"""

from __future__ import annotations

from components.common import short_digest, slug
from components.settings import bucket_name_problem

# The AMI the group looks up when compute.imageId is not set (SpotGroup); preflight checks
# that the region has one.
DLAMI_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)*"


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


def choose_zone(subnets: list[tuple[str, str]], zones: list[str], offerings: list[tuple[str, str]],
                instance_types: list[str]) -> tuple[str, list[str]]:
    """The zone of a cluster placement group and the group's subnets in it.

    `subnets` are the (subnet id, zone) pairs the group may use (compute.subnets, else the
    default VPC's); the candidates are their zones, narrowed to `zones` (compute.zones, in
    that order) when given, else sorted. The zone is the first candidate offering every
    instance type, else the first offering the most preferred type. `offerings` are EC2's
    (instance type, zone) pairs (DescribeInstanceTypeOfferings, availability-zone location
    type). The program and `ops preflight` both call this, so they name the same zone.
    Raises ValueError naming the key to change when no candidate zone can launch the group.
    """
    if not subnets:
        raise ValueError("compute.subnets: the group has no subnet (none given, and none in the region's default "
                         "VPC); set compute.subnets to subnets of a VPC in this region")
    covered = sorted({zone for _, zone in subnets})
    candidates = [z for z in zones if z in covered] if zones else covered
    where = ", ".join(f"{sid} ({zone})" for sid, zone in subnets) or "none"
    if not candidates:
        raise ValueError(
            f"compute.zones {zones}: no subnet of the group is in these zones (subnets: {where}); "
            "choose zones your subnets cover, or subnets in these zones (compute.subnets)")
    offered: dict[str, set[str]] = {}
    for itype, zone in offerings:
        offered.setdefault(zone, set()).add(itype)
    chosen = next((z for z in candidates if set(instance_types) <= offered.get(z, set())), None)
    if chosen is None:
        chosen = next((z for t in instance_types for z in candidates if t in offered.get(z, set())), None)
    if chosen is None:
        raise ValueError(
            f"compute.instanceTypes {instance_types}: no zone of the group's subnets ({', '.join(candidates)}) "
            "offers any of them, so several machines cannot share a cluster placement group; choose instance "
            "types these zones offer, or subnets (compute.subnets) in zones that do "
            "(aws ec2 describe-instance-type-offerings --location-type availability-zone)")
    return chosen, [sid for sid, zone in subnets if zone == chosen]
