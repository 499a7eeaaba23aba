"""Helpers for the trainer tests: run `python -m trainer` as a real process and read what it left.

The runs go through the warm trainer server (devtools/trainer_server.py: TensorFlow imported
once per test process, a fork per run) unless a test asks for the plain process (`served=False`):
one that measures the start-up itself, or depends on what the server does differently.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from devtools import trainer_server

REPO = Path(__file__).resolve().parents[2]
# Small and quick: the defaults of these tests, not of the trainer.
FAST = ["--synthetic", "--steps", "60", "--batch-size", "32", "--checkpoint-every-steps", "20", "--log-every", "10"]


def trainer_env(base: dict | None = None, **extra: str) -> dict:
    """The environment for a trainer process: the test's variables, quiet TF, no TRAINSTACK_* leaking in."""
    env = {k: v for k, v in (base or os.environ).items() if not k.startswith("TRAINSTACK_")}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""})
    env.update(extra)
    return env


def parse_events(text: str) -> list[dict]:
    """JSON event lines from a trainer's stdout (anything else is ignored)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def trainer_command(module: str, args: list[str], env: dict, *, served: bool = True) -> tuple[list[str], dict]:
    """The argv and environment that run `python -m MODULE ARGS` in `env`: through this test
    process's warm trainer server when `served`, else as the plain process."""
    if not served:
        return [sys.executable, "-m", module, *args], env
    return trainer_server.command(module, args), {**env, trainer_server.SOCKET_VAR: trainer_server.ensure_server()}


def script_command(args: list[str], env: dict) -> tuple[list[str], dict]:
    """The argv and environment that run `python SCRIPT ARGS` (`args`) in `env` through this test
    process's warm trainer server (a Keras 2 script's, TF_USE_LEGACY_KERAS=1, through its sibling)."""
    return [trainer_server.script_launcher(trainer_server.ensure_server()), *args], env


def run_trainer(uri: str, *args: str, env: dict | None = None, timeout: float = 240,
                served: bool = True) -> tuple[int, list[dict], str]:
    """Run one attempt to its end; returns (exit code, events printed, stderr)."""
    argv, env = trainer_command("trainer", ["--run-uri", uri, *args], env or trainer_env(), served=served)
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, parse_events(p.stdout), p.stderr


class Trainer:
    """A trainer process whose events can be awaited, to signal it at a chosen moment."""

    def __init__(self, uri: str, *args: str, env: dict | None = None, module: str = "trainer", served: bool = True):
        argv, env = trainer_command(module, ["--run-uri", uri, *args], env or trainer_env(), served=served)
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events: list[dict] = []
        self._q: queue.Queue = queue.Queue()
        self.stderr = ""
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for t in self._readers:
            t.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            for ev in parse_events(line):
                self.events.append(ev)
                self._q.put(ev)
        self._q.put(None)

    def _read_err(self) -> None:
        self.stderr = self.proc.stderr.read()

    def wait_event(self, kind: str, timeout: float = 180, pred=lambda ev: True) -> dict:
        """Block until an event of `kind` matching `pred` is printed."""
        deadline = time.monotonic() + timeout
        for ev in self.events:
            if ev.get("event") == kind and pred(ev):
                return ev
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {kind} event within {timeout} s; got {[e['event'] for e in self.events]}")
            try:
                ev = self._q.get(timeout=left)
            except queue.Empty:
                continue
            if ev is None:
                raise AssertionError(f"trainer exited before {kind}: rc={self.proc.wait()} stderr={self.stderr[-2000:]}")
            if ev.get("event") == kind and pred(ev):
                return ev

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 180) -> int:
        rc = self.proc.wait(timeout=timeout)
        for t in self._readers:  # every line the process printed is in self.events after this
            t.join(timeout=30)
        return rc


def store_events(uri: str) -> list[dict]:
    """The run's events.jsonl as stored."""
    from runfolder.events import read_events
    from runfolder.storage import open_store

    return read_events(open_store(uri))


def committed_weights(uri: str, step: int, dest: Path) -> dict:
    """Model variables of the committed checkpoint `step` of a run, by checkpoint key."""
    import tensorflow as tf

    from runfolder.storage import open_store

    store = open_store(uri)
    prefix = f"checkpoints/ckpt-{step}/"
    dest.mkdir(parents=True, exist_ok=True)
    for key in store.list(prefix):
        store.get_file(key, str(dest / key[len(prefix):]))
    reader = tf.train.load_checkpoint(str(dest / "ckpt"))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k.startswith("model/")}


def max_abs_diff(a: dict, b: dict) -> float:
    """Largest |a - b| over all variables; the key sets must match."""
    import numpy as np

    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    assert a, "no variables compared"
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)


def kinds(events: list[dict]) -> list[str]:
    return [e.get("event") for e in events]




WAITING_MODEL = '''
"""A small regression model whose input waits a while before each batch, as a slow data source does.

For tests where a trainer must go on training (holding its lease, committing) while the test
does something slow, such as starting another trainer: its steps then take little CPU.
"""
import keras
import numpy as np
import tensorflow as tf
# TensorFlow's own test transformation: a sleep inside the input pipeline, saved with it.
from tensorflow.python.data.experimental.ops import testing

from trainer.models import ModelSpec

BATCH_WAIT_US = {wait_us}


def build(config):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])

    def make_dataset(batch_size, seed):
        rng = np.random.default_rng(seed)
        x, y = rng.random((512, 8), dtype=np.float32), rng.random((512, 4), dtype=np.float32)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size, drop_remainder=True).apply(
            testing.sleep(BATCH_WAIT_US))

    return ModelSpec(model=model, loss=keras.losses.MeanSquaredError(reduction=None), make_dataset=make_dataset,
                     name="waiting")
'''


def waiting_model(folder: Path, batch_wait_s: float = 0.025) -> list[str]:
    """The trainer flags for `WAITING_MODEL` (written into `folder`), each batch `batch_wait_s` late."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "waiting.py").write_text(WAITING_MODEL.format(wait_us=int(batch_wait_s * 1e6)))
    return ["--code-dir", str(folder), "--model", "waiting:build"]


def mlp_example(x, y: int) -> bytes:
    """One serialized record of the built-in `mlp` model's format (`x`: 784 floats, `y`: the label)."""
    import numpy as np
    import tensorflow as tf

    feat = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=np.asarray(x, np.float32).ravel())),
        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y)])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feat)).SerializeToString()
