"""The checks of `trainstack:scheduler`: which cloud each scheduler runs on, and what a managed job
cannot take.

`groups` is today's stack (spot groups and the controller) and takes everything the other checks
allow. `sagemaker` runs the run as a SageMaker managed-spot training job on an AWS stack: the job runs
the stack's own image (`image.build: true`) with the argument `train`, on one instance type SageMaker
knows, in the stack's one region, and nobody reaches its machines. `vertex` is GCP's alike: a Vertex AI
Spot CustomJob of the stack's own image, on one machine type whose GPUs Vertex AI names (the aiplatform v1
discovery document's `AcceleratorType`, less what it deprecates), in a region where Vertex AI trains.
"""

from __future__ import annotations

from components.settings.errors import ConfigError, refuse_set
from components.settings.schema import Settings

# Which cloud each managed scheduler runs on.
CLOUD_OF = {"sagemaker": "aws", "vertex": "gcp"}
# SageMaker's limit on a training job's runtime and its wait for spot capacity (28 days).
SAGEMAKER_MAX_HOURS = 28 * 24


def validate(s: Settings) -> None:
    """Refuse a scheduler on the wrong cloud, and what the managed job cannot take, naming the key."""
    if s.scheduler in ("groups", "kubernetes"):
        return  # a Job on the user's cluster: components/settings/kubernetes.py checks its block
    cloud = CLOUD_OF[s.scheduler]
    if s.cloud != cloud:
        other = next(k for k, v in CLOUD_OF.items() if v == s.cloud)
        raise ConfigError("scheduler", f"{s.scheduler!r} runs on {cloud.upper()} and this stack's cloud is {s.cloud}; "
                          f"use groups or {other} on {s.cloud}")
    if s.scheduler == "vertex":
        _vertex(s)
        return
    _sagemaker(s)


def _one_place_one_type(s: Settings, service: str, why_one_region: str) -> None:
    """What every managed job asks alike: the stack's own image, the stack's one region, one machine type."""
    if not s.image.build:
        raise ConfigError("image.build", f"false: scheduler {s.scheduler} runs the stack's own image (its entry takes "
                          f"`train`; {service} cannot mount the trainer's code into a public image); set image.build: true")
    if len(s.placement_list) > 1:
        raise ConfigError("placements", f"{len(s.placement_list)} placements: a {service} job runs in the stack's "
                          f"region alone ({why_one_region}); remove placements")
    c = s.compute
    if "instance_types" in c.model_fields_set and len(c.instance_types) > 1:
        raise ConfigError("compute.instanceTypes", f"{len(c.instance_types)} types: a {service} job runs one "
                          f"{'instance' if s.cloud == 'aws' else 'machine'} type; list one")


def _sagemaker(s: Settings) -> None:
    from schedulers import sagemaker

    c = s.compute
    _one_place_one_type(s, "SageMaker", "SageMaker waits for spot capacity itself")
    t = c.instance_types[0]
    if t.startswith(sagemaker.ML_PREFIX):
        raise ConfigError("compute.instanceTypes[0]", f"{t!r}: write the EC2 name {t.removeprefix(sagemaker.ML_PREFIX)!r}; "
                          f"the job runs on SageMaker's {t}")
    if sagemaker.instance_type(t) not in sagemaker.training_instance_types():
        raise ConfigError("compute.instanceTypes[0]", f"{t!r}: SageMaker has no training instance "
                          f"{sagemaker.instance_type(t)}; pick one it trains on (e.g. g5.xlarge)")
    if c.max_runtime_hours > SAGEMAKER_MAX_HOURS:
        raise ConfigError("compute.maxRuntimeHours", f"{c.max_runtime_hours}: SageMaker stops a training job after "
                          f"{SAGEMAKER_MAX_HOURS} h (28 days), waiting included; set {SAGEMAKER_MAX_HOURS} or less")
    refuse_set("sagemaker", (
        ("compute.maxPricePerHour", c.max_price_per_hour, "managed spot training has no maximum price"),
        ("compute.subnets", c.subnets, "SageMaker places the job's machines itself"),
        ("compute.zones", c.zones, "SageMaker places the job's machines itself"),
        ("compute.imageId", c.image_id, "SageMaker boots its own machine image"),
        ("access.sshPublicKey", s.access.ssh_public_key, "nobody logs in to a SageMaker job's machines"),
        ("access.allowedCidrs", s.access.allowed_cidrs, "nobody logs in to a SageMaker job's machines"),
        ("access.jupyter", s.access.jupyter, "nobody logs in to a SageMaker job's machines"),
        ("placement.reserveConcurrency", s.placement.reserve_concurrency, "a SageMaker stack has no controller"),
    ))


def _vertex(s: Settings) -> None:
    from components import catalog
    from schedulers import vertex

    c = s.compute
    _one_place_one_type(s, "Vertex AI", "Vertex AI waits for Spot capacity itself")
    if s.region not in vertex.REGIONS:
        raise ConfigError("region", f"{s.region!r}: Vertex AI runs no custom training there; pick one of its regions "
                          "(e.g. us-central1, europe-west4, asia-southeast1)")
    t = c.instance_types[0]
    try:
        kind, count = catalog.vertex_accelerator(t, c.accelerator, c.gpus_per_node)
    except catalog.NoVertexAccelerator as e:
        raise ConfigError("compute.instanceTypes[0]", f"{e}; pick a G2, A2, A3 or N1 machine") from None
    key = "compute.accelerator" if t.startswith("n1-") else "compute.instanceTypes[0]"
    if kind and kind not in vertex.accelerator_types():  # no GPU at all: the cloud's own checks say so
        raise ConfigError(key, f"{c.accelerator if t.startswith('n1-') else t!r}: Vertex AI trains on no {kind} "
                          "(aiplatform v1's accelerator types deprecate it, or lack it); pick another GPU")
    counts = catalog.VERTEX_N1_COUNTS.get(kind)
    if t.startswith("n1-") and counts is not None and count not in counts:
        raise ConfigError("compute.gpusPerNode", f"{count}: Vertex AI attaches {' or '.join(map(str, counts))} "
                          f"{kind} to an N1 machine")
    refuse_set("vertex", (
        ("compute.maxPricePerHour", c.max_price_per_hour, "a Spot job is billed at Vertex AI's Spot rate; it takes "
                                                          "no maximum price"),
        ("compute.zones", c.zones, "Vertex AI places the job's machines itself"),
        ("compute.imageId", c.image_id, "Vertex AI boots its own machine image"),
        ("access.sshPublicKey", s.access.ssh_public_key, "nobody logs in to a Vertex AI job's machines"),
        ("access.allowedCidrs", s.access.allowed_cidrs, "nobody logs in to a Vertex AI job's machines"),
        ("access.jupyter", s.access.jupyter, "nobody logs in to a Vertex AI job's machines"),
        ("placement.reserveConcurrency", s.placement.reserve_concurrency, "a Vertex AI stack has no controller"),
    ))
