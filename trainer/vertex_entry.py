"""The image's `train` under Vertex AI: a CustomJob's container contract mapped onto the trainer's own.

Vertex AI runs the image with the job's `args` (`train`, schedulers/vertex.py) and gives the container:

- the job's `env`: the trainer's own `TRAINSTACK_*` options, set by the stack as they are on a
  group's machines; `TRAINSTACK_RUN_URI` is the run folder;
- `CLOUD_ML_JOB_ID`: the job, with the replica, names this machine in the run's lease;
- `AIP_MODEL_DIR`, `AIP_CHECKPOINT_DIR`, `AIP_TENSORBOARD_LOG_DIR`: `<base>/model/`, `<base>/checkpoints/`,
  `<base>/logs/` of the job's baseOutputDirectory, `<run>/vertex/`. The trainer keeps its checkpoints,
  events and model in the run folder's own names, as on a group; a base that is the run folder itself
  would alias them (Vertex AI's `checkpoints/` over the trainer's committed ones) and is refused;
- with several replicas, `TF_CONFIG` (`chief` and `worker`) and `CLUSTER_SPEC` (`workerpool0`, `workerpool1`).
  The trainer's cluster is workers only, worker 0 the chief (as rendezvous makes it on a group): the
  chief becomes worker 0 and worker i worker i + 1, at the addresses Vertex AI gives.

A stop (a Spot preemption, `customJobs.cancel`, the timeout) is SIGTERM: the trainer commits a checkpoint
and exits, and Vertex AI's restart (`restartJobOnWorkerRestart`) resumes from it as a group's new machine does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from runfolder import environment

JOB_ID = "CLOUD_ML_JOB_ID"
AIP_DIRS = ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")


class ContractError(Exception):
    """The container was not given what Vertex AI gives a CustomJob; the message says what is wrong."""


def is_vertex(environ: Mapping[str, str]) -> bool:
    """Whether the container runs as a Vertex AI CustomJob (it names the job, or its output directories)."""
    return bool(environ.get(JOB_ID) or any(environ.get(k) for k in AIP_DIRS))


def _task(environ: Mapping[str, str]) -> tuple[dict, dict]:
    """(cluster, task) of Vertex AI's TF_CONFIG, or of CLUSTER_SPEC when TF_CONFIG is absent; ({}, {}) alone."""
    if environ.get("TF_CONFIG"):
        try:
            doc = json.loads(environ["TF_CONFIG"])
            return dict(doc.get("cluster") or {}), dict(doc.get("task") or {})
        except (ValueError, TypeError, AttributeError) as e:
            raise ContractError(f"TF_CONFIG is not Vertex AI's JSON ({e})") from None
    if environ.get("CLUSTER_SPEC"):
        try:
            doc = json.loads(environ["CLUSTER_SPEC"])
            pools, task = dict(doc.get("cluster") or {}), dict(doc.get("task") or {})
        except (ValueError, TypeError, AttributeError) as e:
            raise ContractError(f"CLUSTER_SPEC is not Vertex AI's JSON ({e})") from None
        names = {"workerpool0": "chief", "workerpool1": "worker"}
        return ({names.get(k, k): v for k, v in pools.items()},
                {"type": names.get(task.get("type"), task.get("type")), "index": task.get("index", 0)})
    return {}, {}


def tf_config(environ: Mapping[str, str]) -> tuple[str | None, str]:
    """(the trainer's TF_CONFIG, this replica's name): workers only, Vertex AI's chief first; None alone."""
    cluster, task = _task(environ)
    chief, workers = list(cluster.get("chief") or []), list(cluster.get("worker") or [])
    kind, index = task.get("type") or "chief", int(task.get("index") or 0)
    name = f"{kind}-{index}"
    if extra := sorted(set(cluster) - {"chief", "worker"}):
        raise ContractError(f"the job's cluster has pools {extra}: the trainer's job runs a chief and workers only")
    hosts = chief + workers
    if len(hosts) <= 1:
        return None, name
    if kind not in ("chief", "worker") or index >= len(chief if kind == "chief" else workers):
        raise ContractError(f"this replica ({kind} {index}) is not in the job's cluster")
    position = index if kind == "chief" else len(chief) + index
    return json.dumps({"cluster": {"worker": hosts}, "task": {"type": "worker", "index": position}}), name


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What the trainer's environment gains under the job: its machine's name, and TF_CONFIG for several
    replicas (replacing Vertex AI's); the job's `env` already holds the trainer's options."""
    run = (environ.get(environment.RUN_URI) or "").rstrip("/")
    if not run:
        raise ContractError(f"{environment.RUN_URI} is missing: the job's env names no run folder")
    for key in AIP_DIRS:
        value = environ.get(key, "")
        if value and value.rstrip("/").rsplit("/", 1)[0] == run:
            raise ContractError(f"{key} {value!r} is in the run folder itself, where its name is the trainer's own: "
                                "the job's baseOutputDirectory must be <run>/vertex/ (schedulers/vertex.py)")
    cluster, name = tf_config(environ)
    env = {environment.MACHINE_ID: f"{environ.get(JOB_ID) or 'vertex'}/{name}"}
    if cluster is not None:
        env["TF_CONFIG"] = cluster
    return env
