"""Script mode: run the user's own command (`python -m trainer ... -- python train.py`) with the run's guarantees.

The command (a Keras `fit` script, typically) runs as a child process in `--code-dir`; this
process, the parent, never imports TensorFlow and keeps what the run folder promises:

- the run's lease (one writer per run; on a lost lease the child is killed at once, before it
  can commit again);
- the events (`started`, `resumed`, `checkpoint`, `preempted`, `finished`, `failed`,
  `cancelled`) in `events.jsonl`, and `progress.json` with the script's metrics, from the
  messages `trainer.fit`'s callback writes to a local file (`TRAINSTACK_MESSAGES_FILE`): the
  parent stays the one writer of both objects;
- `tensorboard/`: the child's TensorBoard folder (`TRAINSTACK_TENSORBOARD_DIR`) is uploaded
  every `TENSORBOARD_EVERY_S` and at the end;
- signals: SIGTERM/SIGINT (a spot notice) and the run folder's `STOP` (`ops stop`) are
  forwarded to the child as SIGTERM; it has `--stop-grace-s` to commit a checkpoint and exit
  143 before it is killed;
- the ending, from the child's exit code: 0 uploads `TRAINSTACK_MODEL_DIR` as `model/` and
  writes COMPLETE (with the last epoch's metrics); 143 (or death by the forwarded signal) is
  `preempted` and exits 143; 78 is a run that cannot work (exit 78, no retry); anything
  else is `failed` and exits 1.

Checkpoints are the child's: `trainer.fit` commits them to `checkpoints/` with the same
protocol as the trainer's own loop (`CheckpointStore`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from runfolder import exits, layout
from runfolder.lease import LeaseLost
from trainer.config import TrainConfig, as_dict
from trainer.run_attempt import RunAttempt, start
from trainer.signals import StopRequest

# What the child is told (trainer.fit reads the same names).
ENV_RUN_URI = "TRAINSTACK_RUN_URI"
ENV_CHECKPOINT_DIR = "TRAINSTACK_CHECKPOINT_DIR"
ENV_TENSORBOARD_DIR = "TRAINSTACK_TENSORBOARD_DIR"
ENV_MODEL_DIR = "TRAINSTACK_MODEL_DIR"
ENV_MESSAGES_FILE = "TRAINSTACK_MESSAGES_FILE"
ENV_ATTEMPT = "TRAINSTACK_ATTEMPT"

POLL_S = 0.5
TENSORBOARD_EVERY_S = 30.0
# The trainer package's parent folder: put on the child's PYTHONPATH so `from trainer import fit` works.
TRAINER_ROOT = str(Path(__file__).resolve().parents[1])


class ScriptRun(RunAttempt):
    """One attempt of a script-mode run: the child process, and the shared lifecycle (`RunAttempt`) around it."""

    WORK_PREFIX = "trainstack-script-"
    AGAIN_HINT = " (start a new run id to train again)"

    def __init__(self, cfg: TrainConfig, *, stream=None, stop: StopRequest | None = None) -> None:
        super().__init__(cfg, stream=stream, stop=stop)
        self.dirs = {name: os.path.join(self.work, name) for name in ("checkpoints", "tensorboard", "model")}
        self.messages = os.path.join(self.work, "messages.jsonl")
        self.child: subprocess.Popen | None = None
        self.lost_lease: str | None = None  # why the lease was lost, once it is
        self.step = 0
        self.total: int | None = None
        self.committed: int | None = None
        self.metrics: dict = {}
        self.examples_seen: int | None = None
        self._offset = 0

    # -- what the child says --

    def _lease_lost(self, reason: str) -> None:
        # Another machine took the run: the child must not commit again.
        self.lost_lease = reason or "the lease was lost"
        self._kill_child()

    def _kill_child(self) -> None:
        if self.child is not None and self.child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.child.kill()

    def _read_messages(self) -> None:
        """Turn the child's new message lines into events and progress (a torn last line waits)."""
        try:
            with open(self.messages, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                self._message(msg)

    def _message(self, msg: dict) -> None:
        kind = msg.pop("kind", None)
        if isinstance(msg.get("step"), int):
            self.step = msg["step"]
        if isinstance(msg.get("total"), int):
            self.total = msg["total"]
        if isinstance(msg.get("examples_seen"), int):
            self.examples_seen = msg["examples_seen"]
        if isinstance(msg.get("metrics"), dict):
            self.metrics = msg["metrics"]
        if kind == "progress":
            self.events.progress(self.step, self.total or 0, self.metrics.get("loss"), msg.get("examples_per_sec"),
                                 metrics=self.metrics, epoch=msg.get("epoch"))
        elif kind == "epoch":
            self.emit("epoch", step=self.step, epoch=msg.get("epoch"), metrics=self.metrics)
            self.events.progress(self.step, self.total or 0, self.metrics.get("loss"), msg.get("examples_per_sec"),
                                 metrics=self.metrics, epoch=msg.get("epoch"))
        elif kind == layout.CHECKPOINT:
            self.committed = msg.get("step")
            self.emit(layout.CHECKPOINT, step=msg.get("step"), seconds=msg.get("seconds"), bytes=msg.get("bytes"))
        elif kind == layout.RESUMED:
            self.emit(layout.RESUMED, step=msg.get("step"), examples_seen=msg.get("examples_seen"),
                      batches_seen=msg.get("step"), epoch=msg.get("epoch"), batch=msg.get("batch"))
        elif kind == "event" and isinstance(msg.get("event"), str):
            name = msg.pop("event")
            self.emit(name, **msg)

    # -- the attempt --

    def _step_now(self) -> int:
        return self.step

    def _cleanup(self) -> None:
        self._kill_child()

    def child_env(self) -> dict:
        """The child's environment: the run's folders and the trainer on PYTHONPATH."""
        env = {k: v for k, v in os.environ.items() if k != "TRAINSTACK_COMMAND"}
        path = [TRAINER_ROOT, self.cfg.code_dir or ""]
        if env.get("PYTHONPATH"):
            path.append(env["PYTHONPATH"])
        env.update({
            "PYTHONPATH": os.pathsep.join(p for p in path if p),
            ENV_RUN_URI: self.cfg.run_uri,
            ENV_CHECKPOINT_DIR: self.dirs["checkpoints"],
            ENV_TENSORBOARD_DIR: self.dirs["tensorboard"],
            ENV_MODEL_DIR: self.dirs["model"],
            ENV_MESSAGES_FILE: self.messages,
            ENV_ATTEMPT: str(self.events.attempt),
            "TRAINSTACK_KEEP_CHECKPOINTS": str(self.cfg.keep_checkpoints),
            "TRAINSTACK_SEED": str(self.cfg.seed),
        })
        if self.cfg.checkpoint_every_seconds:
            env["TRAINSTACK_CHECKPOINT_EVERY_SECONDS"] = f"{self.cfg.checkpoint_every_seconds:g}"
        return env

    def _train(self) -> int:
        cfg = self.cfg
        for d in self.dirs.values():
            os.makedirs(d, exist_ok=True)
        # `steps` is the trainer loop's; the command decides its own (progress.json carries its total).
        self.emit(layout.STARTED, config={**as_dict(cfg), "steps": None}, workers=1, worker=0, replicas=None, global_batch=None,
                  precision=None, mode="script", command=list(cfg.command))
        self.events.flush()
        self.stop_key.start()
        self.child = subprocess.Popen(child_command(cfg.command), cwd=cfg.code_dir, env=self.child_env(),
                                      preexec_fn=_die_with_parent)
        signalled_at: float | None = None
        cancelled = False
        last_tb = time.monotonic()
        while True:
            rc = self.child.poll()
            self._read_messages()
            if rc is not None:
                break
            now = time.monotonic()
            if signalled_at is None and (self.stop.requested or self.stop_key.requested):
                cancelled = self.stop_key.requested and not self.stop.requested
                with contextlib.suppress(ProcessLookupError):
                    self.child.send_signal(signal.SIGTERM)
                signalled_at = now
            elif signalled_at is not None and now - signalled_at > cfg.stop_grace_s:
                with contextlib.suppress(ProcessLookupError):
                    self.child.kill()
            if now - last_tb >= TENSORBOARD_EVERY_S:
                self.events.background(self._sync_tensorboard)
                last_tb = now
            time.sleep(POLL_S)
        self._read_messages()
        self._sync_tensorboard()
        if self.lost_lease:
            raise LeaseLost(f"{self.lost_lease}; the command was killed")
        stopped = signalled_at is not None and rc in (exits.PREEMPTED, -signal.SIGTERM, -signal.SIGKILL)
        if stopped and cancelled:
            return self._cancel()
        if stopped:
            self.events.flush()
            self.emit(layout.PREEMPTED, step=self._committed_step(),
                      signal=self.stop.signal_name or "STOP", seconds=round(time.monotonic() - signalled_at, 3),
                      examples_seen=self.examples_seen, exit_code=rc)
            return exits.PREEMPTED
        if rc == 0:
            return self._finish()
        reason = f"the command {list(cfg.command)!r} exited with {rc}" + (
            " (killed by a signal)" if rc < 0 else "")
        self.emit(layout.FAILED_EVENT, reason=reason, step=self.step, exit_code=rc)
        return exits.UNUSABLE if rc == exits.UNUSABLE else exits.FAILED

    def _committed_step(self) -> int:
        """Where the run stands: this attempt's last commit, else the newest in the bucket (a
        command stopped before its first commit, e.g. during its start-up)."""
        if self.committed is not None:
            return self.committed
        from trainer.checkpoint_store import CheckpointStore

        steps = CheckpointStore(self.store).committed_steps()
        return steps[-1] if steps else 0

    def _sync_tensorboard(self) -> None:
        self.store.upload_dir(self.dirs["tensorboard"], layout.TENSORBOARD_PREFIX, changed_only=True)

    def _cancel(self) -> int:
        self.events.flush()
        reason = self.stop_key.reason or "stop requested (STOP in the run folder)"
        step = self._committed_step()
        self.emit(layout.CANCELLED_EVENT, step=step, reason=reason,
                  examples_seen=self.examples_seen)
        self.events.flush()
        self.lease.fence()
        self._write_cancelled(step, reason, self.examples_seen)
        return exits.OK

    def _finish(self) -> int:
        """The command exited 0: its model folder becomes `model/`, then COMPLETE."""
        from trainer import export as export_mod

        model_dir = self.dirs["model"]
        files = sum(len(names) for _, _, names in os.walk(model_dir))
        signature = None
        if files:
            self.store.delete_prefix(layout.MODEL_PREFIX)
            self.store.upload_dir(model_dir, layout.MODEL_PREFIX, changed_only=False)
            if os.path.isfile(os.path.join(model_dir, "saved_model.pb")):
                try:
                    signature = export_mod.saved_model_signature(model_dir)
                except Exception as e:  # noqa: BLE001 - a SavedModel without the serving signature is still the model
                    self.events.emit("note", local_only=True, message=f"model/ has no {export_mod.SIGNATURE}: {e}")
        metrics = dict(self.metrics)
        self.emit(layout.FINISHED, step=self.step, metrics=metrics, examples_seen=self.examples_seen,
                  model_files=files)
        self.events.flush()
        self.lease.fence()
        self._write_complete(step=self.step, metrics=metrics, examples_seen=self.examples_seen, signature=signature)
        return exits.OK


def _die_with_parent() -> None:
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


def run_script(cfg: TrainConfig, *, stream=None, stop: StopRequest | None = None) -> int:
    """Run one script-mode attempt of the run `cfg` describes; returns the exit code."""
    run = start(ScriptRun, cfg, stream=stream, stop=stop)
    return exits.FAILED if run is None else run.run()
