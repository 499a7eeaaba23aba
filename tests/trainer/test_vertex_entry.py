"""The image's `train` under a Vertex AI CustomJob (trainer/vertex_entry.py): the container's variables, laid
out from the very CustomJob schedulers/vertex.py submits, mapped onto the trainer's run folder and cluster."""

from __future__ import annotations

import json
import os

import pytest

from runfolder import environment
from schedulers import vertex
from tests.schedulers.test_vertex import NOW, SPEC
from trainer import sagemaker_entry, vertex_entry

RUN = SPEC.run_uri


def _container(**extra: str) -> dict[str, str]:
    """What Vertex AI gives the chief's container of the job the room submits: the request's env and the
    AIP_* directories under its baseOutputDirectory."""
    body = vertex.custom_job(SPEC, name="trainstack-vx-exp-7--1", deadline=NOW + 3600, now=NOW)
    base = body["jobSpec"]["baseOutputDirectory"]["outputUriPrefix"]
    env = {e["name"]: e["value"] for e in body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"]}
    return {**env, "CLOUD_ML_JOB_ID": "8812345", "AIP_MODEL_DIR": base + "model/",
            "AIP_CHECKPOINT_DIR": base + "checkpoints/", "AIP_TENSORBOARD_LOG_DIR": base + "logs/", **extra}




def test_one_replica_is_named_by_the_job_and_gets_no_cluster():
    environ = _container()
    assert vertex_entry.is_vertex(environ)
    assert vertex_entry.job_environment(environ) == {environment.MACHINE_ID: "8812345/chief-0"}


def test_vertex_chief_and_workers_become_the_trainers_workers_chief_first():
    cluster = {"chief": ["cmle-chief-0:2222"], "worker": ["cmle-w-0:2222", "cmle-w-1:2222"]}
    environ = _container(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1},
                                                              "environment": "cloud"}))
    env = vertex_entry.job_environment(environ)
    assert json.loads(env["TF_CONFIG"]) == {"cluster": {"worker": ["cmle-chief-0:2222", "cmle-w-0:2222", "cmle-w-1:2222"]},
                                            "task": {"type": "worker", "index": 2}}
    assert env[environment.MACHINE_ID] == "8812345/worker-1"


def test_cluster_spec_alone_names_the_pools_as_tf_config_does():
    spec = {"cluster": {"workerpool0": ["c:2222"], "workerpool1": ["w0:2222"]}, "task": {"type": "workerpool0", "index": 0}}
    env = vertex_entry.job_environment(_container(CLUSTER_SPEC=json.dumps(spec)))
    assert json.loads(env["TF_CONFIG"])["cluster"]["worker"] == ["c:2222", "w0:2222"]
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}


def test_a_base_output_directory_that_is_the_run_folder_is_refused():
    environ = _container(AIP_CHECKPOINT_DIR=RUN + "/checkpoints/")
    with pytest.raises(vertex_entry.ContractError, match="AIP_CHECKPOINT_DIR .* in the run folder itself"):
        vertex_entry.job_environment(environ)


def test_no_run_folder_or_a_parameter_server_pool_is_refused():
    with pytest.raises(vertex_entry.ContractError, match="TRAINSTACK_RUN_URI is missing"):
        vertex_entry.job_environment({k: v for k, v in _container().items() if k != environment.RUN_URI})
    ps = {"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "task": {"type": "chief", "index": 0}}
    with pytest.raises(vertex_entry.ContractError, match=r"pools \['ps'\]"):
        vertex_entry.job_environment(_container(TF_CONFIG=json.dumps(ps)))


def test_the_images_train_takes_vertex_s_contract_and_becomes_the_trainer(monkeypatch):
    environ = _container()
    for k in list(os.environ):
        if k.startswith(("AIP_", "CLOUD_ML", "TRAINSTACK_")) or k in ("TF_CONFIG", "CLUSTER_SPEC"):
            monkeypatch.delenv(k)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    seen = {}
    monkeypatch.setattr(sagemaker_entry.os, "execve", lambda path, argv, env: seen.update(argv=argv, env=env))
    assert sagemaker_entry.main(["train"]) == 0
    assert seen["argv"][1:] == ["-m", "trainer"]
    assert seen["env"][environment.MACHINE_ID] == "8812345/chief-0" and seen["env"][environment.RUN_URI] == RUN
