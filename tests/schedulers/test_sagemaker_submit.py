"""The SageMaker room's launch (schedulers/sagemaker.py): the CreateTrainingJob request the run's job is
submitted with, checked against botocore's service model, and submitted once.

moto's SageMaker stands for the service (create, describe and list; its jobs complete at once and it
echoes the spot fields). The run folder is a local one (`file://`), read and written as the bucket is.
"""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from runfolder import layout
from runfolder.storage import open_store
from schedulers import sagemaker
from schedulers.sagemaker import JobSpec, SubmitError

NOW = 1_800_000_000.0
SPEC = JobSpec(
    region="us-east-1", run_uri="s3://trainstack-sm-bucket/runs/exp-7",
    image="123456789012.dkr.ecr.us-east-1.amazonaws.com/trainstack/sm@sha256:" + "a" * 64,
    role_arn="arn:aws:iam::123456789012:role/trainstack-job-identity-role-71c3be3",
    job_prefix="trainstack-sm-exp-7", instance_type="ml.g5.xlarge", instance_count=2, volume_gb=200, spot=True,
    max_runtime_s=10 * 3600, hyperparameters={"TRAINSTACK_STEPS": "20000", "TRAINSTACK_SYNTHETIC": "1"})


@pytest.fixture
def store(tmp_path):
    return open_store((tmp_path / "run").as_uri())


@pytest.fixture
def client(monkeypatch):
    for k in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    with mock_aws():
        yield boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s",
                                    region_name="us-east-1").client("sagemaker")


class Counting:
    """The client, counting its CreateTrainingJob calls."""

    def __init__(self, client):
        self.client, self.creates = client, []

    def create_training_job(self, **request):
        self.creates.append(request)
        return self.client.create_training_job(**request)

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_the_request_is_managed_spot_to_the_runs_deadline():
    r = sagemaker.training_request(SPEC, name="trainstack-sm-exp-7--1", deadline=NOW + 7200, now=NOW)
    assert r["EnableManagedSpotTraining"] is True
    # Two hours are left of the run's wall-clock time: the wait is bounded by them, and training within them.
    assert r["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 7200}
    assert r["AlgorithmSpecification"] == {"TrainingImage": SPEC.image, "TrainingInputMode": "File"}
    assert r["ResourceConfig"] == {"InstanceType": "ml.g5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 200}
    assert r["HyperParameters"] == SPEC.hyperparameters
    assert r["RetryStrategy"] == {"MaximumRetryAttempts": 3}
    assert r["OutputDataConfig"] == {"S3OutputPath": "s3://trainstack-sm-bucket/runs/exp-7/sagemaker/"}
    # The trainer writes its checkpoints to the run folder itself: no SageMaker sync of /opt/ml/checkpoints.
    assert "CheckpointConfig" not in r and "InputDataConfig" not in r


def test_a_fresh_run_trains_for_its_cap_and_waits_no_longer_than_its_deadline():
    r = sagemaker.training_request(SPEC, name="x--1", deadline=NOW + SPEC.max_runtime_s, now=NOW)
    assert r["StoppingCondition"] == {"MaxRuntimeInSeconds": 36000, "MaxWaitTimeInSeconds": 36000}
    on_demand = dataclasses_replace(SPEC, spot=False)
    assert sagemaker.training_request(on_demand, name="x--1", deadline=NOW + 100, now=NOW)["StoppingCondition"] \
        == {"MaxRuntimeInSeconds": 100}


def dataclasses_replace(spec, **changes):
    import dataclasses

    return dataclasses.replace(spec, **changes)


@pytest.mark.parametrize("deadline", [NOW, NOW - 5])
def test_a_run_past_its_deadline_is_not_submitted(deadline):
    with pytest.raises(SubmitError, match="deadline passed"):
        sagemaker.training_request(SPEC, name="x--1", deadline=deadline, now=NOW)


def test_max_runtime_never_exceeds_max_wait(monkeypatch):
    # The rule SageMaker documents and nobody offline checks: a cap longer than what is left is cut to it.
    for left in (1, 59, 3600, 36000, 90000):
        c = sagemaker.stopping_condition(SPEC, deadline=NOW + left, now=NOW)
        assert c["MaxRuntimeInSeconds"] <= c["MaxWaitTimeInSeconds"] == left


def test_the_image_must_be_pinned_by_digest():
    with pytest.raises(SubmitError, match="not pinned by digest"):
        sagemaker.training_request(dataclasses_replace(SPEC, image="repo/trainer:1.0"), name="x--1",
                                   deadline=NOW + 10, now=NOW)


@pytest.mark.parametrize(("change", "fragment"), [
    ({"instance_type": "ml.g5.huge"}, "InstanceType"),
    ({"role_arn": "trainstack-job-role"}, "RoleArn"),
    ({"hyperparameters": {"TRAINSTACK_STEPS": "x" * 2600}}, "HyperParameters"),
])
def test_the_request_is_checked_against_the_service_model(change, fragment):
    with pytest.raises(SubmitError, match=fragment):
        sagemaker.training_request(dataclasses_replace(SPEC, **change), name="x--1", deadline=NOW + 10, now=NOW)


def test_the_submitted_request_is_what_sagemaker_echoes(client, store):
    done = sagemaker.launch(SPEC, client=client, store=store, now=NOW)
    assert (done.outcome, done.job) == ("submitted", "trainstack-sm-exp-7--1")
    d = client.describe_training_job(TrainingJobName=done.job)
    assert d["EnableManagedSpotTraining"] is True
    assert d["StoppingCondition"] == {"MaxRuntimeInSeconds": 36000, "MaxWaitTimeInSeconds": 36000}
    assert d["AlgorithmSpecification"]["TrainingImage"] == SPEC.image
    assert d["HyperParameters"] == SPEC.hyperparameters
    # The deadline is the run folder's, written by the first start, in the machines' format.
    assert store.get_bytes(layout.DEADLINE_KEY) == f"{int(NOW) + 36000}\n".encode()


def test_a_second_launch_makes_no_create_call(client, store):
    counted = Counting(client)
    first = sagemaker.launch(SPEC, client=counted, store=store, now=NOW)
    # moto's job completes at once: a completed job is the run's; a job in progress is too (below).
    again = sagemaker.launch(SPEC, client=counted, store=store, now=NOW + 60)
    assert (first.outcome, again.outcome, again.job) == ("submitted", "complete", first.job)
    assert len(counted.creates) == 1


def test_a_job_in_progress_is_not_submitted_again(store):
    from botocore.stub import Stubber

    c = boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s",
                              region_name="us-east-1").client("sagemaker")
    with Stubber(c) as stub:
        stub.add_response("list_training_jobs", {"TrainingJobSummaries": [
            _summary("trainstack-sm-exp-7--1", "Failed"), _summary("trainstack-sm-exp-7--2", "InProgress"),
            # Another run whose prefix starts the same: not this run's.
            _summary("trainstack-sm-exp-7-b--9", "InProgress")]})
        done = sagemaker.launch(SPEC, client=c, store=store, now=NOW)
        stub.assert_no_pending_responses()
    assert (done.outcome, done.job, done.detail) == ("running", "trainstack-sm-exp-7--2", "InProgress")


def test_after_a_failed_job_the_next_has_the_next_number(client, store):
    from botocore.stub import Stubber

    with Stubber(client) as stub:
        stub.add_response("list_training_jobs", {"TrainingJobSummaries": [
            _summary("trainstack-sm-exp-7--1", "Failed"), _summary("trainstack-sm-exp-7--2", "Stopped")]})
        request = sagemaker.training_request(SPEC, name="trainstack-sm-exp-7--3", deadline=NOW + 36000, now=NOW)
        stub.add_response("create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x"},
                          request)
        done = sagemaker.launch(SPEC, client=client, store=store, now=NOW)
        stub.assert_no_pending_responses()
    assert (done.outcome, done.job) == ("submitted", "trainstack-sm-exp-7--3")


@pytest.mark.parametrize("marker", layout.END_MARKERS)
def test_an_ended_run_is_not_submitted_again(client, store, marker):
    counted = Counting(client)
    store.put_bytes(marker, json.dumps({"outcome": marker}).encode())
    done = sagemaker.launch(SPEC, client=counted, store=store, now=NOW)
    assert (done.outcome, counted.creates) == ("ended", [])


def test_a_launch_that_loses_the_race_reports_the_winners_job(store):
    from botocore.stub import Stubber

    c = boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s",
                              region_name="us-east-1").client("sagemaker")
    with Stubber(c) as stub:
        stub.add_response("list_training_jobs", {"TrainingJobSummaries": []})
        stub.add_client_error("create_training_job", "ResourceInUse", "Training job names must be unique within an "
                              "AWS account and region, and a training job with this name already exists")
        done = sagemaker.launch(SPEC, client=c, store=store, now=NOW)
    assert (done.outcome, done.job) == ("running", "trainstack-sm-exp-7--1")


def _summary(name: str, status: str) -> dict:
    import datetime

    return {"TrainingJobName": name, "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:1:training-job/{name}",
            "CreationTime": datetime.datetime(2027, 1, 1), "TrainingJobStatus": status}


def test_the_job_names_of_one_run_never_match_anothers():
    assert sagemaker.job_number("trainstack-sm-exp-7", "trainstack-sm-exp-7--12") == 12
    assert sagemaker.job_number("trainstack-sm-exp-7", "trainstack-sm-exp-7-b--1") is None
    assert sagemaker.job_number("trainstack-sm", "trainstack-sm-exp-7--1") is None
    long = sagemaker.job_prefix(project="trainstack", stack="s" * 100, run_id="r" * 60)
    assert len(sagemaker.job_name(long, 999)) <= sagemaker.JOB_NAME_MAX and "--" not in long
