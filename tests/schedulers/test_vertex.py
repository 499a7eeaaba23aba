"""The Vertex AI room (schedulers/vertex.py): the CustomJob the run's job is submitted with, checked against
the aiplatform v1 discovery document's schemas (the discovery client sends any body), submitted once, its
state mapped into the run folder, and cancelled by `ops stop`.

`HttpMockSequence` stands for the service under the discovery client google-api-python-client builds from
the document it ships; the run folder is a local one (`file://`), read and written as the bucket is.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlparse

import pytest
from googleapiclient.http import HttpMockSequence

from runfolder import layout
from runfolder.storage import open_store
from schedulers import vertex
from schedulers.vertex import JobSpec, SubmitError
from tests.fixtures import discovery

NOW = 1_800_000_000.0
SPEC = JobSpec(
    project="trainstack-demo", region="us-central1", run_uri="gs://trainstack-vx-bucket/runs/exp-7",
    image="us-central1-docker.pkg.dev/trainstack-demo/trainstack/vx@sha256:" + "a" * 64,
    service_account="trainstack-vx-machine@trainstack-demo.iam.gserviceaccount.com",
    job_prefix="trainstack-vx-exp-7", machine_type="g2-standard-8", accelerator_type="NVIDIA_L4",
    accelerator_count=1, nodes=1, disk_gb=200, spot=True, max_runtime_s=10 * 3600,
    env={"TRAINSTACK_STEPS": "20000", "TRAINSTACK_SYNTHETIC": "1"})
PARENT = "projects/trainstack-demo/locations/us-central1"
DOC = discovery.document("aiplatform", "v1")


def _errors(body: dict, schema: str = "GoogleCloudAiplatformV1CustomJob") -> list[str]:
    return discovery.invalid(body, {"$ref": schema}, DOC["schemas"], "body")


def _job(n: int, state: str, *, run_uri: str = SPEC.run_uri, error: dict | None = None) -> dict:
    job = {"name": f"{PARENT}/customJobs/{100 + n}", "displayName": f"{SPEC.job_prefix}--{n}", "state": state,
           "labels": {vertex.RUN_LABEL: SPEC.job_prefix},
           "jobSpec": {"baseOutputDirectory": {"outputUriPrefix": vertex.output_path(run_uri)}}}
    if error:
        job["error"] = error
    assert not _errors(job)  # the stand-in's answers are in the documented shape too
    return job


def _api(*answers: dict) -> tuple:
    http = HttpMockSequence([({"status": "200"}, json.dumps(a)) for a in answers])
    return vertex.client(SPEC.region, http=http), http


def _methods(http) -> list[str]:
    return [f"{method} {urlparse(uri).path.split('/customJobs')[-1] or '/'}" for uri, method, *_ in http.request_sequence]


@pytest.fixture
def store(tmp_path):
    return open_store((tmp_path / "run").as_uri())


def test_the_custom_job_is_spot_to_the_runs_deadline_by_digest_and_in_the_documents_shape():
    body = vertex.custom_job(SPEC, name="trainstack-vx-exp-7--1", deadline=NOW + 7200, now=NOW)
    assert _errors(body) == []
    spec = body["jobSpec"]
    assert spec["scheduling"] == {"strategy": "SPOT", "restartJobOnWorkerRestart": True, "timeout": "7200s"}
    assert spec["serviceAccount"] == SPEC.service_account
    pool = spec["workerPoolSpecs"]
    assert len(pool) == 1 and pool[0]["replicaCount"] == "1"
    assert pool[0]["machineSpec"] == {"machineType": "g2-standard-8", "acceleratorType": "NVIDIA_L4",
                                      "acceleratorCount": 1}
    assert pool[0]["containerSpec"]["imageUri"] == SPEC.image and pool[0]["containerSpec"]["args"] == ["train"]
    assert {"name": "TRAINSTACK_STEPS", "value": "20000"} in pool[0]["containerSpec"]["env"]
    assert {"name": "TRAINSTACK_RUN_URI", "value": SPEC.run_uri} in pool[0]["containerSpec"]["env"]
    assert body["labels"] == {vertex.RUN_LABEL: SPEC.job_prefix}


def test_the_check_bites_on_a_body_the_document_refuses():
    body = vertex.custom_job(SPEC, name="x--1", deadline=NOW + 60, now=NOW)
    body["jobSpec"]["scheduling"]["strategy"] = "PREEMPTIBLE"
    body["jobSpec"]["workerPoolSpecs"][0]["replicaCount"] = 1
    body["jobSpec"]["maxRuntime"] = "1h"
    assert len(_errors(body)) == 3


def test_the_base_output_directory_is_beside_the_runs_own_names_not_the_run_folder():
    body = vertex.custom_job(SPEC, name="x--1", deadline=NOW + 60, now=NOW)
    base = body["jobSpec"]["baseOutputDirectory"]["outputUriPrefix"]
    assert base == "gs://trainstack-vx-bucket/runs/exp-7/vertex/"
    # Vertex's <base>/checkpoints/ and <base>/logs/ are not the run folder's checkpoints/ and logs/.
    assert base.rstrip("/") != SPEC.run_uri.rstrip("/")


def test_several_nodes_are_a_chief_pool_and_a_worker_pool_on_the_same_machines():
    import dataclasses

    body = vertex.custom_job(dataclasses.replace(SPEC, nodes=4), name="x--1", deadline=NOW + 60, now=NOW)
    pools = body["jobSpec"]["workerPoolSpecs"]
    assert [p["replicaCount"] for p in pools] == ["1", "3"]
    assert pools[0]["machineSpec"] == pools[1]["machineSpec"] and _errors(body) == []


def test_no_accelerator_and_no_spot_leave_their_fields_out():
    import dataclasses

    s = dataclasses.replace(SPEC, accelerator_type="", accelerator_count=0, spot=False)
    body = vertex.custom_job(s, name="x--1", deadline=NOW + 60, now=NOW)
    assert body["jobSpec"]["workerPoolSpecs"][0]["machineSpec"] == {"machineType": "g2-standard-8"}
    assert "strategy" not in body["jobSpec"]["scheduling"] and _errors(body) == []


def test_an_image_by_tag_or_a_passed_deadline_is_refused():
    import dataclasses

    with pytest.raises(SubmitError, match="not pinned by digest"):
        vertex.custom_job(dataclasses.replace(SPEC, image="x/y:latest"), name="x--1", deadline=NOW + 60, now=NOW)
    with pytest.raises(SubmitError, match="deadline passed 5 s ago"):
        vertex.custom_job(SPEC, name="x--1", deadline=NOW - 5, now=NOW)


def test_the_first_launch_creates_the_runs_first_job_with_the_runs_deadline(store):
    api, http = _api({}, {"name": f"{PARENT}/customJobs/101", **_job(1, "JOB_STATE_QUEUED")})
    done = vertex.launch(SPEC, api=api, store=store, now=NOW)
    assert done.outcome == "submitted" and done.job == f"{PARENT}/customJobs/101"
    assert _methods(http) == ["GET /", "POST /"]
    listed = parse_qs(urlparse(http.request_sequence[0][0]).query)
    assert listed["filter"] == [f'labels.{vertex.RUN_LABEL}="{SPEC.job_prefix}"']
    sent = json.loads(http.request_sequence[1][2])
    assert sent == done.request and _errors(sent) == []
    assert sent["displayName"] == "trainstack-vx-exp-7--1"
    assert sent["jobSpec"]["scheduling"]["timeout"] == f"{SPEC.max_runtime_s}s"
    assert store.get_bytes(layout.DEADLINE_KEY) == f"{int(NOW) + SPEC.max_runtime_s}\n".encode()
    assert http.request_sequence[1][0].startswith("https://us-central1-aiplatform.googleapis.com/v1/" + PARENT)


@pytest.mark.parametrize("state, outcome", [("JOB_STATE_PENDING", "running"), ("JOB_STATE_RUNNING", "running"),
                                            ("JOB_STATE_SUCCEEDED", "complete")])
def test_a_second_submit_for_a_running_or_succeeded_job_makes_no_create_call(store, state, outcome):
    api, http = _api({"customJobs": [_job(1, state)]})
    done = vertex.launch(SPEC, api=api, store=store, now=NOW)
    assert done.outcome == outcome and done.job == f"{PARENT}/customJobs/101"
    assert _methods(http) == ["GET /"]


def test_an_ended_run_is_not_submitted_and_asks_nothing(store):
    store.put_bytes(layout.COMPLETE, b"{}\n")
    api, http = _api()
    assert vertex.launch(SPEC, api=api, store=store, now=NOW).outcome == "ended"
    assert http.request_sequence == []


def test_after_a_failed_job_the_next_is_numbered_on_across_pages_and_the_deadline_counts_from_the_first(store):
    store.put_bytes(layout.DEADLINE_KEY, f"{int(NOW) + 3600}\n".encode())
    other = {**_job(9, "JOB_STATE_RUNNING"), "displayName": "trainstack-vx-exp-70--9"}  # another run's name
    api, http = _api({"customJobs": [_job(1, "JOB_STATE_FAILED")], "nextPageToken": "t"},
                     {"customJobs": [_job(2, "JOB_STATE_CANCELLED"), other]}, _job(3, "JOB_STATE_QUEUED"))
    done = vertex.launch(SPEC, api=api, store=store, now=NOW)
    assert done.outcome == "submitted" and done.request["displayName"] == "trainstack-vx-exp-7--3"
    assert done.request["jobSpec"]["scheduling"]["timeout"] == "3600s"  # what is left, not the whole cap
    assert _methods(http) == ["GET /", "GET /", "POST /"]


@pytest.mark.parametrize("state, error, marker", [
    ("JOB_STATE_SUCCEEDED", None, None),  # the trainer wrote COMPLETE itself
    ("JOB_STATE_RUNNING", None, None),
    ("JOB_STATE_FAILED", {"code": 4, "message": "Job exceeded its timeout"}, layout.TIMED_OUT),
    ("JOB_STATE_EXPIRED", None, layout.TIMED_OUT),
    ("JOB_STATE_FAILED", {"code": 13, "message": "The replica workerpool0-0 exited with a non-zero status of 1"},
     layout.FAILED),
    ("JOB_STATE_CANCELLED", None, layout.FAILED),  # cancelled outside ops stop
])
def test_a_job_that_ended_without_the_trainers_marker_ends_the_run(store, state, error, marker):
    api, http = _api(_job(1, state, error=error))
    job = vertex.job_state(api, f"{PARENT}/customJobs/101", run_uri=SPEC.run_uri)
    assert job.status == state and job.saving is None
    assert vertex.record_end(job, store=store, now=NOW) == marker
    if marker:
        body = json.loads(store.get_bytes(marker))
        assert body["outcome"] == marker and state in body[layout.MARKER_REASON]
        if error:
            assert error["message"] in body[layout.MARKER_REASON]


def test_a_cancel_ops_stop_asked_for_ends_the_run_cancelled_and_the_trainers_marker_wins(tmp_path):
    api, _ = _api(_job(1, "JOB_STATE_CANCELLED"))
    job = vertex.job_state(api, f"{PARENT}/customJobs/101")
    stopped, finished = (open_store((tmp_path / n).as_uri()) for n in ("stopped", "finished"))
    stopped.put_bytes(layout.STOP_KEY, b"{}\n")
    assert vertex.record_end(job, store=stopped, now=NOW) == layout.CANCELLED
    finished.put_bytes(layout.COMPLETE, b"{}\n")
    assert vertex.record_end(job, store=finished, now=NOW) == layout.COMPLETE
    assert not finished.exists(layout.FAILED)


def test_another_runs_job_is_refused_by_its_output_directory():
    api, _ = _api(_job(1, "JOB_STATE_RUNNING", run_uri="gs://trainstack-vx-bucket/runs/other"))
    with pytest.raises(SubmitError, match="not this run's job"):
        vertex.job_state(api, f"{PARENT}/customJobs/101", run_uri=SPEC.run_uri)


def test_stop_cancels_the_runs_running_jobs_only():
    api, http = _api({"customJobs": [_job(1, "JOB_STATE_FAILED"), _job(2, "JOB_STATE_RUNNING")]}, {})
    assert vertex.stop(api, where=PARENT, prefix=SPEC.job_prefix, run_uri=SPEC.run_uri) == [f"{PARENT}/customJobs/102"]
    assert _methods(http) == ["GET /", "POST /102:cancel"]


def test_stop_refuses_a_job_that_is_not_the_runs_before_cancelling_any():
    api, http = _api({"customJobs": [_job(1, "JOB_STATE_RUNNING"),
                                     _job(2, "JOB_STATE_RUNNING", run_uri="gs://b/runs/other")]})
    with pytest.raises(SubmitError, match="not this run's job"):
        vertex.stop(api, where=PARENT, prefix=SPEC.job_prefix, run_uri=SPEC.run_uri)
    assert _methods(http) == ["GET /"]


def test_the_job_spec_reads_from_the_stacks_json_and_a_wrong_one_says_so():
    import dataclasses

    assert JobSpec.from_json(json.dumps(dataclasses.asdict(SPEC))) == SPEC
    with pytest.raises(SubmitError, match="vertexJob output"):
        JobSpec.from_json('{"project": "p"}')
