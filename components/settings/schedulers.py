"""The checks of `trainstack:scheduler`: which cloud each scheduler runs on, and what a managed job
cannot take.

`groups` is today's stack (spot groups and the controller) and takes everything the other checks
allow. `sagemaker` runs the run as a SageMaker managed-spot training job on an AWS stack: the job runs
the stack's own image (`image.build: true`) with the argument `train`, on one instance type SageMaker
knows, in the stack's one region, and nobody reaches its machines. `vertex` is GCP's: its room
(schedulers/vertex.py) is built, its stack not yet, so it is refused.
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
        raise ConfigError("scheduler", "'vertex': Vertex AI custom jobs are not built yet; use groups on gcp "
                          "(docs/vertex.md says what is built)")
    _sagemaker(s)


def _sagemaker(s: Settings) -> None:
    from schedulers import sagemaker

    c = s.compute
    if not s.image.build:
        raise ConfigError("image.build", "false: scheduler sagemaker runs the stack's own image (its entry takes "
                          "`train`; SageMaker cannot mount the trainer's code into a public image); set image.build: true")
    if len(s.placement_list) > 1:
        raise ConfigError("placements", f"{len(s.placement_list)} placements: a SageMaker job runs in the stack's "
                          "region alone (SageMaker waits for spot capacity itself); remove placements")
    if "instance_types" in c.model_fields_set and len(c.instance_types) > 1:
        raise ConfigError("compute.instanceTypes", f"{len(c.instance_types)} types: a SageMaker job runs one instance "
                          "type; list one")
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
