"""`ops start`: submit the run's job on a managed scheduler (`trainstack:scheduler: sagemaker` or `vertex`); and what
`ops stop` and `ops status` ask the job's service besides the run folder.

A stack of spot groups starts with `pulumi up` and has nothing to submit. A SageMaker stack's `pulumi up`
makes the bucket, the image and the job's role only: a training job is a run, not infrastructure (a
resource would be replaced, so trained again, by a later `up`), so `ops start` submits it, from the
stack's `sagemakerJob` output, through schedulers/sagemaker.py, which makes no second job for a run
that has one running or completed, or has ended. A Vertex AI stack's is its `vertexJob` output, through
schedulers/vertex.py, alike. It records the job in the run folder's `scheduler.json`, where
`ops status --run-uri` and `ops stop --run-uri` find it without the stack.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ops.cli import EXIT_ERROR, EXIT_FAILED, EXIT_OK
from runfolder import layout
from schedulers import JobState

SAGEMAKER_OUTPUT = "sagemakerJob"  # components/common.py's SAGEMAKER_JOB_OUTPUT (ops cannot import components)
VERTEX_OUTPUT = "vertexJob"
# The run folder each room's jobs write to: the job's own output path is checked against it.
RUN_URI_SCHEME = {"sagemaker": "s3://", "vertex": "gs://"}


def service_errors() -> tuple[type[Exception], ...]:
    """What a managed job's service (or its client) raises for a refusal or a transient failure."""
    from botocore.exceptions import BotoCoreError, ClientError
    from google.auth.exceptions import GoogleAuthError
    from googleapiclient.errors import Error as GoogleApiError

    from schedulers.sagemaker import SubmitError

    return BotoCoreError, ClientError, GoogleAuthError, GoogleApiError, SubmitError


def read_record(store) -> dict | None:
    """The run folder's `scheduler.json` (which service runs the run, and its newest job), or None on the groups."""
    from runfolder.storage import NotFound

    try:
        doc = json.loads(store.get_bytes(layout.SCHEDULER_KEY))
    except (NotFound, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("scheduler") in RUN_URI_SCHEME else None


def write_record(store, spec, job: str) -> None:
    from schedulers import vertex

    doc = {"scheduler": "sagemaker", "region": spec.region, "job_prefix": spec.job_prefix, "job": job}
    if isinstance(spec, vertex.JobSpec):
        doc = {"scheduler": "vertex", "project": spec.project} | {k: v for k, v in doc.items() if k != "scheduler"}
    store.put_bytes(layout.SCHEDULER_KEY, json.dumps(doc).encode())


def _vertex_api(record: dict, client):
    from schedulers import vertex

    return client if client is not None else vertex.client(record["region"])


def job_state(store, *, client=None) -> JobState | None:
    """The run's job as its service reports it, or None on the groups (no scheduler.json)."""
    from schedulers import sagemaker, vertex

    record = read_record(store)
    if record is None:
        return None
    if record["scheduler"] == "vertex":
        return vertex.job_state(_vertex_api(record, client), record["job"], run_uri=_run_uri(store, record))
    c = sagemaker.client_for(record["region"], client=client)
    return sagemaker.job_state(c, record["job"], run_uri=_run_uri(store, record))


def record_end(store, job: JobState, *, now: float) -> str | None:
    """The run's end marker for its job's end (the room's record_end), or None while it has none."""
    from schedulers import sagemaker, vertex

    record = read_record(store) or {}
    room = vertex if record.get("scheduler") == "vertex" else sagemaker
    return room.record_end(job, store=store, now=now)


def stop_job(store, *, client=None) -> list[str]:
    """StopTrainingJob or CancelCustomJob for the run's running job (none on the groups); returns the jobs
    stopped."""
    from schedulers import sagemaker, vertex

    record = read_record(store)
    if record is None:
        return []
    if record["scheduler"] == "vertex":
        return vertex.stop(_vertex_api(record, client), where=f"projects/{record['project']}/locations/{record['region']}",
                           prefix=record["job_prefix"], run_uri=_run_uri(store, record))
    return sagemaker.stop(sagemaker.client_for(record["region"], client=client), record["job_prefix"],
                          run_uri=_run_uri(store, record))


def _run_uri(store, record: dict) -> str | None:
    """The run folder's URI, against which the job's own output path is checked (a local copy of a run has
    no job of its own to compare with: None)."""
    uri = getattr(store, "uri", "")
    return uri if uri.startswith(RUN_URI_SCHEME[record["scheduler"]]) else None


def start(spec, *, store=None, client=None, now: float | None = None):
    """Submit the run's job (the room's launch: schedulers.sagemaker or schedulers.vertex) and record it in
    the run folder."""
    from runfolder.storage import open_store
    from schedulers import sagemaker, vertex

    store = open_store(spec.run_uri) if store is None else store
    now = time.time() if now is None else now
    if isinstance(spec, vertex.JobSpec):
        api = client if client is not None else vertex.client(spec.region)
        done = vertex.launch(spec, api=api, store=store, now=now)
    else:
        done = sagemaker.launch(spec, client=sagemaker.client_for(spec, client=client), store=store, now=now)
    if done.job is not None and done.outcome in ("submitted", "running"):
        write_record(store, spec, done.job)
    return done


def cmd_start(args: argparse.Namespace) -> int:
    """``ops start``: submit the stack's run as a SageMaker training job or a Vertex AI CustomJob, once."""
    from ops import hosts
    from schedulers import sagemaker, vertex

    service = "SageMaker"
    try:
        outputs = hosts.stack_outputs(args.stack)
        if outputs.get(VERTEX_OUTPUT):
            service, spec = "Vertex AI", vertex.JobSpec.from_json(outputs[VERTEX_OUTPUT])
        elif outputs.get(SAGEMAKER_OUTPUT):
            spec = sagemaker.JobSpec.from_json(outputs[SAGEMAKER_OUTPUT])
        else:
            print(f"ops start: stack {args.stack} trains on its own spot groups (trainstack:scheduler groups): "
                  "`pulumi up` started it; nothing to submit", file=sys.stderr)
            return EXIT_ERROR
        done = start(spec)
    except (hosts.HostsError, sagemaker.SubmitError) as e:
        print(f"ops start: {e}", file=sys.stderr)
        return EXIT_ERROR
    except service_errors() as e:
        print(f"ops start: {service} refused the job: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_ERROR
    if done.outcome == "submitted" and service == "Vertex AI":
        print(f"submitted Vertex AI custom job {done.job} ({done.request['displayName']}, "
              f"scheduling {done.request['jobSpec']['scheduling']})")
    elif done.outcome == "submitted":
        print(f"submitted SageMaker training job {done.job} (managed spot: "
              f"{done.request['EnableManagedSpotTraining']}, stopping condition {done.request['StoppingCondition']})")
    elif done.outcome == "ended":
        print(f"ops start: {done.detail}", file=sys.stderr)
        return EXIT_FAILED
    else:
        print(f"the run's job {done.job} is {done.detail}: nothing submitted")
    print(f"follow it: python -m ops status --stack {args.stack} --watch")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``start`` to ``python -m ops``."""
    p = sub.add_parser("start", help="submit the run's SageMaker training job or Vertex AI custom job "
                          "(trainstack:scheduler sagemaker or vertex), once")
    p.add_argument("--stack", required=True,
                   help="stack name: the job comes from its sagemakerJob or vertexJob output (pulumi CLI)")
    p.set_defaults(func=cmd_start)
