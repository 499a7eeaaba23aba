"""`ops start` (ops/jobs.py): a SageMaker stack's run is submitted once, from the stack's `sagemakerJob`
output, and recorded in the run folder's scheduler.json; a stack of groups has nothing to submit."""

from __future__ import annotations

import dataclasses
import json

import boto3
import pytest
from moto import mock_aws

from ops import hosts, jobs
from ops.__main__ import main
from runfolder import layout
from runfolder.storage import open_store
from tests.schedulers.test_sagemaker_submit import NOW, SPEC


@pytest.fixture
def client(monkeypatch):
    for k in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    with mock_aws():
        yield boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s",
                                    region_name="us-east-1").client("sagemaker")


def test_start_submits_once_and_records_the_job(tmp_path, client):
    store = open_store((tmp_path / "run").as_uri())
    first = jobs.start(SPEC, store=store, client=client, now=NOW)
    again = jobs.start(SPEC, store=store, client=client, now=NOW + 5)
    assert (first.outcome, again.outcome) == ("submitted", "complete")
    assert json.loads(store.get_bytes(layout.SCHEDULER_KEY)) == {
        "scheduler": "sagemaker", "region": "us-east-1", "job_prefix": SPEC.job_prefix, "job": first.job}
    assert [j["TrainingJobName"] for j in client.list_training_jobs()["TrainingJobSummaries"]] == [first.job]


def test_start_on_a_stack_of_groups_says_there_is_nothing_to_submit(monkeypatch, capsys):
    monkeypatch.setattr(hosts, "stack_outputs", lambda stack: {"runUri": "s3://b/runs/dev", "groupName": "g"})
    assert main(["start", "--stack", "dev"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ops start: stack dev trains on its own spot groups") and err.count("\n") == 1


def test_start_refuses_a_job_output_from_another_checkout(monkeypatch, capsys):
    doc = {**dataclasses.asdict(SPEC), "instance_types": ["ml.g5.xlarge"]}
    monkeypatch.setattr(hosts, "stack_outputs", lambda stack: {"sagemakerJob": json.dumps(doc)})
    assert main(["start", "--stack", "sm"]) == 2
    assert "does not read as a job" in capsys.readouterr().err


def test_status_of_a_sagemaker_stack_before_its_start_says_to_start_it(monkeypatch):
    monkeypatch.setattr(hosts, "_outputs_once", lambda stack: {
        "runUri": "s3://b/runs/sm", "groupName": "", "sagemakerJob": json.dumps(dataclasses.asdict(SPEC))})
    with pytest.raises(hosts.HostsError, match="not submitted yet: python -m ops start --stack sm"):
        hosts.stack_group_state("sm")
