"""The checks a GCP stack's settings must pass beyond the schema: project, zones, N1 accelerators."""

from __future__ import annotations

import re

from components import catalog
from components.settings import common
from components.settings.errors import ConfigError
from components.settings.schema import Settings


def validate(s: Settings) -> None:
    """Refuse what GCP would refuse, or what belongs to AWS, with one ConfigError naming the key."""
    c = s.compute
    if not catalog.GCP_REGION.fullmatch(s.region):
        raise ConfigError("region", f"{s.region!r}: not a GCP region name (e.g. us-central1)")
    if not re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", s.project):
        raise ConfigError("project", f"{s.project!r}: expected the GCP project id (6-30 lowercase letters, digits, '-')")

    def n1_needs_accelerator(t: str) -> None:
        if t.startswith("n1-") and not c.accelerator:
            raise ConfigError("compute.accelerator", f"is required for {t} (e.g. nvidia-tesla-t4)")

    common.check_machine_types(s, n1_needs_accelerator)
    common.check_zones(s)
    if c.subnets:
        raise ConfigError("compute.subnets[0]", f"{c.subnets[0]!r}: GCP stacks choose zones, not subnets")
    if c.image_id and not re.fullmatch(r"(projects/[a-z0-9-]+/global/images/(family/)?)?[a-z][a-z0-9-]{0,62}", c.image_id):
        raise ConfigError("compute.imageId", f"{c.image_id!r}: expected a GCE image (projects/P/global/images/NAME)")
    common.check_data_uri(s, "gs://")
    common.check_bucket_name(s)
    if c.accelerator and not all(t.startswith("n1-") for t in c.instance_types):
        raise ConfigError("compute.accelerator", f"{c.accelerator!r}: only GCP N1 machine types take an accelerator; "
                          "remove it (the other types come with their GPUs)")
    if c.accelerator:
        if c.accelerator not in catalog.GCP_N1_ACCELERATORS:
            raise ConfigError("compute.accelerator", f"{c.accelerator!r}: expected one of "
                              f"{', '.join(catalog.GCP_N1_ACCELERATORS)}")
        reason = catalog.unsupported_reason("gcp", c.accelerator, custom_image=bool(c.image_id))
        if reason:
            raise ConfigError("compute.accelerator", f"{c.accelerator!r}: {reason}")
