"""Preflight on a Vertex AI stack (`trainstack:scheduler: vertex`): the job's own GPU quota, the APIs, the data.

A Vertex AI CustomJob does not draw on Compute Engine's GPU quotas, zones or network: Vertex AI runs its
machines in its own project, and counts them against its own quotas, per project and region, which a new
project has at 0 for most GPUs (the job is refused RESOURCE_EXHAUSTED, "The following quota metrics exceed
quota limits: aiplatform.googleapis.com/custom_model_training_..."). A Vertex AI stack gets these checks:

- the APIs `pulumi up` needs on before it starts (as on the groups), and Vertex AI's own
  (aiplatform.googleapis.com): `pulumi up` turns it on, but its quotas are only granted, and read, once it is;
- the region's Vertex AI quota for the job's GPUs, `accelerator count x compute.nodes` of them: a Spot job
  (`compute.spot`) draws on `custom_model_training_preemptible_<gpu>_gpus`, an on-demand one on
  `custom_model_training_<gpu>_gpus` (Vertex AI's quota page names both per GPU; unlike Compute Engine, a Spot
  job does not fall back to the standard quota). Read through Service Usage (`GcpApi.service_quota_limits`);
- a `gs://` `run.dataUri`, as on the groups (`gcp_data_problems`);
- the deployer's Cloud KMS permissions for the image-signing key, as on the groups (`gcp_signing_key_problems`):
  a Vertex AI stack always builds, and signs, its image.

The CPUs of a job's machines have their own Vertex AI quota (custom_model_training_cpus), which new projects
are granted some of; it is not checked.
"""

from __future__ import annotations

from collections.abc import Callable

from components import settings as config
from ops.preflight.common import Problem, run_checks
from ops.preflight.gcp_api import GcpApi

AIPLATFORM_API = "aiplatform.googleapis.com"
# Vertex AI's accelerator type (aiplatform v1's AcceleratorType) -> the GPU's part of its training quota metrics
# (`custom_model_training_[preemptible_]<part>_gpus`). The 80 GB A100 has its own quota; the other memory
# suffixes name the only size of their GPU and are not in the metric's name.
QUOTA_GPU = {
    "NVIDIA_TESLA_T4": "nvidia_t4",
    "NVIDIA_TESLA_V100": "nvidia_v100",
    "NVIDIA_TESLA_P100": "nvidia_p100",
    "NVIDIA_TESLA_P4": "nvidia_p4",
    "NVIDIA_TESLA_K80": "nvidia_k80",
    "NVIDIA_TESLA_A100": "nvidia_a100",
    "NVIDIA_A100_80GB": "nvidia_a100_80gb",
    "NVIDIA_L4": "nvidia_l4",
    "NVIDIA_H100_80GB": "nvidia_h100",
    "NVIDIA_H100_MEGA_80GB": "nvidia_h100_mega",
    "NVIDIA_H200_141GB": "nvidia_h200",
}


def vertex_gpu_metric(accelerator_type: str, *, spot: bool) -> str:
    """The Vertex AI quota metric a job's GPUs draw on: the preemptible one for a Spot job."""
    part = QUOTA_GPU.get(accelerator_type) or accelerator_type.lower().replace("tesla_", "")
    return f"{AIPLATFORM_API}/custom_model_training_{'preemptible_' if spot else ''}{part}_gpus"


def vertex_quota_problems(settings: config.Settings, api: GcpApi) -> list[Problem]:
    """The region's Vertex AI training quota for the job's GPUs (Spot or on demand) against what the job asks."""
    from components import catalog

    c = settings.compute
    kind, count = catalog.vertex_accelerator(c.instance_types[0], c.accelerator, c.gpus_per_node)
    if not kind or not count:
        return []  # a machine without GPUs: its CPUs are not checked
    need = count * c.nodes
    metric = vertex_gpu_metric(kind, spot=c.spot)
    short = metric.removeprefix(f"{AIPLATFORM_API}/")
    where = f"project {settings.project}, region {settings.region}"
    limits = api.service_quota_limits(settings.project, AIPLATFORM_API, metric)
    if limits is None:
        return [Problem(f"Vertex AI has no per-region quota {short} ({where}), so the job's {kind} GPUs cannot "
                        "be checked", f"look for Vertex AI's custom-training quota of {kind} in IAM & Admin > "
                        "Quotas (service aiplatform.googleapis.com), or choose another GPU")]
    limit = limits.get(settings.region, limits.get("", 0.0))
    if limit < 0 or limit >= need:
        return []
    return [Problem(
        f"Vertex AI quota {short} ({where}) is {limit:g}; the job needs {need} ({count} {kind} x {c.nodes} "
        "node(s)), so Vertex AI would refuse it (RESOURCE_EXHAUSTED)",
        f"request {need} in IAM & Admin > Quotas (service aiplatform.googleapis.com, metric {metric}, region "
        f"{settings.region}; new projects start at 0 for most GPUs)")]


def vertex_api_problem(settings: config.Settings) -> Problem:
    """Vertex AI's API is off: its quotas cannot be read (nor granted) until it is on."""
    return Problem(f"the Vertex AI API ({AIPLATFORM_API}) is off in project {settings.project}, so its GPU quota "
                   "cannot be checked (`pulumi up` would turn it on, but a new project's quota is 0 for most GPUs "
                   "until you ask)",
                   f"gcloud services enable {AIPLATFORM_API} --project {settings.project}, then run preflight again")


def check_vertex(settings: config.Settings, api: GcpApi | None = None) -> list[Problem]:
    """Every check of a Vertex AI stack; `api` defaults to the REST client with Application Default Credentials."""
    from ops.preflight.gcp import (
        _gcp_error,
        api_checks,
        gcp_api,
        gcp_data_problems,
        gcp_signing_key_problems,
        merge,
        off_api_said,
    )

    api = gcp_api(api)
    problems, enabled = api_checks(settings, api)
    checks: list[tuple[str, Callable[[], list[Problem]]]] = [
        ("data bucket", off_api_said(settings, lambda: gcp_data_problems(settings, api))),
        ("image signing key", off_api_said(settings, lambda: gcp_signing_key_problems(settings, api)))]
    if enabled and AIPLATFORM_API not in enabled:
        problems.append(vertex_api_problem(settings))
    else:
        checks.insert(0, ("Vertex AI GPU quota", off_api_said(settings, lambda: vertex_quota_problems(settings, api))))
    return merge(problems, run_checks(checks, _gcp_error))
