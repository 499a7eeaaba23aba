"""The checks an AWS stack's settings must pass beyond the schema: names and ids as AWS spells them."""

from __future__ import annotations

import re

from components import catalog
from components.settings import common
from components.settings.errors import ConfigError
from components.settings.schema import Settings


def validate(s: Settings) -> None:
    """Refuse what AWS would refuse, or what belongs to GCP, with one ConfigError naming the key."""
    c = s.compute
    if not catalog.AWS_REGION.fullmatch(s.region):
        raise ConfigError("region", f"{s.region!r}: not an AWS region name (e.g. us-east-1)")
    common.check_machine_types(s)
    common.check_zones(s)
    for i, sn in enumerate(c.subnets):
        if not re.fullmatch(r"subnet-[0-9a-f]{8,17}", sn):
            raise ConfigError(f"compute.subnets[{i}]", f"{sn!r}: expected an AWS subnet id (subnet-…)")
    if c.image_id and not re.fullmatch(r"ami-[0-9a-f]{8,17}", c.image_id):
        raise ConfigError("compute.imageId", f"{c.image_id!r}: expected an AMI id (ami-…)")
    common.check_data_uri(s, "s3://")
    if not s.run.data_grant:
        raise ConfigError("run.dataGrant", "false: only GCP stacks grant on the data bucket itself; an AWS stack's "
                          "machines read dataUri through their role (the bucket's owner allows other accounts): "
                          "remove it")
    common.check_bucket_name(s)
    if c.accelerator:
        raise ConfigError("compute.accelerator", f"{c.accelerator!r}: only GCP N1 machine types take an accelerator; "
                          "remove it (the other types come with their GPUs)")
    if s.project:
        raise ConfigError("project", f"{s.project!r}: is the GCP project id; remove it on an AWS stack")
