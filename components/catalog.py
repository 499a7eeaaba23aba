"""What the stack knows about each cloud's GPU machines and regions, and which ones its images can drive.

Used by settings validation to catch a machine type of the wrong cloud, a GPU count the
machine cannot have, a GPU the default image's driver or TensorFlow cannot use, or a zone
outside the region, before anything is created. The table holds the GPU machine families
people train on; an unknown type of a known family is refused with the list of known ones,
so a typo does not reach the cloud.

What the images can drive (`unsupported_reason`), from public sources:
- TensorFlow 2.21's CUDA build (.bazelrc `cuda12_version`: CUDA 12.5.1, cuDNN 9.3) carries
  kernels for sm_60, sm_70, sm_80, sm_89 and PTX for compute_90: GPUs older than compute
  capability 6.0 (K80 3.7, M60 5.2) have no kernels at all, whatever the driver.
- The default AWS AMI, "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)", ships
  NVIDIA's open kernel modules, which support Turing and newer GPUs only: not the V100
  (Volta) of P3/P3dn. AWS lists P3 and G3 under the "Proprietary Nvidia Driver" DLAMIs instead.
- The default GCE image (`ubuntu-accelerator-2204-amd64-with-nvidia-550`) has driver 550
  (CUDA 12.4). An H100 (A3, compute capability 9.0) has no TF kernel of its own and must
  JIT-compile TF's compute_90 PTX, built by CUDA 12.5: that needs driver 555 or newer.
A stack that sets compute.imageId chooses its own driver, so the driver refusals do not
apply to it; the TensorFlow ones do.
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
    "p2.xlarge": 1, "p2.8xlarge": 8, "p2.16xlarge": 16,
    "g3s.xlarge": 1, "g3.4xlarge": 1, "g3.8xlarge": 2, "g3.16xlarge": 4,
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

# Family (AWS: before the dot; GCE: the first two parts) -> the NVIDIA GPU model it carries.
# Several machines train in lockstep, so a cluster takes one model (settings.common).
AWS_GPU_MODELS: dict[str, str] = {
    "g4dn": "T4", "g5": "A10G", "g6": "L4", "g6e": "L40S", "p3": "V100 16GB", "p3dn": "V100 32GB",
    "p2": "K80", "g3": "M60", "g3s": "M60", "p4d": "A100 40GB", "p4de": "A100 80GB", "p5": "H100", "p5e": "H200",
}
GCP_GPU_MODELS: dict[str, str] = {
    "g2-standard": "L4", "a2-highgpu": "A100 40GB", "a2-megagpu": "A100 40GB", "a2-ultragpu": "A100 80GB",
    "a3-highgpu": "H100", "a3-megagpu": "H100 Mega",
}
# The GPUs an N1 machine takes (compute.accelerator).
GCP_N1_ACCELERATORS = ("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100", "nvidia-tesla-p4",
                       "nvidia-tesla-k80")

# Vertex AI names a custom job's GPUs apart from its machine type, even where Compute Engine attaches them with
# the machine: GCE machine family (its first two parts) -> the aiplatform v1 `AcceleratorType` of its GPUs.
VERTEX_ACCELERATORS: dict[str, str] = {
    "g2-standard": "NVIDIA_L4",
    "a2-highgpu": "NVIDIA_TESLA_A100",
    "a2-megagpu": "NVIDIA_TESLA_A100",
    "a2-ultragpu": "NVIDIA_A100_80GB",
    "a3-highgpu": "NVIDIA_H100_80GB",
    "a3-megagpu": "NVIDIA_H100_MEGA_80GB",
}
# The counts Vertex AI's custom training attaches of each N1 GPU (its "Configure compute resources" GPU table).
VERTEX_N1_COUNTS: dict[str, tuple[int, ...]] = {
    "NVIDIA_TESLA_T4": (1, 2, 4), "NVIDIA_TESLA_P4": (1, 2, 4), "NVIDIA_TESLA_P100": (1, 2, 4),
    "NVIDIA_TESLA_V100": (1, 2, 4, 8),
}

# What the Cloud Billing Catalog prices a GCE GPU machine by (controller/prices.py): its vCPUs and memory (GiB;
# Compute Engine's machine-type pages give memory in GB meaning GiB, the RAM SKUs' unit), and the accelerator type
# its GPUs are billed as. From Compute Engine's accelerator-optimized machine family pages (A2, A3, G2).
GCP_MACHINE_SHAPES: dict[str, tuple[int, float]] = {
    "g2-standard-4": (4, 16), "g2-standard-8": (8, 32), "g2-standard-12": (12, 48), "g2-standard-16": (16, 64),
    "g2-standard-24": (24, 96), "g2-standard-32": (32, 128), "g2-standard-48": (48, 192), "g2-standard-96": (96, 384),
    "a2-highgpu-1g": (12, 85), "a2-highgpu-2g": (24, 170), "a2-highgpu-4g": (48, 340), "a2-highgpu-8g": (96, 680),
    "a2-megagpu-16g": (96, 1360), "a2-ultragpu-1g": (12, 170), "a2-ultragpu-2g": (24, 340),
    "a2-ultragpu-4g": (48, 680), "a2-ultragpu-8g": (96, 1360), "a3-highgpu-8g": (208, 1872),
    "a3-megagpu-8g": (208, 1872),
}
GCP_MACHINE_ACCELERATORS: dict[str, str] = {
    "g2-standard": "nvidia-l4", "a2-highgpu": "nvidia-tesla-a100", "a2-megagpu": "nvidia-tesla-a100",
    "a2-ultragpu": "nvidia-a100-80gb", "a3-highgpu": "nvidia-h100-80gb", "a3-megagpu": "nvidia-h100-mega-80gb",
}
# An N1 machine's memory per vCPU (GiB) by kind.
_N1_GIB_PER_VCPU = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}

# Why TensorFlow 2.21 cannot use a GPU at all, by family prefix (see the module docstring).
_NO_TF_KERNELS = "TensorFlow 2.21's GPU kernels need compute capability 6.0 or newer"
TF_UNUSABLE: dict[str, str] = {
    "p2.": f"{_NO_TF_KERNELS}; the K80 of P2 is 3.7",
    "g3.": f"{_NO_TF_KERNELS}; the M60 of G3 is 5.2",
    "g3s.": f"{_NO_TF_KERNELS}; the M60 of G3 is 5.2",
    "nvidia-tesla-k80": f"{_NO_TF_KERNELS}; the K80 is 3.7",
}
# Why the cloud's default image cannot drive a GPU, by family prefix; a compute.imageId lifts it.
DEFAULT_IMAGE_UNSUPPORTED: dict[str, dict[str, str]] = {
    "aws": {
        "p3.": "the default AMI (Deep Learning Base OSS Nvidia Driver) ships NVIDIA's open kernel modules, "
               "which support Turing and newer GPUs, not the V100 of P3",
        "p3dn.": "the default AMI (Deep Learning Base OSS Nvidia Driver) ships NVIDIA's open kernel modules, "
                 "which support Turing and newer GPUs, not the V100 of P3dn",
    },
    "gcp": {
        "a3-": "the default image's NVIDIA driver 550 cannot run TensorFlow 2.21 on an H100 (its compute_90 "
               "PTX is built with CUDA 12.5 and needs driver 555 or newer)",
    },
}
IMAGE_HINT = {
    "aws": "set compute.imageId to an AMI with NVIDIA's proprietary driver (e.g. the Deep Learning Base "
           "Proprietary Nvidia Driver AMI), or pick g4dn/g5/g6/g6e/p4d/p5",
    "gcp": "set compute.imageId to an image with NVIDIA driver 555 or newer, or pick a2/g2 machines",
}
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


def gpu_model(cloud: str, machine_type: str, accelerator: str | None = None) -> str | None:
    """The GPU model of a machine type (an N1 machine's is its accelerator), or None when unknown."""
    if cloud == "aws":
        return AWS_GPU_MODELS.get(machine_type.split(".", 1)[0])
    if machine_type.startswith("n1-"):
        return accelerator
    return GCP_GPU_MODELS.get("-".join(machine_type.split("-")[:2]))


def gcp_machine_shape(machine_type: str, accelerator: str | None = None,
                      gpus: int | None = None) -> dict[str, object] | None:
    """A GCE GPU machine as the Billing Catalog prices it: ``{"machine_type", "vcpus", "memory_gib", "accelerator",
    "gpus"}`` (an N1 machine's GPUs are ``accelerator`` x ``gpus``); None for a machine type the table lacks."""
    m = _GCP_N1.match(machine_type)
    if m:
        vcpus = int(m.group(2))
        return {"machine_type": machine_type, "vcpus": vcpus, "memory_gib": vcpus * _N1_GIB_PER_VCPU[m.group(1)],
                "accelerator": accelerator, "gpus": gpus or 0}
    shape = GCP_MACHINE_SHAPES.get(machine_type)
    if shape is None:
        return None
    return {"machine_type": machine_type, "vcpus": shape[0], "memory_gib": shape[1],
            "accelerator": GCP_MACHINE_ACCELERATORS["-".join(machine_type.split("-")[:2])],
            "gpus": GCP_GPU_MACHINES[machine_type]}


def zone_in_region(cloud: str, zone: str, region: str) -> bool:
    """us-east-1a is in us-east-1 (AWS); us-central1-a is in us-central1 (GCP)."""
    if cloud == "aws":
        return bool(re.fullmatch(re.escape(region) + r"[a-z]", zone))
    return bool(re.fullmatch(re.escape(region) + r"-[a-z]", zone))


def unsupported_reason(cloud: str, name: str, *, custom_image: bool = False) -> str | None:
    """Why the stack cannot train on this machine type or N1 accelerator, or None when it can.

    `custom_image` is true when compute.imageId names the image: its driver is the user's
    choice, so only what TensorFlow itself cannot use is refused.
    """
    for prefix, reason in TF_UNUSABLE.items():
        if name.startswith(prefix):
            return reason + "; pick a newer GPU"
    if custom_image:
        return None
    for prefix, reason in DEFAULT_IMAGE_UNSUPPORTED.get(cloud, {}).items():
        if name.startswith(prefix):
            return f"{reason}; {IMAGE_HINT[cloud]}"
    return None


class NoVertexAccelerator(ValueError):
    """Vertex AI has no name for the machine's GPUs; the message says which machine."""


def vertex_accelerator(machine_type: str, n1_accelerator: str | None, gpus_per_node: int) -> tuple[str, int]:
    """(Vertex AI's accelerator type, count) for a GCE machine type; ("", 0) for a machine with no GPU."""
    if machine_type.startswith("n1-"):
        if not n1_accelerator:
            return "", 0
        return n1_accelerator.upper().replace("-", "_"), gpus_per_node
    count = GCP_GPU_MACHINES.get(machine_type)
    if count is None:
        return "", 0
    family = "-".join(machine_type.split("-")[:2])
    if family not in VERTEX_ACCELERATORS:
        raise NoVertexAccelerator(f"{machine_type!r}: Vertex AI's name of its GPUs is not known here")
    return VERTEX_ACCELERATORS[family], count
