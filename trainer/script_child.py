"""Script mode's child: the user's command as a process of the trainer, and what it is told.

Which worker this machine is (`cluster_role`, from `TF_CONFIG` as `trainer.fit` reads it); the
command as run (`python` is the trainer's own interpreter); its environment (the run's folders as
`TRAINSTACK_*` variables, the trainer first on `PYTHONPATH`); and its start (`start_child`): in
its working folder, killed when the trainer dies, its stderr relayed without TensorFlow's start-up
lines. How it is supervised and how its exit ends the run is `trainer.script`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from runfolder import environment
from trainer.config import TrainConfig
from trainer.script_folders import ScriptFolders

# The trainer package's parent folder: put on the child's PYTHONPATH so `from trainer import fit` works.
TRAINER_ROOT = str(Path(__file__).resolve().parents[1])


def cluster_role() -> tuple[int, bool]:
    """(workers, chief) from `TF_CONFIG`, as trainer.fit reads it: the `chief` task, else worker 0."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError:
        config = {}
    cluster, task = config.get("cluster") or {}, config.get("task") or {}
    workers = sum(len(v) for k, v in cluster.items() if k in ("chief", "worker"))
    if workers <= 1:
        return 1, True
    if cluster.get("chief"):
        return workers, task.get("type") == "chief"
    return workers, task.get("type") == "worker" and int(task.get("index", 0)) == 0


def child_env(cfg: TrainConfig, folders: ScriptFolders, *, attempt: int, workers: int) -> dict:
    """The child's environment: the run's folders and the trainer on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != environment.COMMAND}
    path = [TRAINER_ROOT, folders.workdir]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    # What the child is told (trainer.fit reads the same names).
    env.update({
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        environment.RUN_URI: cfg.run_uri,
        environment.CHECKPOINT_DIR: folders.dirs["checkpoints"],
        environment.TENSORBOARD_DIR: folders.dirs["tensorboard"],
        environment.MODEL_DIR: folders.dirs["model"],
        environment.OUTPUT_DIR: folders.dirs["outputs"],
        environment.MESSAGES_FILE: folders.messages,
        environment.ATTEMPT: str(attempt),
        environment.KEEP_CHECKPOINTS: str(cfg.keep_checkpoints),
        environment.SEED: str(cfg.seed),
    })
    # The cadence as this process resolved it (extraArgs over the env file; 0 is off): the
    # variable the child inherits may say otherwise.
    env[environment.CHECKPOINT_EVERY_SECONDS] = f"{cfg.checkpoint_every_seconds or 0:g}"
    if not cfg.verbose:
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if workers > 1:
        # Keras 3's fit fails under MultiWorkerMirroredStrategy: tf.keras is Keras 2 here.
        env.setdefault("TF_USE_LEGACY_KERAS", "1")
    return env


def start_child(cfg: TrainConfig, folders: ScriptFolders, env: dict) -> tuple[subprocess.Popen, threading.Thread | None]:
    """The command, started in its working folder; and the thread relaying its stderr (None with --verbose)."""
    child = subprocess.Popen(child_command(cfg.command), cwd=folders.workdir, env=env,
                             preexec_fn=die_with_parent, stderr=None if cfg.verbose else subprocess.PIPE)
    relay = None
    if child.stderr is not None:
        # A daemon: a process the command left behind, holding its stderr, never holds the trainer.
        relay = threading.Thread(target=relay_stderr, args=(child.stderr,), daemon=True)
        relay.start()
    return child, relay


def relay_stderr(pipe) -> None:
    """The child's stderr to ours, line by line, without TensorFlow's known start-up lines
    (trainer/quiet.py: TF_NOISE); `--verbose` leaves the child's stderr as it is."""
    from trainer.quiet import TF_NOISE

    out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
    for raw in iter(pipe.readline, b""):
        line = raw.decode(errors="replace")
        if TF_NOISE.match(line):
            continue
        if out is not None:
            out.write(raw)
            out.flush()
        else:
            sys.stderr.write(line)
    pipe.close()


def die_with_parent() -> None:
    """In the child before exec (Linux): killed when the trainer dies, so a SIGKILLed trainer
    leaves no script training on, unleased, beside the next attempt."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def child_command(command) -> list[str]:
    """The command as run: `python` / `python3` is the interpreter running the trainer (the same
    environment, with TensorFlow), whatever `python` PATH would find first."""
    from trainer.config import SELF_PYTHON

    words = list(command)
    if words[0] in SELF_PYTHON:
        words[0] = sys.executable
    return words
