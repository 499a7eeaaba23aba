"""`ops start` (ops/jobs.py): a SageMaker stack's run is submitted once, from the stack's `sagemakerJob`
output (a Vertex AI stack's from its `vertexJob`), and recorded in the run folder's scheduler.json, where
`ops status` and `ops stop` find the job; a stack of groups has nothing to submit."""

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


# -- a Vertex AI stack: the same seam, over the aiplatform v1 client -------------------------------------------


def _vertex_api(*answers: dict):
    from googleapiclient.http import HttpMockSequence

    from schedulers import vertex

    http = HttpMockSequence([({"status": "200"}, json.dumps(a)) for a in answers])
    return vertex.client("us-central1", http=http), http


def test_a_vertex_start_submits_once_records_the_job_and_status_and_stop_reach_it(tmp_path):
    from ops import status
    from tests.schedulers import test_vertex as tv

    store = open_store((tmp_path / "run").as_uri())
    made = tv._job(1, "JOB_STATE_QUEUED")
    api, http = _vertex_api({}, made)
    first = jobs.start(tv.SPEC, store=store, client=api, now=tv.NOW)
    assert first.outcome == "submitted" and first.job == made["name"]
    assert json.loads(store.get_bytes(layout.SCHEDULER_KEY)) == {
        "scheduler": "vertex", "project": tv.SPEC.project, "region": "us-central1", "job_prefix": tv.SPEC.job_prefix,
        "job": made["name"]}
    api, http = _vertex_api({"customJobs": [tv._job(1, "JOB_STATE_RUNNING")]})
    assert jobs.start(tv.SPEC, store=store, client=api, now=tv.NOW + 5).outcome == "running"
    assert [m for _, m, *_ in http.request_sequence] == ["GET"]  # no second create
    api, _ = _vertex_api(tv._job(1, "JOB_STATE_RUNNING"))
    assert jobs.job_state(store, client=api).status == "JOB_STATE_RUNNING"
    api, http = _vertex_api({"customJobs": [tv._job(1, "JOB_STATE_RUNNING")]}, {})
    assert jobs.stop_job(store, client=api) == [made["name"]]
    assert http.request_sequence[-1][0].endswith(made["name"] + ":cancel?alt=json")
    # The job cancelled after ops stop's STOP: ops status ends the run CANCELLED with the job's word.
    store.put_bytes(layout.STOP_KEY, b"{}\n")
    api, _ = _vertex_api(tv._job(1, "JOB_STATE_CANCELLED"))
    st = status.read_status(store.uri, store=store)
    assert status.with_job(st, store, client=api, now=tv.NOW) is True
    assert st.job.status == "JOB_STATE_CANCELLED" and store.exists(layout.CANCELLED)
    assert dict(status.job_lines(st.job))["job"] == f"{made['name']}  JOB_STATE_CANCELLED"


def test_status_of_a_vertex_stack_before_its_start_says_to_start_it(monkeypatch):
    from tests.schedulers import test_vertex as tv

    monkeypatch.setattr(hosts, "_outputs_once", lambda stack: {
        "runUri": "gs://b/runs/vx", "groupName": "", "vertexJob": json.dumps(dataclasses.asdict(tv.SPEC))})
    with pytest.raises(hosts.HostsError, match="Vertex AI custom job, not submitted yet: python -m ops start --stack vx"):
        hosts.stack_group_state("vx")


def test_ops_start_on_the_vertex_stack_submits_its_own_output_once_in_the_documents_shape(tmp_path, monkeypatch,
                                                                                         capsys):
    from googleapiclient.http import HttpMockSequence

    from ops import synth
    from runfolder import storage
    from schedulers import vertex
    from tests.components.aws.helpers import STACKS
    from tests.fixtures import discovery

    outputs = synth.synthesize(STACKS / "Pulumi.vertex.yaml").outputs
    spec = vertex.JobSpec.from_json(outputs["vertexJob"])
    store = open_store((tmp_path / "run").as_uri())
    opened: list[str] = []
    monkeypatch.setattr(hosts, "stack_outputs", lambda stack: outputs)
    monkeypatch.setattr(storage, "open_store", lambda uri: opened.append(uri) or store)
    made = {"name": f"projects/{spec.project}/locations/{spec.region}/customJobs/7001",
            "displayName": f"{spec.job_prefix}--1", "state": "JOB_STATE_QUEUED"}
    http = HttpMockSequence([({"status": "200"}, "{}"), ({"status": "200"}, json.dumps(made))])
    regions: list[str] = []
    build = vertex.client
    monkeypatch.setattr(vertex, "client", lambda region, **kw: regions.append(region) or build(region, http=http))

    assert main(["start", "--stack", "vertex"]) == 0
    assert opened == [outputs["runUri"]] and regions == ["us-central1"]
    (_, (uri, method, body, _)) = http.request_sequence
    assert (method, uri.split("?")[0]) == (
        "POST", f"https://us-central1-aiplatform.googleapis.com/v1/projects/{spec.project}/locations/us-central1/customJobs")
    sent = json.loads(body)
    doc = discovery.document("aiplatform", "v1")
    assert discovery.invalid(sent, {"$ref": "GoogleCloudAiplatformV1CustomJob"}, doc["schemas"], "body") == []
    assert sent["jobSpec"]["serviceAccount"] == spec.service_account
    assert sent["jobSpec"]["scheduling"]["strategy"] == "SPOT"
    (pool,) = sent["jobSpec"]["workerPoolSpecs"]
    assert pool["machineSpec"] == {"machineType": "g2-standard-8", "acceleratorType": "NVIDIA_L4", "acceleratorCount": 1}
    assert pool["containerSpec"]["imageUri"] == outputs["imageRef"] and pool["containerSpec"]["args"] == ["train"]
    assert json.loads(store.get_bytes(layout.SCHEDULER_KEY))["job"] == made["name"]
    assert capsys.readouterr().out.startswith(f"submitted Vertex AI custom job {made['name']}")

    # A second start finds the queued job by its label and makes no create call.
    http = HttpMockSequence([({"status": "200"}, json.dumps({"customJobs": [made]}))])
    assert main(["start", "--stack", "vertex"]) == 0
    assert [m for _, m, *_ in http.request_sequence] == ["GET"]
    assert "is JOB_STATE_QUEUED: nothing submitted" in capsys.readouterr().out
