"""The SageMaker job's state (schedulers/sagemaker.py, ops/status.py, ops/jobs.py): DescribeTrainingJob's
statuses through AWS's documented managed-spot sequences, read with botocore's Stubber (every response
checked against the service model), said in the run folder's words: a job that the wait outran ends the
run TIMED_OUT with the job's reason; `ops stop` stops the job (moto has no StopTrainingJob)."""

from __future__ import annotations

import datetime
import json

import boto3
import pytest
from botocore.stub import Stubber

from ops import jobs, status
from runfolder import layout
from runfolder.storage import open_store
from schedulers import sagemaker

NAME = "trainstack-sm-exp-7--1"
NOW = 1_800_000_000.0
T0 = datetime.datetime(2027, 1, 15, 10, 0, tzinfo=datetime.UTC)


def _client():
    return boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s",
                                 region_name="us-east-1").client("sagemaker")


def described(status: str, secondary: str, *, history: list[str], training: int | None = None,
              billable: int | None = None, reason: str | None = None) -> dict:
    """A DescribeTrainingJob answer: `history` the secondary statuses so far, one minute apart."""
    d = {
        "TrainingJobName": NAME, "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{NAME}",
        "ModelArtifacts": {"S3ModelArtifacts": "s3://b/runs/exp-7/sagemaker/"}, "TrainingJobStatus": status,
        "SecondaryStatus": secondary, "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 200},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200},
        "EnableManagedSpotTraining": True, "CreationTime": T0,
        "SecondaryStatusTransitions": [
            {"Status": s, "StartTime": T0 + datetime.timedelta(minutes=i), "StatusMessage": f"{s} message"}
            for i, s in enumerate(history)],
    }
    if training is not None:
        d["TrainingTimeInSeconds"] = training
    if billable is not None:
        d["BillableTimeInSeconds"] = billable
    if reason is not None:
        d["FailureReason"] = reason
    return d


# AWS's managed-spot sequences (SageMaker's "Managed Spot Training" page): an uninterrupted job; one
# interrupted and restarted; one whose wait for capacity ran out.
UNINTERRUPTED = [("InProgress", "Starting"), ("InProgress", "Downloading"), ("InProgress", "Training"),
                 ("InProgress", "Uploading"), ("Completed", "Completed")]
INTERRUPTED = [("InProgress", "Starting"), ("InProgress", "Downloading"), ("InProgress", "Training"),
               ("InProgress", "Interrupted"), ("InProgress", "Pending"), ("InProgress", "Restarting"),
               ("InProgress", "Downloading"), ("InProgress", "Training"), ("InProgress", "Uploading"),
               ("Completed", "Completed")]
WAIT_RAN_OUT = [("InProgress", "Starting"), ("InProgress", "Downloading"), ("InProgress", "Training"),
                ("InProgress", "Interrupted"), ("InProgress", "Pending"), ("Stopped", "MaxWaitTimeExceeded")]


def _walk(sequence, store, *, stop_requested=False, reason=None):
    """Each step of `sequence` as one DescribeTrainingJob answer, and what the run folder says after it."""
    c = _client()
    seen = []
    if stop_requested:
        store.put_bytes(layout.STOP_KEY, b"{}")
    with Stubber(c) as stub:
        for i, (st, sec) in enumerate(sequence):
            history = [s for _, s in sequence[: i + 1]]
            last = i == len(sequence) - 1
            stub.add_response("describe_training_job", described(
                st, sec, history=history, training=600 if last else None, billable=240 if last else None,
                reason=reason if last else None), {"TrainingJobName": NAME})
            job = sagemaker.job_state(c, NAME)
            seen.append((job.status, job.secondary, sagemaker.record_end(job, store=store, now=NOW)))
        stub.assert_no_pending_responses()
    return seen, job


@pytest.fixture
def store(tmp_path):
    return open_store((tmp_path / "run").as_uri())


def test_an_uninterrupted_job_leaves_the_ending_to_the_trainer(store):
    seen, job = _walk(UNINTERRUPTED, store)
    assert [m for *_, m in seen] == [None] * 5  # the trainer writes COMPLETE itself
    assert (job.ended, job.interruptions, job.training_s, job.billable_s) == (True, 0, 600, 240)
    assert job.saving == pytest.approx(0.6)


def test_an_interrupted_job_runs_on_and_counts_its_interruption(store):
    seen, job = _walk(INTERRUPTED, store)
    assert [m for *_, m in seen] == [None] * len(INTERRUPTED)
    assert [s for _, s, _ in seen if s in sagemaker.WAITING_STATUSES] == ["Starting", "Interrupted", "Pending",
                                                                          "Restarting"]
    assert job.interruptions == 1 and not store.exists(layout.TIMED_OUT)


def test_a_job_whose_wait_ran_out_ends_the_run_timed_out_with_its_reason(store):
    seen, _ = _walk(WAIT_RAN_OUT, store)
    assert [m for *_, m in seen] == [None] * 5 + [layout.TIMED_OUT]
    body = json.loads(store.get_bytes(layout.TIMED_OUT))
    assert body["outcome"] == layout.TIMED_OUT
    assert body[layout.MARKER_REASON] == (f"SageMaker job {NAME} Stopped (MaxWaitTimeExceeded): "
                                          "MaxWaitTimeExceeded message")
    assert body["job"] == {"status": "Stopped", "secondary": "MaxWaitTimeExceeded", "training_s": 600,
                           "billable_s": 240}


@pytest.mark.parametrize(("last", "stop", "reason", "marker"), [
    (("Failed", "Failed"), False, "AlgorithmError: the trainer exited 1", layout.FAILED),
    (("Stopped", "Stopped"), True, None, layout.CANCELLED),
    (("Stopped", "Stopped"), False, None, layout.FAILED),
    (("Stopped", "MaxRuntimeExceeded"), False, None, layout.TIMED_OUT),
])
def test_each_other_ending_has_its_marker(store, last, stop, reason, marker):
    seen, _ = _walk([("InProgress", "Training"), last], store, stop_requested=stop, reason=reason)
    assert seen[-1][2] == marker
    if reason:
        assert reason in json.loads(store.get_bytes(marker))[layout.MARKER_REASON]


def test_the_trainers_own_marker_wins(store):
    store.put_bytes(layout.COMPLETE, b'{"outcome": "COMPLETE"}')
    seen, _ = _walk(WAIT_RAN_OUT[-1:], store)
    assert seen == [("Stopped", "MaxWaitTimeExceeded", layout.COMPLETE)] and not store.exists(layout.TIMED_OUT)


def _record(store):
    store.put_bytes(layout.SCHEDULER_KEY, json.dumps({"scheduler": "sagemaker", "region": "us-east-1",
                                                      "job_prefix": "trainstack-sm-exp-7", "job": NAME}).encode())


def test_ops_status_shows_the_job_billing_and_saving_and_records_the_end(store):
    _record(store)
    st = status.read_status(store.uri if hasattr(store, "uri") else "file:///x", store=store)
    c = _client()
    with Stubber(c) as stub:
        stub.add_response("describe_training_job", described("Stopped", "MaxWaitTimeExceeded", history=[
            s for _, s in WAIT_RAN_OUT], training=600, billable=240), {"TrainingJobName": NAME})
        assert status.with_job(st, store, client=c, now=NOW) is True
    rows = dict(status.job_lines(st.job))
    assert rows["job"] == f"{NAME}  Stopped / MaxWaitTimeExceeded  MaxWaitTimeExceeded message"
    assert rows["billing"] == ("training 600 s   billable 240 s   managed-spot saving 60% (1 - billable / training)"
                               "   spot interruptions 1")
    assert store.exists(layout.TIMED_OUT)


def test_a_run_on_the_groups_has_no_job(store):
    st = status.read_status("file:///x", store=store)
    assert status.with_job(st, store, client=object()) is False and st.job is None


def test_ops_stop_stops_the_runs_running_job(store):
    _record(store)
    c = _client()
    summary = {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x", "CreationTime": T0}
    with Stubber(c) as stub:
        stub.add_response("list_training_jobs", {"TrainingJobSummaries": [
            {**summary, "TrainingJobName": "trainstack-sm-exp-7--1", "TrainingJobStatus": "Failed"},
            {**summary, "TrainingJobName": "trainstack-sm-exp-7--2", "TrainingJobStatus": "InProgress"}]},
            {"NameContains": "trainstack-sm-exp-7--"})
        stub.add_response("stop_training_job", {}, {"TrainingJobName": "trainstack-sm-exp-7--2"})
        assert jobs.stop_job(store, client=c) == ["trainstack-sm-exp-7--2"]
        stub.assert_no_pending_responses()


def test_ops_stop_on_the_groups_calls_no_service(store):
    assert jobs.stop_job(store, client=object()) == []


def test_the_status_command_reads_the_job_and_shows_the_run_timed_out(tmp_path, monkeypatch):
    import argparse

    from schedulers import JobState

    uri = (tmp_path / "run").as_uri()
    store = open_store(uri)
    _record(store)
    store.put_bytes(layout.EVENTS_KEY, b'{"event": "started", "time": "2027-01-15T10:00:00Z", "attempt": 1}\n')
    ended = JobState(name=NAME, status="Stopped", secondary="MaxWaitTimeExceeded", message="the wait ran out",
                     training_s=600, billable_s=240, ended=True)
    monkeypatch.setattr(jobs, "job_state", lambda store, client=None: ended)
    st = status._snapshot(uri, argparse.Namespace(events=5, stack=None, run_uri=uri))
    assert st.state == layout.TIMED_OUT and st.job == ended
    shown = json.loads(json.dumps(st.to_json()))["job"]
    assert (shown["secondary"], shown["billable_s"], shown["saving"]) == ("MaxWaitTimeExceeded", 240, 0.6)
    assert "MaxWaitTimeExceeded" in json.loads(store.get_bytes(layout.TIMED_OUT))[layout.MARKER_REASON]


class S3Run:
    """A run folder in S3 as ops sees it: its URI and its scheduler.json (which the job's own role could write)."""

    uri = "s3://b/runs/exp-7"

    def __init__(self, prefix: str = "trainstack-sm-exp-7"):
        self.record = json.dumps({"scheduler": "sagemaker", "region": "us-east-1", "job_prefix": prefix,
                                  "job": f"{prefix}--2"}).encode()

    def get_bytes(self, key):
        assert key == layout.SCHEDULER_KEY
        return self.record


@pytest.mark.parametrize(("output", "stops"), [("s3://b/runs/exp-7/sagemaker/", True),
                                               ("s3://b/runs/other-run/sagemaker/", False)])
def test_ops_stop_stops_only_a_job_that_writes_to_this_run(output, stops):
    c = _client()
    summary = {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x", "CreationTime": T0,
               "TrainingJobName": "trainstack-sm-exp-7--2", "TrainingJobStatus": "InProgress"}
    d = described("InProgress", "Training", history=["Training"])
    d["OutputDataConfig"] = {"S3OutputPath": output}
    with Stubber(c) as stub:
        stub.add_response("list_training_jobs", {"TrainingJobSummaries": [summary]})
        stub.add_response("describe_training_job", d, {"TrainingJobName": "trainstack-sm-exp-7--2"})
        if stops:
            stub.add_response("stop_training_job", {}, {"TrainingJobName": "trainstack-sm-exp-7--2"})
            assert jobs.stop_job(S3Run(), client=c) == ["trainstack-sm-exp-7--2"]
        else:
            with pytest.raises(sagemaker.SubmitError, match="not this run's job"):
                jobs.stop_job(S3Run(), client=c)
        stub.assert_no_pending_responses()


def test_ops_status_names_a_job_of_another_run_and_reads_nothing_from_it():
    c = _client()
    d = described("Stopped", "MaxWaitTimeExceeded", history=["MaxWaitTimeExceeded"])
    d["OutputDataConfig"] = {"S3OutputPath": "s3://b/runs/other-run/sagemaker/"}
    from ops.runstate import NOT_STARTED, RunStatus

    st = RunStatus(run_uri=S3Run.uri, state=NOT_STARTED)
    with Stubber(c) as stub:
        stub.add_response("describe_training_job", d, {"TrainingJobName": "trainstack-sm-exp-7--2"})
        assert status.with_job(st, S3Run(), client=c) is False
    assert st.job is None and "not this run's job" in st.job_note
