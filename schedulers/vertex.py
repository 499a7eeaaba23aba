"""The Vertex AI room: a run as one Spot CustomJob.

- **launch** (`launch`): the run's CustomJob (aiplatform v1 `projects.locations.customJobs.create`),
  built from the stack's job spec (`JobSpec`) and the run folder's deadline, and submitted only when the
  run has no job running or succeeded and no end marker. The run's jobs are labelled with the run's prefix
  and named `<prefix>--<n>` (their display name), so a second launch finds the first (customJobs.list,
  filtered by the label) and makes no create call.
- **state** (`job_state`, `record_end`): customJobs.get's `state` (JOB_STATE_*) and error; a job that
  ended without the trainer's own marker ends the run in the run folder, as the SageMaker room does.
- **stop** (`stop`): customJobs.cancel for the run's running jobs.
- **price**: Vertex AI bills a Spot CustomJob at its Spot price for the time its machines run; it reports
  no billable seconds, so the job's state carries none (docs/vertex.md).

The client is google-api-python-client's, built from the aiplatform v1 discovery document the library
ships (no network to build it; the tests run it against `HttpMockSequence`). The discovery client does
not check request bodies against the document's schemas: the tests do (tests/schedulers/test_vertex.py).

`baseOutputDirectory` is `<run>/vertex/`, never the run folder itself: Vertex AI gives the container
`AIP_MODEL_DIR`, `AIP_CHECKPOINT_DIR` and `AIP_TENSORBOARD_LOG_DIR` as `<base>/model/`,
`<base>/checkpoints/` and `<base>/logs/`, and in the run folder `checkpoints/` and `logs/` are the
trainer's own (committed checkpoints, the run's log), which Vertex's names must not alias. The trainer
keeps writing the run folder's own names; the image's `train` entry maps the AIP_* names onto the run folder.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

from runfolder import layout
from schedulers import JobState
from schedulers.sagemaker import (  # the same run-folder rules for every managed room
    SubmitError,
    ended_marker,
    ensure_deadline,
    job_name,
    job_number,
    job_prefix,
    write_end,
)

__all__ = ["JobSpec", "SubmitError", "job_prefix", "job_name", "custom_job", "launch", "job_state", "record_end",
           "stop", "client"]

# Where Vertex AI's own directories go, under the run: `<run>/vertex/{model,checkpoints,logs}/`.
OUTPUT_PREFIX = "vertex/"
# The label every job of the run carries (its value is the run's job prefix): what launch lists by.
RUN_LABEL = "trainstack-run"
# JOB_STATE_* of a job that may still run (one at a time per run), and of one that never will again.
ACTIVE = ("JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_CANCELLING",
          "JOB_STATE_PAUSED", "JOB_STATE_UPDATING")
SUCCEEDED = "JOB_STATE_SUCCEEDED"
ENDED = (SUCCEEDED, "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED", "JOB_STATE_PARTIALLY_SUCCEEDED")
# google.rpc.Code DEADLINE_EXCEEDED: the error of a job its scheduling.timeout stopped.
DEADLINE_EXCEEDED = 4
# Where Vertex AI runs custom training (its "Vertex AI locations" page,
# https://cloud.google.com/vertex-ai/docs/general/locations; there is no global location, and the API is
# served per region). A GPU type is offered in some of these only: Vertex AI refuses the job at create.
REGIONS = (
    "us-central1", "us-east1", "us-east4", "us-east5", "us-south1", "us-west1", "us-west2", "us-west3", "us-west4",
    "northamerica-northeast1", "northamerica-northeast2", "southamerica-east1", "southamerica-west1",
    "europe-central2", "europe-north1", "europe-southwest1", "europe-west1", "europe-west2", "europe-west3",
    "europe-west4", "europe-west6", "europe-west8", "europe-west9", "europe-west12",
    "asia-east1", "asia-east2", "asia-northeast1", "asia-northeast2", "asia-northeast3", "asia-south1",
    "asia-southeast1", "asia-southeast2", "australia-southeast1", "australia-southeast2",
    "me-central1", "me-central2", "me-west1", "africa-south1",
)


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """What the stack says about the run's job: where, which image, which identity, which machines."""

    project: str
    region: str
    run_uri: str  # gs://bucket/runs/<id>
    image: str  # by digest
    service_account: str  # the machine service account the job runs as
    job_prefix: str
    machine_type: str
    accelerator_type: str  # Vertex AI's name (NVIDIA_L4, ...); "" for none
    accelerator_count: int
    nodes: int
    disk_gb: int
    spot: bool
    max_runtime_s: int
    env: dict[str, str]

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """The stack output's JSON as a JobSpec; a missing or unknown field is a SubmitError."""
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as e:
            raise SubmitError(f"the stack's vertexJob output does not read as a job ({e}); run pulumi up "
                              "with this checkout") from None


def output_path(run_uri: str) -> str:
    """The job's baseOutputDirectory: `<run>/vertex/`."""
    return run_uri.rstrip("/") + "/" + OUTPUT_PREFIX


def parent(spec: JobSpec) -> str:
    """Where the run's jobs live: `projects/<project>/locations/<region>`."""
    return f"projects/{spec.project}/locations/{spec.region}"


def timeout(*, deadline: float, now: float) -> str:
    """scheduling.timeout: what is left of the run's wall-clock deadline (its first start plus
    compute.maxRuntimeHours), as SageMaker's MaxWaitTimeInSeconds is; a run past it is not submitted."""
    left = int(deadline - now)
    if left < 1:
        raise SubmitError(f"the run's deadline passed {-left} s ago (compute.maxRuntimeHours counts from its first "
                          "start): it is not submitted again; start a new run (run.id)")
    return f"{left}s"


def _pool(spec: JobSpec, replicas: int) -> dict:
    from runfolder import environment

    # The run folder is the job's own, whatever the stack's env says: the trainer's entry reads it there.
    env = {**spec.env, environment.RUN_URI: spec.run_uri}
    machine: dict[str, Any] = {"machineType": spec.machine_type}
    if spec.accelerator_type and spec.accelerator_count:
        machine |= {"acceleratorType": spec.accelerator_type, "acceleratorCount": spec.accelerator_count}
    return {
        "machineSpec": machine,
        "replicaCount": str(replicas),  # int64 travels as a string
        "diskSpec": {"bootDiskType": "pd-ssd", "bootDiskSizeGb": spec.disk_gb},
        "containerSpec": {"imageUri": spec.image, "args": ["train"],
                          "env": [{"name": k, "value": str(v)} for k, v in sorted(env.items())]},
    }


def custom_job(spec: JobSpec, *, name: str, deadline: float, now: float) -> dict:
    """The CustomJob body of the run's job `name`. The first worker pool is the chief (one replica); with
    nodes > 1 a second pool of nodes - 1 workers on the same machines, and Vertex AI sets TF_CONFIG and
    CLUSTER_SPEC in each container. A Spot job is restarted by Vertex AI when a worker is preempted
    (restartJobOnWorkerRestart: the whole job, as one preempted machine stops a synchronous step); the
    trainer resumes from the run folder's newest committed checkpoint."""
    if "@sha256:" not in spec.image:
        raise SubmitError(f"the image {spec.image!r} is not pinned by digest; run pulumi up (image.build: true "
                          "pushes it and names it by digest)")
    pools = [_pool(spec, 1)] + ([_pool(spec, spec.nodes - 1)] if spec.nodes > 1 else [])
    scheduling = {"timeout": timeout(deadline=deadline, now=now), "restartJobOnWorkerRestart": True}
    if spec.spot:
        scheduling["strategy"] = "SPOT"
    return {
        "displayName": name,
        "labels": {RUN_LABEL: spec.job_prefix},
        "jobSpec": {
            "workerPoolSpecs": pools,
            "scheduling": scheduling,
            "serviceAccount": spec.service_account,
            "baseOutputDirectory": {"outputUriPrefix": output_path(spec.run_uri)},
        },
    }


# -- launch ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Launch:
    """What a launch did (as schedulers.sagemaker.Launch): `submitted`, `running`, `complete` or `ended`."""

    outcome: str
    job: str | None = None  # the job's resource name (projects/.../customJobs/<id>)
    detail: str = ""
    request: dict | None = None


def run_jobs(api, *, where: str, prefix: str) -> list[dict]:
    """The run's CustomJobs in `where` (projects/P/locations/R): every page of customJobs.list by the run's
    label, oldest first by number."""
    jobs, token = [], None
    for _ in range(1000):  # bounded: a service that never ends its pages is an error, not a hang
        page = api.projects().locations().customJobs().list(
            parent=where, filter=f'labels.{RUN_LABEL}="{prefix}"', pageToken=token).execute()
        jobs += [j for j in page.get("customJobs", []) if job_number(prefix, j.get("displayName", ""))]
        token = page.get("nextPageToken")
        if not token:
            return sorted(jobs, key=lambda j: job_number(prefix, j["displayName"]))
    raise SubmitError("customJobs.list did not end after 1000 pages")


def launch(spec: JobSpec, *, api, store, now: float) -> Launch:
    """Submit the run's CustomJob unless it has one running or succeeded, or the run has ended: a second
    launch makes no create call. Vertex AI does not refuse a second job of the same display name, so two
    launches at the same instant could both submit: `ops start` is the one submitter (docs/vertex.md)."""
    marker = ended_marker(store)
    if marker is not None:
        return Launch("ended", detail=f"the run has ended {marker}: it is not submitted again")
    jobs = run_jobs(api, where=parent(spec), prefix=spec.job_prefix)
    for j in reversed(jobs):
        if j.get("state") in ACTIVE:
            return Launch("running", job=j["name"], detail=j["state"])
        if j.get("state") == SUCCEEDED:
            return Launch("complete", job=j["name"], detail="the run's job succeeded")
    n = 1 + max((job_number(spec.job_prefix, j["displayName"]) for j in jobs), default=0)
    deadline = ensure_deadline(store, spec.max_runtime_s, now)
    body = custom_job(spec, name=job_name(spec.job_prefix, n), deadline=deadline, now=now)
    made = api.projects().locations().customJobs().create(parent=parent(spec), body=body).execute()
    return Launch("submitted", job=made["name"], request=body)


# -- state and stop ------------------------------------------------------------------------------------------


def check_owner(job: dict, run_uri: str | None) -> None:
    """Raise SubmitError unless the job is this run's: its baseOutputDirectory, which the submitter sets,
    is the run's (the run folder's scheduler.json is writable by the job's identity)."""
    if run_uri is None:
        return
    got = ((job.get("jobSpec") or {}).get("baseOutputDirectory") or {}).get("outputUriPrefix", "")
    if got.rstrip("/") != output_path(run_uri).rstrip("/"):
        raise SubmitError(f"job {job.get('name')} writes to {got!r}, not this run's {output_path(run_uri)!r}: "
                          "it is not this run's job; the run folder's scheduler.json names another run's")


def job_state(api, name: str, *, run_uri: str | None = None) -> JobState:
    """The job as customJobs.get reports it, in the words every room shares. Vertex AI reports no billable
    or training seconds: the state carries none, and so no saving."""
    d = api.projects().locations().customJobs().get(name=name).execute()
    check_owner(d, run_uri)
    state = d.get("state", "JOB_STATE_UNSPECIFIED")
    error = d.get("error") or {}
    return JobState(name=name, status=state, secondary=str(error.get("code", "")) if error else "",
                    message=error.get("message", ""), ended=state in ENDED)


def end_of(job: JobState, *, stop_requested: bool) -> tuple[str, str] | None:
    """(marker, reason) the run ends with when its job ended without the trainer saying so; None while the
    job runs, or when it succeeded (the trainer wrote COMPLETE). The job's timeout (DEADLINE_EXCEEDED) or
    expiry ends the run TIMED_OUT; a cancel that `ops stop` asked for CANCELLED; anything else FAILED."""
    if not job.ended or job.status == SUCCEEDED:
        return None
    why = f"Vertex AI job {job.name} {job.status}" + (f": {job.message}" if job.message else "")
    if job.status == "JOB_STATE_EXPIRED" or job.secondary == str(DEADLINE_EXCEEDED):
        return layout.TIMED_OUT, why
    if job.status == "JOB_STATE_CANCELLED":
        return (layout.CANCELLED, why) if stop_requested else (layout.FAILED, why + "; cancelled outside ops stop")
    return layout.FAILED, why


def record_end(job: JobState, *, store, now: float) -> str | None:
    """Write the run's end marker for a job that ended without one (create-if-absent: the trainer's own
    marker, written first, wins); returns the marker the run ends with, or None while it has none."""
    return write_end(job, store=store, now=now, end_of=end_of, details={"status": job.status, "error": job.message})


def stop(api, *, where: str, prefix: str, run_uri: str | None = None) -> list[str]:
    """customJobs.cancel for each of the run's jobs still running (Vertex AI sends the container SIGTERM);
    returns their names. A job cancelling or ended is left alone; with `run_uri`, a job that is not that
    run's (check_owner) is refused before any is cancelled."""
    running = [j for j in run_jobs(api, where=where, prefix=prefix) if j.get("state") in ACTIVE and j.get("state") != "JOB_STATE_CANCELLING"]
    for j in running:
        check_owner(j, run_uri)
    for j in running:
        api.projects().locations().customJobs().cancel(name=j["name"], body={}).execute()
    return [j["name"] for j in running]


@functools.cache
def document() -> dict:
    """The aiplatform v1 discovery document google-api-python-client ships (no network); read once."""
    from googleapiclient.discovery_cache import get_static_doc

    return json.loads(get_static_doc("aiplatform", "v1"))


def accelerator_types() -> tuple[str, ...]:
    """The GPU names a CustomJob's machineSpec.acceleratorType takes: the document's `AcceleratorType`
    enumeration less its deprecated values (NVIDIA_TESLA_K80), the unspecified one and the TPUs."""
    prop = document()["schemas"]["GoogleCloudAiplatformV1MachineSpec"]["properties"]["acceleratorType"]
    deprecated = prop.get("enumDeprecated") or [False] * len(prop["enum"])
    return tuple(v for v, old in zip(prop["enum"], deprecated, strict=True) if v.startswith("NVIDIA_") and not old)


def client(region: str, *, http: Any = None, credentials: Any = None) -> Any:
    """The aiplatform v1 client for `region`'s endpoint (Vertex AI is served per region), from the discovery
    document google-api-python-client ships; `http` stands for the service in tests."""
    from googleapiclient import discovery
    from googleapiclient.discovery_cache import get_static_doc

    doc = get_static_doc("aiplatform", "v1")
    options = {"api_endpoint": f"https://{region}-aiplatform.googleapis.com"}
    if http is not None:
        return discovery.build_from_document(doc, http=http, client_options=options)
    return discovery.build_from_document(doc, credentials=credentials, client_options=options)
