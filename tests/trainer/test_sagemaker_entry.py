"""The image's `train` under SageMaker (trainer/sagemaker_entry.py): the job's /opt/ml becomes the trainer's
environment, and a job interrupted mid-run resumes to the same weights as one never interrupted.

The harness lays out a temporary /opt/ml from the very CreateTrainingJob request the stack's submit
builds (schedulers/sagemaker.py: its HyperParameters, its ResourceConfig's hosts, its job name), runs the
image's own entry as SageMaker does (`train` on the PATH), stops it as SageMaker stops a job (SIGTERM,
SIGKILL 120 s later if it has not exited), starts it again as the service restarts it, and compares the
final weights with an uninterrupted run's: max |Δ| = 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from components.aws.job import hyperparameters
from components.settings import load_settings
from runfolder import environment
from schedulers import sagemaker
from trainer import sagemaker_entry
from trainer.sagemaker_entry import ContractError, job_environment, tf_config

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0
KILL_AFTER_S = 120  # SageMaker's SIGKILL after a stop's SIGTERM


def _settings(steps: int = 300):
    return load_settings({
        "cloud": "aws", "region": "us-east-1", "scheduler": "sagemaker", "image": {"build": True},
        "compute": {"instanceTypes": ["g5.xlarge"]},
        "run": {"synthetic": True, "steps": steps, "batchSize": 32, "seed": 11, "checkpointEverySteps": 25,
                "extraArgs": ["--deterministic", "--log-every=25"]},
    }, stack="sm")


def submitted_request(run_uri: str, *, nodes: int = 1, steps: int = 300) -> dict:
    """The CreateTrainingJob request the submit builds for this stack's run. Its run folder is local
    (`run_uri`, file://) where the stack's is in S3: the request's own S3 output path stays an S3 one."""
    s = _settings(steps)
    spec = sagemaker.JobSpec(
        region="us-east-1", run_uri="s3://trainstack-sm-bucket/runs/sm", image="r.example/trainstack/sm@sha256:" + "b" * 64,
        role_arn="arn:aws:iam::123456789012:role/trainstack-job", job_prefix="trainstack-sm",
        instance_type="ml.g5.xlarge", instance_count=nodes, volume_gb=200, spot=True, max_runtime_s=36000,
        hyperparameters=hyperparameters(s, run_uri))
    return sagemaker.training_request(spec, name=sagemaker.job_name(spec.job_prefix, 1), deadline=NOW + 36000,
                                      now=NOW)


def lay_out(root: Path, request: dict, *, host: int = 1, cpu: bool = False) -> dict[str, str]:
    """/opt/ml as SageMaker lays it out for `request`'s job on its host `host`; returns the job's environment.
    `cpu`: this machine has no GPU, so the trainer is told to expect none (the request asks for the stack's 1)."""
    config = root / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    (root / "model").mkdir(exist_ok=True)
    hyper = {**request["HyperParameters"], **({environment.GPUS_PER_NODE: "0"} if cpu else {})}
    (config / "hyperparameters.json").write_text(json.dumps(hyper))
    hosts = [f"algo-{i + 1}" for i in range(request["ResourceConfig"]["InstanceCount"])]
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": f"algo-{host}", "hosts": hosts, "network_interface_name": "eth0"}))
    return {environment.OPT_ML: str(root), "TRAINING_JOB_NAME": request["TrainingJobName"]}


def test_the_hyperparameters_become_the_trainers_options(tmp_path):
    request = submitted_request("file:///runs/sm")
    env = job_environment(lay_out(tmp_path, request))
    assert env[environment.RUN_URI] == "file:///runs/sm"
    assert env[environment.STEPS] == "300" and env[environment.SYNTHETIC] == "1"
    assert env[environment.EXTRA_ARGS] == "--deterministic --log-every=25"
    assert env[environment.MACHINE_ID] == "trainstack-sm--1/algo-1"
    assert "TF_CONFIG" not in env
    assert env[environment.GPUS_PER_NODE] == "1"  # the stack's compute.gpusPerNode


def test_several_hosts_become_tf_config_in_sagemakers_order(tmp_path):
    request = submitted_request("file:///runs/sm", nodes=3)
    env = job_environment(lay_out(tmp_path, request, host=2))
    assert json.loads(env["TF_CONFIG"]) == {"cluster": {"worker": ["algo-1:2222", "algo-2:2222", "algo-3:2222"]},
                                            "task": {"type": "worker", "index": 1}}
    assert tf_config({"current_host": "algo-1", "hosts": ["algo-1"]}) is None
    with pytest.raises(ContractError, match="not among hosts"):
        tf_config({"current_host": "algo-9", "hosts": ["algo-1", "algo-2"]})


def test_what_is_not_a_job_is_refused(tmp_path):
    with pytest.raises(ContractError, match="hyperparameters.json is missing"):
        job_environment({environment.OPT_ML: str(tmp_path)})
    request = submitted_request("file:///runs/sm")
    env = lay_out(tmp_path, request)
    (tmp_path / "input/config/hyperparameters.json").write_text(json.dumps({"learning_rate": "0.1"}))
    with pytest.raises(ContractError, match="'learning_rate' is not a trainer option"):
        job_environment(env)
    assert sagemaker_entry.main(["serve"]) == 2


def _train(env: dict) -> subprocess.Popen:
    """The image's entry as SageMaker runs it: the program `train` on the PATH."""
    bin_dir = str(Path(sys.executable).parent)
    path = f"{REPO / 'trainer'}{os.pathsep}{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSTACK_")}
    return subprocess.Popen(["train"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**base, **env, "PATH": path, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "",
                                 "TF_CPP_MIN_LOG_LEVEL": "2"})


def _stop(proc: subprocess.Popen) -> int:
    """SageMaker's stop: SIGTERM, then SIGKILL if the container has not exited 120 s later."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=30)


def _run_to_end(env: dict, timeout: float = 600) -> tuple[int, str]:
    proc = _train(env)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


@pytest.mark.slow
def test_a_job_stopped_mid_run_resumes_to_the_uninterrupted_weights(tmp_path):
    from tests.trainer.helpers import committed_weights, max_abs_diff

    # The stop lands mid-run at any speed: a call never runs past a checkpoint (every 25 steps), so
    # the trainer stops within 25 steps of the signal, sent once step 50 is committed.
    steps = 400
    ref_uri, uri = (tmp_path / "runs/ref").as_uri(), (tmp_path / "runs/sm").as_uri()
    rc, out = _run_to_end(lay_out(tmp_path / "ref-opt-ml", submitted_request(ref_uri, steps=steps), cpu=True))
    assert rc == 0, out[-3000:]

    env = lay_out(tmp_path / "opt-ml", submitted_request(uri, steps=steps), cpu=True)
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

    rc, out = _run_to_end(env)  # SageMaker's restart of the same job: the same /opt/ml
    assert rc == 0, out[-3000:]
    from runfolder.storage import open_store

    done = json.loads(open_store(uri).get_bytes("COMPLETE"))
    assert done["step"] == steps and done["attempts"] == 2
    diff = max_abs_diff(committed_weights(uri, steps, tmp_path / "w"), committed_weights(ref_uri, steps, tmp_path / "r"))
    assert diff == 0, diff
