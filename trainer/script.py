"""Script mode: run the user's own command (`python -m trainer ... -- python train.py`) with the run's guarantees.

The command (a Keras `fit` script, typically) runs as a child process in a writable working
folder that starts as a copy of `--code-dir` (`run.code`), made afresh for each attempt in the
work folder (on a machine the data disk, `/data/work`; never the code folder itself), so a
script that writes beside itself (`./logs`, `history.csv`) works alike on a laptop and on a
machine. This process, the parent, never imports TensorFlow and keeps what the run folder
promises:

- the run's lease (one writer per run; on a lost lease the child is killed at once, before it
  can commit again);
- the events (`started`, `resumed`, `checkpoint`, `preempted`, `finished`, `failed`,
  `cancelled`) in `events.jsonl`, and `progress.json` with the script's metrics, from the
  messages `trainer.fit`'s callback writes to a local file (`TRAINSTACK_MESSAGES_FILE`): the
  parent stays the one writer of both objects;
- `outputs/`: the child's output folder (`TRAINSTACK_OUTPUT_DIR`, `fit.output_dir()`) is
  uploaded at each committed checkpoint and at the end, whatever the ending; a later attempt
  starts with what was kept there;
- the working folder is scratch: what the command wrote there (new or changed files) is named in
  one line on stderr at the end of each attempt, pointing to `fit.output_dir()`;
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

Its rooms: `trainer.script_folders` (the local folders, what is kept of them and what is
left behind), `trainer.script_messages` (the command's messages, as events and progress),
`trainer.script_child` (the child process and what it is told); this module supervises the
child and turns its exit into the run's ending.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from runfolder import exits, layout
from runfolder.lease import LeaseLost
from trainer.config import TrainConfig, as_dict
from trainer.run_attempt import RunAttempt, start
from trainer.script_child import TRAINER_ROOT, child_command, child_env, cluster_role, start_child
from trainer.script_folders import ScriptFolders
from trainer.script_messages import CommandReport
from trainer.signals import StopRequest

# What `trainer.script` has always given (the child's helpers live in trainer.script_child).
__all__ = ["POLL_S", "TENSORBOARD_EVERY_S", "TRAINER_ROOT", "ScriptRun", "child_command", "cluster_role",
           "run_script"]

POLL_S = 0.5
TENSORBOARD_EVERY_S = 30.0


@dataclass
class ChildExit:
    """How the command ended: its exit code, when the stop was forwarded to it, and whether that
    stop was the run folder's STOP (a cancel) rather than a signal."""

    rc: int
    signalled_at: float | None = None
    cancelled: bool = False


class ScriptRun(RunAttempt):
    """One attempt of a script-mode run: the child process, and the shared lifecycle (`RunAttempt`) around it."""

    WORK_PREFIX = "trainstack-script-"
    AGAIN_HINT = " (start a new run id to train again)"

    def __init__(self, cfg: TrainConfig, *, stream=None, stop: StopRequest | None = None) -> None:
        self.workers, chief = cluster_role()
        # Several workers: the chief's parent alone takes the lease and writes the run's objects;
        # the others run their command and print their events.
        super().__init__(cfg, stream=stream, stop=stop, chief=chief)
        self.folders = ScriptFolders(self.work, cfg.code_dir, self.store)
        # A preempted run keeps the outputs of its last commit.
        self.report = CommandReport(self.folders.messages, events=self.events, emit=self.emit,
                                    on_commit=self._commit_kept if chief else None)
        self.child: subprocess.Popen | None = None
        self.lost_lease: str | None = None  # why the lease was lost, once it is

    def _commit_kept(self) -> None:
        self.events.background(self.folders.sync_outputs)

    def _lease_lost(self, reason: str) -> None:
        # Another machine took the run: the child must not commit again.
        self.lost_lease = reason or "the lease was lost"
        self._kill_child()

    def _kill_child(self) -> None:
        if self.child is not None and self.child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.child.kill()

    # -- the attempt --

    def _step_now(self) -> int:
        return self.report.step

    def _cleanup(self) -> None:
        self._kill_child()

    def child_env(self) -> dict:
        """The child's environment (trainer.script_child.child_env)."""
        return child_env(self.cfg, self.folders, attempt=self.events.attempt, workers=self.workers)

    def _train(self) -> int:
        try:
            return self._run_command()
        finally:
            line = self.folders.left_behind_line()
            if line:
                print(f"trainstack: {line}", file=sys.stderr, flush=True)

    def _run_command(self) -> int:
        cfg = self.cfg
        self.folders.prepare()
        # `steps` is the trainer loop's; the command decides its own (progress.json carries its total).
        self.emit(layout.STARTED, config={**as_dict(cfg), "steps": None, "model": None}, workers=1, worker=0,
                  replicas=None, global_batch=None, precision=None, mode="script", command=list(cfg.command))
        self.events.flush()
        self.stop_key.start()
        self.child, relay = start_child(cfg, self.folders, self.child_env())
        ended = self._supervise()
        if relay is not None:
            relay.join(timeout=5)
        if self.chief:
            self.folders.sync_tensorboard()
        if self.lost_lease:
            raise LeaseLost(f"{self.lost_lease}; the command was killed")
        if self.chief:
            self.folders.sync_outputs()
        if ended.signalled_at is None and (self.stop.requested or self.stop_key.requested):
            # The stop came while the child was already ending (a terminal's Ctrl-C reaches the
            # whole process group: the child may exit 143 before this loop forwards anything).
            ended.cancelled = self.stop_key.requested and not self.stop.requested
            ended.signalled_at = time.monotonic()
        return self._ending(ended)

    def _supervise(self) -> ChildExit:
        """Until the command exits: its messages read, a stop forwarded (then a kill after the
        grace), TensorBoard uploaded every `TENSORBOARD_EVERY_S`."""
        signalled_at: float | None = None
        cancelled = False
        last_tb = time.monotonic()
        while True:
            rc = self.child.poll()
            self.report.read()
            if rc is not None:
                break
            now = time.monotonic()
            if signalled_at is None and (self.stop.requested or self.stop_key.requested):
                cancelled = self.stop_key.requested and not self.stop.requested
                with contextlib.suppress(ProcessLookupError):
                    self.child.send_signal(signal.SIGTERM)
                signalled_at = now
            elif signalled_at is not None and now - signalled_at > self.cfg.stop_grace_s:
                with contextlib.suppress(ProcessLookupError):
                    self.child.kill()
            if now - last_tb >= TENSORBOARD_EVERY_S:
                self.events.background(self.folders.sync_tensorboard)
                last_tb = now
            time.sleep(POLL_S)
        self.report.read()
        return ChildExit(rc, signalled_at, cancelled)

    # -- endings --

    def _ending(self, ended: ChildExit) -> int:
        """The run's ending from how the command ended."""
        cfg, rc, report = self.cfg, ended.rc, self.report
        stopped = (rc == exits.PREEMPTED or (ended.signalled_at is not None and rc in (
            -signal.SIGTERM, -signal.SIGINT, -signal.SIGKILL)))
        if stopped and ended.cancelled:
            return self._cancel()
        if stopped:
            self.events.flush()
            self.emit(layout.PREEMPTED, step=self._committed_step(),
                      signal=self.stop.signal_name or "STOP",
                      seconds=round(time.monotonic() - ended.signalled_at, 3) if ended.signalled_at is not None
                      else None, examples_seen=report.examples_seen, exit_code=rc)
            return exits.PREEMPTED
        if rc in (exits.PEER_LOST, exits.NO_CLUSTER):
            # trainer.fit's ending when a worker of the cluster was lost: not this machine's failure.
            self.emit(layout.FAILED_EVENT, reason=f"the command {list(cfg.command)!r} lost its cluster (exit {rc})",
                      step=report.step, exit_code=rc)
            return rc
        if rc == 0 and not self.chief:
            return exits.OK  # the chief uploads the model and writes COMPLETE
        if rc == 0:
            return self._finish()
        reason = f"the command {list(cfg.command)!r} exited with {rc}" + (
            " (killed by a signal)" if rc < 0 else "")
        self.emit(layout.FAILED_EVENT, reason=reason, step=report.step, exit_code=rc)
        return exits.UNUSABLE if rc == exits.UNUSABLE else exits.FAILED

    def _committed_step(self) -> int:
        """Where the run stands: this attempt's last commit, else the newest in the bucket (a
        command stopped before its first commit, e.g. during its start-up)."""
        if self.report.committed is not None:
            return self.report.committed
        from trainer.checkpoint_store import CheckpointStore

        steps = CheckpointStore(self.store).committed_steps()
        return steps[-1] if steps else 0

    def _cancel(self) -> int:
        if not self.chief:
            return exits.OK  # the chief writes CANCELLED
        self.events.flush()
        reason = self.stop_key.reason or "stop requested (STOP in the run folder)"
        step = self._committed_step()
        self.emit(layout.CANCELLED_EVENT, step=step, reason=reason,
                  examples_seen=self.report.examples_seen)
        self.events.flush()
        self.lease.fence()
        self._write_cancelled(step, reason, self.report.examples_seen)
        return exits.OK

    def _finish(self) -> int:
        """The command exited 0: its model folder becomes `model/`, then COMPLETE."""
        from trainer import export as export_mod

        report = self.report
        model_dir = self.folders.dirs["model"]
        files, model_note = self.folders.take_model()
        if model_note:
            print(f"trainstack: {model_note}", file=sys.stderr, flush=True)
        signature = None
        if files:
            self.store.delete_prefix(layout.MODEL_PREFIX)
            self.store.upload_dir(model_dir, layout.MODEL_PREFIX, changed_only=False)
            if os.path.isfile(os.path.join(model_dir, "saved_model.pb")):
                try:
                    signature = export_mod.saved_model_signature(model_dir)
                except Exception as e:  # noqa: BLE001 - a SavedModel without the serving signature is still the model
                    self.events.emit("note", local_only=True, message=f"model/ has no {export_mod.SIGNATURE}: {e}")
        metrics = dict(report.metrics)
        self.emit(layout.FINISHED, step=report.step, metrics=metrics, examples_seen=report.examples_seen,
                  model_files=files, **({"model_note": model_note} if model_note else {}))
        self.events.flush()
        self.lease.fence()
        self._write_complete(step=report.step, metrics=metrics, examples_seen=report.examples_seen,
                             signature=signature, model_files=files, model_note=model_note)
        return exits.OK


def run_script(cfg: TrainConfig, *, stream=None, stop: StopRequest | None = None) -> int:
    """Run one script-mode attempt of the run `cfg` describes; returns the exit code."""
    run = start(ScriptRun, cfg, stream=stream, stop=stop)
    return exits.FAILED if run is None else run.run()
