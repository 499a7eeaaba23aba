"""The image's `train` under a Vertex AI CustomJob (trainer/vertex_entry.py): the container's variables, laid
out from the very CustomJob schedulers/vertex.py submits, mapped onto the trainer's run folder and cluster;
and a job stopped mid-run resumes to the same weights as one never stopped.

The harness gives the container what Vertex AI gives it for the CustomJob the room builds from the stack's
own `vertexJob` fields (components/gcp/job.py's env): the pool's `env`, `CLOUD_ML_JOB_ID` and the `AIP_*`
directories under its baseOutputDirectory. It runs the image's own entry as Vertex AI does (the pool's
`args`, `train`, on the PATH), stops it as a Spot preemption or a cancel does (SIGTERM, SIGKILL when the
container has not exited by the end of Compute Engine's 30 s preemption notice), starts it again as
`restartJobOnWorkerRestart` does, and compares the final weights with an uninterrupted run's: max |Δ| = 0.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from runfolder import environment
from schedulers import vertex
from tests.schedulers.test_vertex import NOW, SPEC
from tests.trainer.test_sagemaker_entry import _run_to_end, _train
from trainer import sagemaker_entry, vertex_entry

# What Compute Engine gives a Spot VM between its preemption notice and the stop: the container's grace.
KILL_AFTER_S = 30

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


def submitted_job(run_uri: str, *, steps: int) -> dict:
    """The CustomJob the room submits for a vertex stack of this run, its env the stack's own (components/gcp/job.py's
    job_env). Its run folder is local (`run_uri`, file://) where the stack's is in GCS."""
    from components.gcp.job import job_env
    from components.settings import load_settings

    s = load_settings({
        "cloud": "gcp", "region": "us-central1", "project": "trainstack-demo", "scheduler": "vertex",
        "image": {"build": True}, "compute": {"instanceTypes": ["g2-standard-8"]},
        "run": {"synthetic": True, "steps": steps, "batchSize": 32, "seed": 11, "checkpointEverySteps": 25,
                "extraArgs": ["--deterministic", "--log-every=25"]},
    }, stack="vx")
    spec = dataclasses.replace(SPEC, run_uri=run_uri, env=job_env(s, run_uri))
    return vertex.custom_job(spec, name="trainstack-vx-exp-7--1", deadline=NOW + 3600, now=NOW)


def lay_out(body: dict, *, job_id: str) -> dict[str, str]:
    """The chief container's variables for `body` as Vertex AI sets them. This machine has no GPU: the trainer is
    told to expect none (the job asks for the stack's L4)."""
    (pool,) = body["jobSpec"]["workerPoolSpecs"]
    assert pool["containerSpec"]["args"] == ["train"]  # what the harness runs: the image's own entry
    base = body["jobSpec"]["baseOutputDirectory"]["outputUriPrefix"]
    env = {e["name"]: e["value"] for e in pool["containerSpec"]["env"]}
    return {**env, environment.GPUS_PER_NODE: "0", "CLOUD_ML_JOB_ID": job_id, "AIP_MODEL_DIR": base + "model/",
            "AIP_CHECKPOINT_DIR": base + "checkpoints/", "AIP_TENSORBOARD_LOG_DIR": base + "logs/"}


def _stop(proc) -> int:
    """Vertex AI's stop of a Spot job's container: SIGTERM, then SIGKILL when the notice runs out."""
    import signal
    import subprocess

    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=30)


@pytest.mark.slow
def test_a_job_preempted_mid_run_resumes_to_the_uninterrupted_weights(tmp_path):
    from runfolder.storage import open_store
    from tests.trainer.helpers import committed_weights, max_abs_diff

    steps = 400  # the stop lands mid-run at any speed, as under SageMaker's harness (a call ends at each checkpoint)
    ref_uri, uri = (tmp_path / "runs/ref").as_uri(), (tmp_path / "runs/vx").as_uri()
    rc, out = _run_to_end(lay_out(submitted_job(ref_uri, steps=steps), job_id="1001"))
    assert rc == 0, out[-3000:]

    env = lay_out(submitted_job(uri, steps=steps), job_id="1002")
    proc = _train(env)
    lines = []
    for line in proc.stdout:  # bounded: the trainer ends by itself within `steps` steps
        lines.append(line)
        if '"event": "checkpoint"' in line and json.loads(line).get("step", 0) >= 50:
            break
    rc = _stop(proc)
    rest = proc.stdout.read()
    assert rc == 143, "".join(lines)[-2000:] + rest[-2000:]
    assert '"event": "preempted"' in rest

    rc, out = _run_to_end(env)  # restartJobOnWorkerRestart: the same job, the same variables
    assert rc == 0, out[-3000:]
    done = json.loads(open_store(uri).get_bytes("COMPLETE"))
    assert done["step"] == steps and done["attempts"] == 2
    # The trainer wrote its own names in the run folder, none of Vertex AI's under <run>/vertex/.
    assert not (tmp_path / "runs/vx/vertex").exists()
    diff = max_abs_diff(committed_weights(uri, steps, tmp_path / "w"), committed_weights(ref_uri, steps, tmp_path / "r"))
    assert diff == 0, diff
