"""The image's `train` under SageMaker: the job's container contract mapped onto the trainer's own.

SageMaker runs the image as `IMAGE train` and gives the container, with no training toolkit
(the `SM_*` variables exist only with it, so nothing here reads them):

- `/opt/ml/input/config/hyperparameters.json`: the job's hyperparameters, strings. The stack sets
  them to the trainer's own `TRAINSTACK_*` options (components/aws/job.py), which become the
  trainer's environment here; any other key is not the trainer's and is refused;
- `TRAINING_JOB_NAME`: the job, with the host, names this machine in the run's lease;
- `/opt/ml/input/config/resourceconfig.json`: the job's hosts (`algo-1`, `algo-2`, ...) and this
  one; several hosts become `TF_CONFIG` (one worker per host, in SageMaker's order, on the port
  the groups' workers use), as rendezvous makes it on a group;
- `/opt/ml/model`, uploaded at the end: the trainer exports its model to the run folder's `model/`
  itself, as on a group; SageMaker's copy is left empty.

A stop (a spot interruption, `StopTrainingJob`, the wait running out) is SIGTERM, then SIGKILL
after 120 s. The trainer replaces this process (`exec`), so the signal reaches it directly: it
commits a checkpoint and exits 143, and SageMaker's restart resumes from it exactly as a group's
new machine does. `TRAINSTACK_OPT_ML` moves `/opt/ml` (the tests lay one out in a folder).

The same `train` under a Vertex AI CustomJob (it names the job, CLOUD_ML_JOB_ID, or its AIP_* output
directories) maps that contract instead: trainer/vertex_entry.py.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from runfolder import environment

OPT_ML = "/opt/ml"
WORKER_PORT = 2222  # the groups' worker port (userdata/lib.sh's WORKER_PORT_DEFAULT)
# What a hyperparameter may set besides the trainer's options: the Keras a script mode command runs.
ALSO_ALLOWED = ("TF_USE_LEGACY_KERAS",)


class ContractError(Exception):
    """The container was not given what SageMaker gives a job; the message says what is missing."""


def _read_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ContractError(f"{path} is missing: the image runs as a SageMaker training job (IMAGE train)") from None
    except ValueError as e:
        raise ContractError(f"{path} is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ContractError(f"{path} holds {type(doc).__name__}, not an object")
    return doc


def tf_config(resource: Mapping) -> str | None:
    """TF_CONFIG for the job's hosts (resourceconfig.json), None for one host."""
    hosts, current = list(resource.get("hosts") or []), resource.get("current_host")
    if len(hosts) <= 1:
        return None
    if current not in hosts:
        raise ContractError(f"resourceconfig.json: current_host {current!r} is not among hosts {hosts}")
    return json.dumps({"cluster": {"worker": [f"{h}:{WORKER_PORT}" for h in hosts]},
                       "task": {"type": "worker", "index": hosts.index(current)}})


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The trainer's environment under the job: its options from the hyperparameters, its machine's name,
    and TF_CONFIG for several hosts."""
    config = Path(environ.get(environment.OPT_ML) or OPT_ML) / "input" / "config"
    hyper = _read_json(config / "hyperparameters.json")
    resource = _read_json(config / "resourceconfig.json")
    env: dict[str, str] = {}
    for key, value in hyper.items():
        if not (key.startswith(environment.PREFIX) or key in ALSO_ALLOWED):
            raise ContractError(f"hyperparameter {key!r} is not a trainer option (TRAINSTACK_*); the stack sets them")
        env[key] = str(value)
    if not env.get(environment.RUN_URI):
        raise ContractError(f"hyperparameter {environment.RUN_URI} is missing: the job has no run folder")
    job = environ.get("TRAINING_JOB_NAME") or "sagemaker"
    env[environment.MACHINE_ID] = f"{job}/{resource.get('current_host') or 'algo-1'}"
    cluster = tf_config(resource)
    if cluster is not None:
        env["TF_CONFIG"] = cluster
    return env


def main(argv: list[str] | None = None) -> int:
    """`train`: set the trainer's environment from the job's files and become `python -m trainer`."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["train"]:
        print(f"expected the argument train (SageMaker and Vertex AI run IMAGE train), got {args!r}", file=sys.stderr)
        return 2
    from trainer import vertex_entry

    try:
        env = vertex_entry.job_environment(os.environ) if vertex_entry.is_vertex(os.environ) else job_environment(os.environ)
    except (ContractError, vertex_entry.ContractError) as e:
        print(f"train: {e}", file=sys.stderr)
        return 2
    os.execve(sys.executable, [sys.executable, "-m", "trainer"], {**os.environ, **env})  # noqa: S606 - no shell, by design
    return 0  # not reached: exec replaces the process


if __name__ == "__main__":
    sys.exit(main())
