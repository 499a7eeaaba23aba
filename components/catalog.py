"""What the stack knows about each cloud's GPU machines and regions.

Used by settings validation to catch a machine type of the wrong cloud, a GPU count the
machine cannot have, or a zone outside the region, before anything is created. The table
holds the GPU machine families people train on; an unknown type of a known family is
refused with the list of known ones, so a typo does not reach the cloud.
"""

from __future__ import annotations

import re

# AWS instance type -> GPUs it has (NVIDIA, per instance).
AWS_GPU_INSTANCES: dict[str, int] = {
    "g4dn.xlarge": 1, "g4dn.2xlarge": 1, "g4dn.4xlarge": 1, "g4dn.8xlarge": 1,
    "g4dn.16xlarge": 1, "g4dn.12xlarge": 4, "g4dn.metal": 8,
    "g5.xlarge": 1, "g5.2xlarge": 1, "g5.4xlarge": 1, "g5.8xlarge": 1, "g5.16xlarge": 1,
    "g5.12xlarge": 4, "g5.24xlarge": 4, "g5.48xlarge": 8,
    "g6.xlarge": 1, "g6.2xlarge": 1, "g6.4xlarge": 1, "g6.8xlarge": 1, "g6.16xlarge": 1,
    "g6.12xlarge": 4, "g6.24xlarge": 4, "g6.48xlarge": 8,
    "g6e.xlarge": 1, "g6e.2xlarge": 1, "g6e.4xlarge": 1, "g6e.8xlarge": 1,
    "g6e.16xlarge": 1, "g6e.12xlarge": 4, "g6e.24xlarge": 4, "g6e.48xlarge": 8,
    "p3.2xlarge": 1, "p3.8xlarge": 4, "p3.16xlarge": 8, "p3dn.24xlarge": 8,
    "p4d.24xlarge": 8, "p4de.24xlarge": 8, "p5.48xlarge": 8, "p5e.48xlarge": 8,
}

# GCE machine type -> GPUs attached with it. A2/A3/G2 machines come with their GPUs;
# N1 machines take T4/V100 accelerators by count (1, 2, 4 or 8).
GCP_GPU_MACHINES: dict[str, int] = {
    "g2-standard-4": 1, "g2-standard-8": 1, "g2-standard-12": 1, "g2-standard-16": 1,
    "g2-standard-32": 1, "g2-standard-24": 2, "g2-standard-48": 4, "g2-standard-96": 8,
    "a2-highgpu-1g": 1, "a2-highgpu-2g": 2, "a2-highgpu-4g": 4, "a2-highgpu-8g": 8,
    "a2-megagpu-16g": 16, "a2-ultragpu-1g": 1, "a2-ultragpu-2g": 2, "a2-ultragpu-4g": 4,
    "a2-ultragpu-8g": 8, "a3-highgpu-8g": 8, "a3-megagpu-8g": 8,
}
GCP_N1_GPU_COUNTS = (1, 2, 4, 8)
_GCP_N1 = re.compile(r"^n1-(standard|highmem|highcpu)-(1|2|4|8|16|32|64|96)$")

AWS_REGION = re.compile(r"^(us|eu|ap|sa|ca|me|af|il|mx)-(gov-)?[a-z]+-\d$")
GCP_REGION = re.compile(r"^[a-z]+-[a-z]+\d$")


def looks_like_aws_type(name: str) -> bool:
    """True for anything shaped like an EC2 instance type (family.size)."""
    return bool(re.match(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$", name))


def looks_like_gcp_type(name: str) -> bool:
    """True for anything shaped like a GCE machine type (family-kind-size)."""
    return bool(re.match(r"^[a-z][a-z0-9]*-[a-z]+-\d+[a-z]*$", name))


def gpus_of(cloud: str, machine_type: str) -> tuple[int, ...] | None:
    """The GPU counts this machine type can have, or None when it is not known."""
    if cloud == "aws":
        n = AWS_GPU_INSTANCES.get(machine_type)
        return None if n is None else (n,)
    n = GCP_GPU_MACHINES.get(machine_type)
    if n is not None:
        return (n,)
    if _GCP_N1.match(machine_type):
        return GCP_N1_GPU_COUNTS
    return None


def zone_in_region(cloud: str, zone: str, region: str) -> bool:
    """us-east-1a is in us-east-1 (AWS); us-central1-a is in us-central1 (GCP)."""
    if cloud == "aws":
        return bool(re.fullmatch(re.escape(region) + r"[a-z]", zone))
    return bool(re.fullmatch(re.escape(region) + r"-[a-z]", zone))
