"""The SageMaker room: a run as one managed-spot training job.

- **launch** (`launch`): the run's `CreateTrainingJob` request, built from the stack's `sagemakerJob`
  output (`JobSpec`) and the run folder's deadline, checked against botocore's service model, and
  submitted only when the run has no job running or completed and no end marker. The run's jobs are
  named `<prefix>--<n>`, so a second launch finds the first (ListTrainingJobs) and two at once collide
  on the name, which SageMaker refuses.
- **state** (`job_state`, `record_end`): DescribeTrainingJob's status, secondary status (the
  managed-spot sequences: Interrupted, Restarting, Pending, MaxWaitTimeExceeded), training and
  billable seconds; a job that ended without the trainer's own marker ends the run in the run
  folder (MaxWaitTimeExceeded or MaxRuntimeExceeded: TIMED_OUT with the job's reason).
- **stop** (`stop`): StopTrainingJob for the run's running job.
- **price**: SageMaker publishes no spot price by API; the stack records the `ml.*` estimate
  (docs/sagemaker.md) and the real saving is the job's own, 1 - billable / training seconds.

What the stack names (EC2 instance types such as ``g5.xlarge``) becomes what SageMaker
takes (``ml.g5.xlarge``); the types SageMaker trains on are botocore's own enumeration of
``TrainingInstanceType``, so a type SageMaker lacks is refused before anything is created.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json

from runfolder import layout
from schedulers import JobState

# SageMaker's names for an EC2 type: the same, with this prefix.
ML_PREFIX = "ml."


@functools.cache
def service_model():
    """botocore's SageMaker service model (loaded once: ~0.3 s)."""
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


def training_instance_types() -> tuple[str, ...]:
    """Every instance type a SageMaker training job takes, as botocore's model lists them."""
    return tuple(service_model().shape_for("TrainingInstanceType").enum)


def instance_type(ec2_type: str) -> str:
    """SageMaker's name for the stack's EC2 type: ``g5.xlarge`` -> ``ml.g5.xlarge``."""
    return ec2_type if ec2_type.startswith(ML_PREFIX) else ML_PREFIX + ec2_type


# A training job's name: SageMaker's pattern and limit (unique in the account and region, for ever:
# a name is never reused, even after the job is deleted from the console's list).
JOB_NAME_MAX = 63
# The run's jobs are <prefix>--<n>, n = 1, 2, ... (one at a time); the prefix leaves room for the number. A
# prefix holds no "--" (its parts are slugs), so one run's names never match another's `<prefix>--*`.
JOB_SEPARATOR = "--"
JOB_PREFIX_MAX = JOB_NAME_MAX - len(JOB_SEPARATOR) - 3


def _slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def job_prefix(*, project: str, stack: str, run_id: str) -> str:
    """The name every training job of this run starts with, before `--<n>`: `<project>-<stack>[-<run id>]`, lowercase
    (SageMaker writes the job's ARN in lowercase), shortened with a digest past SageMaker's limit. The job
    role's trust names it, so only this run's jobs can act as the role."""
    import hashlib

    parts = [project, stack] + ([run_id] if run_id != stack else [])
    name = "-".join(_slug(p) or "x" for p in parts)
    if len(name) > JOB_PREFIX_MAX:
        digest = hashlib.sha256("/".join(parts).encode()).hexdigest()[:8]
        name = name[:JOB_PREFIX_MAX - 9].rstrip("-") + "-" + digest
    return name


def job_arn_pattern(*, partition: str, region: str, account_id: str, prefix: str) -> str:
    """The ARNs of this run's jobs (`aws:SourceArn` of the role's trust)."""
    return f"arn:{partition}:sagemaker:{region}:{account_id}:training-job/{prefix}{JOB_SEPARATOR}*"


# -- the request ---------------------------------------------------------------------------------------

# A SageMaker job's end statuses, and those of a job still running (one at a time per run).
ACTIVE = ("InProgress", "Stopping")
ENDED = ("Completed", "Failed", "Stopped")
# Retries of a job that fails on SageMaker's side (InternalServerError), as the groups give a crashing
# machine three tries (TRAINSTACK_MAX_FAILURES). A spot interruption is not a retry: managed spot
# training restarts the job itself until MaxWaitTimeInSeconds.
RETRY_ATTEMPTS = 3
# Where SageMaker uploads /opt/ml/model (model.tar.gz) and /opt/ml/output at the job's end: beside the run
# folder's own names, under the run (the job's role reaches the run's prefix only).
OUTPUT_PREFIX = "sagemaker/"
# The job is tagged with its run, as every resource of the stack is.
RUN_TAG = "trainstack-run"


class SubmitError(Exception):
    """The job cannot be submitted as asked; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """What the stack says about the run's job (its `sagemakerJob` output, components/aws/job.py)."""

    region: str
    run_uri: str
    image: str
    role_arn: str
    job_prefix: str
    instance_type: str
    instance_count: int
    volume_gb: int
    spot: bool
    max_runtime_s: int
    hyperparameters: dict[str, str]

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """The stack output's JSON as a JobSpec; a missing or unknown field is a SubmitError."""
        try:
            doc = json.loads(text)
            return cls(**doc)
        except (TypeError, ValueError) as e:
            raise SubmitError(f"the stack's sagemakerJob output does not read as a job ({e}); run pulumi up "
                              "with this checkout") from None


def job_name(prefix: str, n: int) -> str:
    """The run's n-th job: `<prefix>--<n>`."""
    return f"{prefix}{JOB_SEPARATOR}{n}"


def job_number(prefix: str, name: str) -> int | None:
    """n of a job named `<prefix>--<n>`; None for any other name (another run's)."""
    head, sep, n = name.rpartition(JOB_SEPARATOR)
    return int(n) if sep and head == prefix and n.isdigit() else None


def stopping_condition(spec: JobSpec, *, deadline: float, now: float) -> dict[str, int]:
    """The job's StoppingCondition: the run's wall-clock deadline (its first start plus
    compute.maxRuntimeHours) bounds the job's whole life, waiting for spot capacity included, which is
    what MaxWaitTimeInSeconds bounds; MaxRuntimeInSeconds (training time alone) may not exceed it.
    SageMaker documents MaxRuntime <= MaxWait and neither botocore nor moto checks it: checked here.
    Without managed spot there is no wait: MaxRuntime alone, to the same deadline."""
    left = int(deadline - now)
    if left < 1:
        raise SubmitError(f"the run's deadline passed {-left} s ago (compute.maxRuntimeHours counts from its first "
                          "start): it is not submitted again; start a new run (run.id)")
    runtime = min(spec.max_runtime_s, left)
    if not spec.spot:
        return {"MaxRuntimeInSeconds": runtime}
    condition = {"MaxRuntimeInSeconds": runtime, "MaxWaitTimeInSeconds": left}
    if condition["MaxRuntimeInSeconds"] > condition["MaxWaitTimeInSeconds"]:
        raise SubmitError(f"MaxRuntimeInSeconds {runtime} exceeds MaxWaitTimeInSeconds {left}")
    return condition


def training_request(spec: JobSpec, *, name: str, deadline: float, now: float) -> dict:
    """The CreateTrainingJob request of the run's job `name`, checked against botocore's service model.

    No CheckpointConfig: the trainer writes its checkpoints to the run folder itself, committed marker
    last, under the run's lease. SageMaker's LocalPath sync would copy /opt/ml/checkpoints to S3 in no
    order (a half-written checkpoint looks whole to the next attempt) and back at each restart (every
    byte written twice, and a restart waits for the download); the trainer resumes from the bucket's
    newest committed checkpoint instead, as on a group. No InputDataConfig: the trainer streams its
    data from run.dataUri as on a group (or makes its synthetic set)."""
    if "@sha256:" not in spec.image:
        raise SubmitError(f"the image {spec.image!r} is not pinned by digest; run pulumi up (image.build: true "
                          "pushes it and names it by digest)")
    request = {
        "TrainingJobName": name,
        "AlgorithmSpecification": {"TrainingImage": spec.image, "TrainingInputMode": "File"},
        "RoleArn": spec.role_arn,
        "HyperParameters": {str(k): str(v) for k, v in spec.hyperparameters.items()},
        "OutputDataConfig": {"S3OutputPath": output_path(spec.run_uri)},
        "ResourceConfig": {"InstanceType": spec.instance_type, "InstanceCount": spec.instance_count,
                           "VolumeSizeInGB": spec.volume_gb},
        "StoppingCondition": stopping_condition(spec, deadline=deadline, now=now),
        "EnableManagedSpotTraining": spec.spot,
        "RetryStrategy": {"MaximumRetryAttempts": RETRY_ATTEMPTS},
        "Tags": [{"Key": RUN_TAG, "Value": spec.run_uri.rstrip("/").rsplit("/", 1)[-1]}],
    }
    check_request("CreateTrainingJob", request)
    return request


def check_request(operation: str, params: dict) -> None:
    """Raise SubmitError unless `params` is a valid `operation` request for botocore's service model: its
    keys, types and required members (botocore's own ParamValidator, as the client checks before sending),
    and the enumerations, patterns and upper bounds the model states, which botocore leaves to the service."""
    from botocore.validate import ParamValidator

    shape = service_model().operation_model(operation).input_shape
    report = ParamValidator().validate(params, shape)
    if report.has_errors():
        raise SubmitError(f"{operation} request refused by the service model: {report.generate_report()}")
    problems = _beyond_botocore(params, shape, operation)
    if problems:
        raise SubmitError(f"{operation} request refused by the service model: {problems[0]}")


def _beyond_botocore(value, shape, path: str) -> list[str]:
    """What the service would refuse that ParamValidator does not check: a string outside the shape's
    enumeration or pattern, a number under its `min` or over its `max`, a string, list or map over its `max`."""
    import re

    found: list[str] = []
    meta = shape.metadata
    if shape.type_name == "structure":
        for key, member in shape.members.items():
            if key in value:
                found += _beyond_botocore(value[key], member, f"{path}.{key}")
    elif shape.type_name == "list":
        for i, item in enumerate(value):
            found += _beyond_botocore(item, shape.member, f"{path}[{i}]")
    elif shape.type_name == "map":
        for k, v in value.items():
            found += _beyond_botocore(k, shape.key, f"{path} key {k!r}")
            found += _beyond_botocore(v, shape.value, f"{path}[{k!r}]")
    elif shape.type_name == "string":
        if shape.enum and value not in shape.enum:
            found.append(f"{path}: {value!r} is not one of the model's {len(shape.enum)} values")
        # Java's Unicode classes (\p{L}, as in tag patterns) have no `re` spelling: those patterns are the service's.
        if "pattern" in meta and "\\p{" not in meta["pattern"] and not re.fullmatch(meta["pattern"], value):
            found.append(f"{path}: {value!r} does not match {meta['pattern']}")
    if shape.type_name in ("string", "list", "map") and "max" in meta and len(value) > meta["max"]:
        found.append(f"{path}: {len(value)} long, over the model's {meta['max']}")
    if shape.type_name in ("integer", "long") and "max" in meta and value > meta["max"]:
        found.append(f"{path}: {value} over the model's {meta['max']}")
    if shape.type_name in ("integer", "long") and "min" in meta and value < meta["min"]:
        found.append(f"{path}: {value} under the model's {meta['min']}")
    return found


# -- launch: one job at a time, never again once the run has ended ---------------------------------------


@dataclasses.dataclass(frozen=True)
class Launch:
    """What a launch did: `submitted` a new job, or found one it left alone (`running`, `complete`), or
    found the run ended (`ended`: its marker)."""

    outcome: str
    job: str | None = None
    detail: str = ""
    request: dict | None = None


def run_jobs(client, prefix: str) -> list[dict]:
    """The run's jobs (ListTrainingJobs summaries), oldest first by their number."""
    jobs = []
    for page in client.get_paginator("list_training_jobs").paginate(NameContains=prefix + JOB_SEPARATOR):
        jobs += [j for j in page.get("TrainingJobSummaries", []) if job_number(prefix, j["TrainingJobName"])]
    return sorted(jobs, key=lambda j: job_number(prefix, j["TrainingJobName"]))


def ensure_deadline(store, max_runtime_s: int, now: float) -> float:
    """The run's deadline (epoch seconds, the run folder's `deadline`, as the machines write it): the one
    there, or now + the cap written once (create-if-absent: a machine or another submit that wrote it
    first wins)."""
    from runfolder.storage import NotFound, PreconditionFailed

    with contextlib.suppress(PreconditionFailed):
        store.put_bytes_if(layout.DEADLINE_KEY, f"{int(now) + max_runtime_s}\n".encode(), version=None)
    try:
        digits = "".join(c for c in store.get_bytes(layout.DEADLINE_KEY).decode(errors="replace") if c.isdigit())
    except NotFound:
        digits = ""
    if not digits:
        raise SubmitError(f"the run's {layout.DEADLINE_KEY} file holds no time; remove it to count from now")
    return float(digits)


def ended_marker(store) -> str | None:
    """The run's end marker (COMPLETE, FAILED, TIMED_OUT, CANCELLED), or None while it has none."""
    return next((m for m in layout.END_MARKERS if store.exists(m)), None)


def launch(spec: JobSpec, *, client, store, now: float) -> Launch:
    """Submit the run's job unless it has one running or done, or the run has ended: a second launch
    makes no CreateTrainingJob call. Two launches at once pick the same next name, and SageMaker refuses
    the second (names are unique): the loser reports the winner's job."""
    marker = ended_marker(store)
    if marker is not None:
        return Launch("ended", detail=f"the run has ended {marker}: it is not submitted again")
    jobs = run_jobs(client, spec.job_prefix)
    for j in reversed(jobs):
        if j["TrainingJobStatus"] in ACTIVE:
            return Launch("running", job=j["TrainingJobName"], detail=j["TrainingJobStatus"])
        if j["TrainingJobStatus"] == "Completed":
            return Launch("complete", job=j["TrainingJobName"], detail="the run's job completed")
    n = 1 + max((job_number(spec.job_prefix, j["TrainingJobName"]) for j in jobs), default=0)
    name = job_name(spec.job_prefix, n)
    if len(name) > JOB_NAME_MAX:
        raise SubmitError(f"job name {name!r} is over SageMaker's {JOB_NAME_MAX} characters: the run has had "
                          f"{n - 1} jobs; start a new run (run.id)")
    deadline = ensure_deadline(store, spec.max_runtime_s, now)
    request = training_request(spec, name=name, deadline=deadline, now=now)
    from botocore.exceptions import ClientError

    try:
        client.create_training_job(**request)
    except ClientError as e:
        error = e.response.get("Error", {})
        message = error.get("Message", "")
        if error.get("Code") == "ResourceInUse" or "already exists" in message or "must be unique" in message:
            return Launch("running", job=name, detail="submitted at the same time by another launch")
        raise
    return Launch("submitted", job=name, request=request)


# -- state and stop ---------------------------------------------------------------------------------------

# How a job's end is said in the run folder when the trainer could not say it itself: SageMaker's own
# stops (the wait ran out; the runtime ran out) end the run TIMED_OUT, a failure FAILED, a stop that
# `ops stop` asked for CANCELLED. A completed job's trainer wrote COMPLETE itself.
TIMED_OUT_STATUSES = ("MaxWaitTimeExceeded", "MaxRuntimeExceeded")
# Secondary statuses of a managed-spot job that mean it has no machine now (AWS's managed-spot docs:
# Starting -> Downloading -> Training -> Interrupted -> Restarting/Pending -> Downloading -> Training ...).
WAITING_STATUSES = ("Starting", "Pending", "Restarting", "Interrupted", "LaunchingMLInstances")


def output_path(run_uri: str) -> str:
    """Where the run's jobs put /opt/ml/model: `<run>/sagemaker/` (the request's OutputDataConfig)."""
    return run_uri.rstrip("/") + "/" + OUTPUT_PREFIX


def check_owner(d: dict, run_uri: str | None) -> None:
    """Raise SubmitError unless the described job is this run's: its output path, which the submitter sets
    (the job's own role cannot change it), is the run's. The run folder's scheduler.json, which the job's
    role may write, then cannot point `ops stop` or `ops status` at another run's job."""
    if run_uri is None:
        return
    got = (d.get("OutputDataConfig") or {}).get("S3OutputPath", "")
    if got.rstrip("/") != output_path(run_uri).rstrip("/"):
        raise SubmitError(f"job {d.get('TrainingJobName')} writes to {got!r}, not this run's {output_path(run_uri)!r}: "
                          "it is not this run's job; the run folder's scheduler.json names another run's")


def job_state(client, name: str, *, run_uri: str | None = None) -> JobState:
    """The job as SageMaker describes it, in the words every room shares; with `run_uri`, only when it is that
    run's job (check_owner)."""
    d = client.describe_training_job(TrainingJobName=name)
    check_owner(d, run_uri)
    status = d["TrainingJobStatus"]
    return JobState(
        name=name, status=status, secondary=d.get("SecondaryStatus", ""),
        message=d.get("FailureReason", "") or _last_message(d),
        training_s=d.get("TrainingTimeInSeconds"), billable_s=d.get("BillableTimeInSeconds"),
        ended=status in ENDED, interruptions=sum(1 for t in d.get("SecondaryStatusTransitions", [])
                                                 if t.get("Status") == "Interrupted"),
    )


def _last_message(d: dict) -> str:
    transitions = d.get("SecondaryStatusTransitions") or []
    return transitions[-1].get("StatusMessage", "") if transitions else ""


def end_of(job: JobState, *, stop_requested: bool) -> tuple[str, str] | None:
    """(marker, reason) the run ends with when its job ended without the trainer saying so; None while the job
    runs, or when it completed (the trainer wrote COMPLETE)."""
    if not job.ended or job.status == "Completed":
        return None
    why = f"SageMaker job {job.name} {job.status} ({job.secondary})" + (f": {job.message}" if job.message else "")
    if job.secondary in TIMED_OUT_STATUSES:
        return layout.TIMED_OUT, why
    if job.status == "Stopped":
        return (layout.CANCELLED, why) if stop_requested else (layout.FAILED, why + "; stopped outside ops stop")
    return layout.FAILED, why


def record_end(job: JobState, *, store, now: float) -> str | None:
    """Write the run's end marker for a job that ended without one (create-if-absent: a trainer's own
    marker, written first, wins); returns the marker the run ends with, or None while it has none."""
    return write_end(job, store=store, now=now, end_of=end_of,
                     details={"status": job.status, "secondary": job.secondary, "training_s": job.training_s,
                              "billable_s": job.billable_s})


def write_end(job: JobState, *, store, now: float, end_of, details: dict) -> str | None:
    """Every managed room's end of a run whose job ended without the trainer's marker: `end_of(job,
    stop_requested=...)` names the marker and reason, `details` the job's own fields kept beside them."""
    from runfolder.storage import PreconditionFailed

    marker = ended_marker(store)
    if marker is not None:
        return marker
    end = end_of(job, stop_requested=store.exists(layout.STOP_KEY))
    if end is None:
        return None
    stamp = datetime.datetime.fromtimestamp(now, tz=datetime.UTC).isoformat(timespec="milliseconds")
    body = {"outcome": end[0], layout.MARKER_REASON: end[1], "instance": job.name, layout.TIME: stamp,
            layout.MARKER_STEP: -1, "job": details}
    with contextlib.suppress(PreconditionFailed):
        store.put_bytes_if(end[0], (json.dumps(body) + "\n").encode(), version=None)
    return ended_marker(store)


def latest_job(client, prefix: str) -> str | None:
    """The name of the run's newest job, or None before its first."""
    jobs = run_jobs(client, prefix)
    return jobs[-1]["TrainingJobName"] if jobs else None


def stop(client, prefix: str, *, run_uri: str | None = None) -> list[str]:
    """StopTrainingJob for each of the run's jobs still running (SageMaker sends the container SIGTERM, then
    SIGKILL after 120 s); returns their names. A job already stopping or ended is left alone; with `run_uri`,
    a job that is not that run's (check_owner) is refused before any is stopped."""
    stopped = []
    running = [j for j in run_jobs(client, prefix) if j["TrainingJobStatus"] == "InProgress"]
    for j in running if run_uri is not None else []:
        check_owner(client.describe_training_job(TrainingJobName=j["TrainingJobName"]), run_uri)
    for j in running:
        client.stop_training_job(TrainingJobName=j["TrainingJobName"])
        stopped.append(j["TrainingJobName"])
    return stopped


def client_for(spec_or_region, *, client=None):
    """A SageMaker client in the job's region with botocore's `standard` retries (transient answers are
    retried; a refusal is not), or `client` as given (tests)."""
    if client is not None:
        return client
    import boto3
    from botocore.config import Config

    region = spec_or_region.region if isinstance(spec_or_region, JobSpec) else spec_or_region
    return boto3.session.Session().client("sagemaker", region_name=region,
                                          config=Config(retries={"mode": "standard", "max_attempts": 6}))
