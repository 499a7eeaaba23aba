"""What a Vertex AI stack's `ops start` submits (`trainstack:scheduler: vertex`): the `vertexJob` output,
schedulers.vertex.JobSpec's fields, from the stack's settings.

Vertex AI names a job's GPUs apart from its machine type, even where Compute Engine attaches them with
the machine (A2, A3, G2): `accelerator` gives the CustomJob's `machineSpec.acceleratorType` and
`acceleratorCount` for the stack's machine type (and, on N1, its `compute.accelerator`), in the names
of the aiplatform v1 `AcceleratorType` enumeration. The stack that exports the output is still to come
(docs/vertex.md).
"""

from __future__ import annotations

import json

import pulumi

from components import catalog, userdata
from runfolder import environment

# What a job's container is told besides the trainer's options: its commands and the Keras it runs.
_JOB_KEYS = (environment.EXTRA_ARGS, environment.COMMAND, "TF_USE_LEGACY_KERAS")


# Vertex AI's names of a machine's GPUs (components/catalog.py holds the table; the settings check them too).
NoAccelerator = catalog.NoVertexAccelerator
accelerator = catalog.vertex_accelerator


def job_env(settings, run_uri: str) -> dict[str, str]:
    """The trainer's own `TRAINSTACK_*` options the machines' env file would hold (components/userdata.py's
    `boot_env`), as strings; the machines' own keys (group, boot archive, notice watcher) and the price (Compute
    Engine's Spot figure, not Vertex AI's) are left out."""
    env = userdata.boot_env(settings, run_uri=run_uri, group="", code_uri="")
    unpriced = (environment.PRICE_PER_HOUR, environment.PRICE_NOTE)
    return {k: str(v) for k, v in env.items() if (k in environment.OPTIONS or k in _JOB_KEYS) and k not in unpriced}


def job_spec(settings, *, run_uri: pulumi.Input[str], image: pulumi.Input[str],
             service_account: pulumi.Input[str], job_prefix: str) -> pulumi.Output[str]:
    """The stack's `vertexJob` output (JSON): everything but the deadline, which counts from the run's first start."""
    c = settings.compute
    kind, count = accelerator(c.instance_types[0], c.accelerator, c.gpus_per_node)
    return pulumi.Output.all(run_uri, image, service_account).apply(lambda v: json.dumps({
        "project": settings.project,
        "region": settings.region,
        "run_uri": v[0],
        "image": v[1],
        "service_account": v[2],
        "job_prefix": job_prefix,
        "machine_type": c.instance_types[0],
        "accelerator_type": kind,
        "accelerator_count": count,
        "nodes": c.nodes,
        "disk_gb": c.root_disk_gb,
        "spot": c.spot,
        "max_runtime_s": int(c.max_runtime_hours * 3600),
        "env": job_env(settings, v[0]),
    }, sort_keys=True))
