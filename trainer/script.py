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
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from runfolder import environment, exits, layout
from runfolder.lease import LeaseLost
from trainer.config import TrainConfig, as_dict
from trainer.run_attempt import RunAttempt, start
from trainer.signals import StopRequest

POLL_S = 0.5
TENSORBOARD_EVERY_S = 30.0
# The trainer package's parent folder: put on the child's PYTHONPATH so `from trainer import fit` works.
TRAINER_ROOT = str(Path(__file__).resolve().parents[1])


class ScriptRun(RunAttempt):
    """One attempt of a script-mode run: the child process, and the shared lifecycle (`RunAttempt`) around it."""

    WORK_PREFIX = "trainstack-script-"
    AGAIN_HINT = " (start a new run id to train again)"

    def __init__(self, cfg: TrainConfig, *, stream=None, stop: StopRequest | None = None) -> None:
        self.workers, chief = cluster_role()
        # Several workers: the chief's parent alone takes the lease and writes the run's objects;
        # the others run their command and print their events.
        super().__init__(cfg, stream=stream, stop=stop, chief=chief)
        self.dirs = {name: os.path.join(self.work, name) for name in ("checkpoints", "tensorboard", "model", "outputs")}
        # The command's working folder: a copy of the code folder, made in _prepare_folders.
        self.workdir = os.path.join(self.work, "code")
        self.messages = os.path.join(self.work, "messages.jsonl")
        self.child: subprocess.Popen | None = None
        self.lost_lease: str | None = None  # why the lease was lost, once it is
        self.step = 0
        self.total: int | None = None
        self.committed: int | None = None
        self.metrics: dict = {}
        self.examples_seen: int | None = None
        self.epoch: int | None = None
        self.rate: float | None = None
        self._offset = 0
        self.taken_model: str | None = None  # the working folder's model file taken as model/, once it is

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
        if isinstance(msg.get("epoch"), int):
            self.epoch = msg["epoch"]
        if kind in ("progress", "epoch") and "examples_per_sec" in msg:
            self.rate = msg["examples_per_sec"]
        if kind == "progress":
            self._progress()
        elif kind == "epoch":
            self.emit("epoch", step=self.step, epoch=msg.get("epoch"), metrics=self.metrics)
            self._progress()
        elif kind == layout.CHECKPOINT:
            self.committed = msg.get("step")
            self.emit(layout.CHECKPOINT, step=msg.get("step"), seconds=msg.get("seconds"), bytes=msg.get("bytes"))
            # progress.json says the committed step too: a stop's commit is where the run stands.
            self._progress()
            # A preempted run keeps the outputs of its last commit.
            if self.chief:
                self.events.background(self._sync_outputs)
        elif kind == layout.RESUMED:
            self.emit(layout.RESUMED, step=msg.get("step"), examples_seen=msg.get("examples_seen"),
                      batches_seen=msg.get("step"), epoch=msg.get("epoch"), batch=msg.get("batch"))
        elif kind == "event" and isinstance(msg.get("event"), str):
            name = msg.pop("event")
            self.emit(name, **msg)

    def _progress(self) -> None:
        self.events.progress(self.step, self.total or 0, self.metrics.get("loss"), self.rate,
                             metrics=self.metrics, epoch=self.epoch)

    # -- the attempt --

    def _step_now(self) -> int:
        return self.step

    def _cleanup(self) -> None:
        self._kill_child()

    def child_env(self) -> dict:
        """The child's environment: the run's folders and the trainer on PYTHONPATH."""
        env = {k: v for k, v in os.environ.items() if k != environment.COMMAND}
        path = [TRAINER_ROOT, self.workdir]
        if env.get("PYTHONPATH"):
            path.append(env["PYTHONPATH"])
        # What the child is told (trainer.fit reads the same names).
        env.update({
            "PYTHONPATH": os.pathsep.join(p for p in path if p),
            environment.RUN_URI: self.cfg.run_uri,
            environment.CHECKPOINT_DIR: self.dirs["checkpoints"],
            environment.TENSORBOARD_DIR: self.dirs["tensorboard"],
            environment.MODEL_DIR: self.dirs["model"],
            environment.OUTPUT_DIR: self.dirs["outputs"],
            environment.MESSAGES_FILE: self.messages,
            environment.ATTEMPT: str(self.events.attempt),
            environment.KEEP_CHECKPOINTS: str(self.cfg.keep_checkpoints),
            environment.SEED: str(self.cfg.seed),
        })
        # The cadence as this process resolved it (extraArgs over the env file; 0 is off): the
        # variable the child inherits may say otherwise.
        env[environment.CHECKPOINT_EVERY_SECONDS] = f"{self.cfg.checkpoint_every_seconds or 0:g}"
        if not self.cfg.verbose:
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if self.workers > 1:
            # Keras 3's fit fails under MultiWorkerMirroredStrategy: tf.keras is Keras 2 here.
            env.setdefault("TF_USE_LEGACY_KERAS", "1")
        return env

    def _prepare_folders(self) -> None:
        """The run's local folders; no messages file; the working folder, a fresh copy of the code
        folder; the output folder, as the run last kept it (a resumed script finds what it wrote before)."""
        for d in self.dirs.values():
            os.makedirs(d, exist_ok=True)
        # The messages of an earlier attempt (a machine's work folder survives its reboot) were
        # said in that attempt: this one reads only its own command's.
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.messages)
        self._offset = 0
        shutil.rmtree(self.workdir, ignore_errors=True)
        # The work folder may lie inside the code folder (a local --work-dir): never copied into itself.
        work = os.path.realpath(self.work)

        def ignore(folder: str, names: list[str]) -> list[str]:
            return [n for n in names if n == "__pycache__" or os.path.realpath(os.path.join(folder, n)) == work]

        shutil.copytree(self.cfg.code_dir, self.workdir, symlinks=True, ignore=ignore)
        outputs = self.dirs["outputs"]
        shutil.rmtree(outputs, ignore_errors=True)
        os.makedirs(outputs)
        kept = self.store.stat(layout.OUTPUTS_PREFIX)
        if kept:
            from runfolder.storage import download_many

            paths = {k: os.path.join(outputs, k[len(layout.OUTPUTS_PREFIX):]) for k in kept}
            download_many(self.store, paths, skip_existing=False)
            for key, path in paths.items():
                # The stored time: upload_dir then sees the kept copy as current and uploads it
                # again only when the command changes it.
                stamp = kept[key].modified.timestamp()
                os.utime(path, (stamp, stamp))

    def _train(self) -> int:
        try:
            return self._run_command()
        finally:
            line = left_behind_line(left_behind(self.workdir, self.cfg.code_dir, skip=self.taken_model))
            if line:
                print(f"trainstack: {line}", file=sys.stderr, flush=True)

    def _run_command(self) -> int:
        cfg = self.cfg
        self._prepare_folders()
        # `steps` is the trainer loop's; the command decides its own (progress.json carries its total).
        self.emit(layout.STARTED, config={**as_dict(cfg), "steps": None, "model": None}, workers=1, worker=0, replicas=None, global_batch=None,
                  precision=None, mode="script", command=list(cfg.command))
        self.events.flush()
        self.stop_key.start()
        self.child = subprocess.Popen(child_command(cfg.command), cwd=self.workdir, env=self.child_env(),
                                      preexec_fn=_die_with_parent, stderr=None if cfg.verbose else subprocess.PIPE)
        relay = None
        if self.child.stderr is not None:
            relay = threading.Thread(target=_relay_stderr, args=(self.child.stderr,), daemon=True)
            relay.start()
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
        if relay is not None:
            relay.join(timeout=5)
        if self.chief:
            self._sync_tensorboard()
        if self.lost_lease:
            raise LeaseLost(f"{self.lost_lease}; the command was killed")
        if self.chief:
            self._sync_outputs()
        if signalled_at is None and (self.stop.requested or self.stop_key.requested):
            # The stop came while the child was already ending (a terminal's Ctrl-C reaches the
            # whole process group: the child may exit 143 before this loop forwards anything).
            cancelled = self.stop_key.requested and not self.stop.requested
            signalled_at = time.monotonic()
        stopped = (rc == exits.PREEMPTED or (signalled_at is not None and rc in (
            -signal.SIGTERM, -signal.SIGINT, -signal.SIGKILL)))
        if stopped and cancelled:
            return self._cancel()
        if stopped:
            self.events.flush()
            self.emit(layout.PREEMPTED, step=self._committed_step(),
                      signal=self.stop.signal_name or "STOP",
                      seconds=round(time.monotonic() - signalled_at, 3) if signalled_at is not None else None,
                      examples_seen=self.examples_seen, exit_code=rc)
            return exits.PREEMPTED
        if rc in (exits.PEER_LOST, exits.NO_CLUSTER):
            # trainer.fit's ending when a worker of the cluster was lost: not this machine's failure.
            self.emit(layout.FAILED_EVENT, reason=f"the command {list(cfg.command)!r} lost its cluster (exit {rc})",
                      step=self.step, exit_code=rc)
            return rc
        if rc == 0 and not self.chief:
            return exits.OK  # the chief uploads the model and writes COMPLETE
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

    def _sync_outputs(self) -> None:
        if os.path.isdir(self.dirs["outputs"]):
            self.store.upload_dir(self.dirs["outputs"], layout.OUTPUTS_PREFIX, changed_only=True)

    def _sync_tensorboard(self) -> None:
        self.store.upload_dir(self.dirs["tensorboard"], layout.TENSORBOARD_PREFIX, changed_only=True)

    def _cancel(self) -> int:
        if not self.chief:
            return exits.OK  # the chief writes CANCELLED
        self.events.flush()
        reason = self.stop_key.reason or "stop requested (STOP in the run folder)"
        step = self._committed_step()
        self.emit(layout.CANCELLED_EVENT, step=step, reason=reason,
                  examples_seen=self.examples_seen)
        self.events.flush()
        self.lease.fence()
        self._write_cancelled(step, reason, self.examples_seen)
        return exits.OK

    def _models_elsewhere(self) -> list[str]:
        """Models the command saved outside its model folder (a `*.keras`/`*.h5` file, a SavedModel's
        folder): new or changed files in its working folder (as `./path`) and in its output folder
        (as `outputs/path`, kept there)."""
        found = []
        for root, label, compare in ((self.workdir, ".", self.cfg.code_dir), (self.dirs["outputs"], "outputs", None)):
            for folder, dirs, names in os.walk(root):
                dirs.sort()
                for name in sorted(names):
                    if not (name.endswith(MODEL_FILE_SUFFIXES) or name == "saved_model.pb"):
                        continue
                    path = os.path.join(folder, name)
                    rel = os.path.relpath(path, root)
                    if compare is not None and _same_file(path, os.path.join(compare, rel)):
                        continue  # shipped with the code, not saved by this run
                    if name == "saved_model.pb":
                        rel = os.path.dirname(rel)  # the SavedModel's folder ("" for the folder itself)
                    found.append(f"{label}/{rel}")
        return found

    def _take_model(self, model_dir: str) -> tuple[int, str | None]:
        """What `model/` gets, and the note that says what happened when the command left its
        model folder empty: a lone `*.keras` file it saved in its working folder is taken (the
        model of `model.save("x.keras")`); anything else is named, not guessed at."""
        files = sum(len(names) for _, _, names in os.walk(model_dir))
        if files:
            return files, None
        elsewhere = self._models_elsewhere()
        if len(elsewhere) == 1 and elsewhere[0].startswith("./") and elsewhere[0].endswith(".keras"):
            name = os.path.basename(elsewhere[0])
            shutil.copy2(os.path.join(self.workdir, elsewhere[0][2:]), os.path.join(model_dir, name))
            self.taken_model = elsewhere[0][2:]
            return 1, (f"the script saved no model in fit.model_dir(); its one model file, {elsewhere[0]} in its "
                       f"working folder, was taken as model/{name} (keras.models.load_model)")
        note = "the script saved no model in fit.model_dir()"
        if elsewhere:
            note += (f"; it saved {', '.join(elsewhere)} (./ is its working folder, a scratch copy that is not kept; "
                     "outputs/ is kept): save the model with model.export(fit.model_dir()) or "
                     "model.save(os.path.join(fit.model_dir(), 'model.keras'))")
        return 0, note

    def _finish(self) -> int:
        """The command exited 0: its model folder becomes `model/`, then COMPLETE."""
        from trainer import export as export_mod

        model_dir = self.dirs["model"]
        files, model_note = self._take_model(model_dir)
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
        metrics = dict(self.metrics)
        self.emit(layout.FINISHED, step=self.step, metrics=metrics, examples_seen=self.examples_seen,
                  model_files=files, **({"model_note": model_note} if model_note else {}))
        self.events.flush()
        self.lease.fence()
        self._write_complete(step=self.step, metrics=metrics, examples_seen=self.examples_seen, signature=signature,
                             model_files=files, model_note=model_note)
        return exits.OK


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


# Files a Keras script saves a model as (a SavedModel is found by its saved_model.pb).
MODEL_FILE_SUFFIXES = (".keras", ".h5", ".hdf5")


def left_behind(workdir: str, code_dir: str, *, skip: str | None = None) -> list[tuple[str, int]]:
    """What the command wrote in its working folder, which is not kept: (`./name` of each new or
    changed top-level file, or `./folder/`, its count of such files), by name. Python's caches and
    `skip` (the model file taken as `model/`) are not counted."""
    counts: dict[str, int] = {}
    if not os.path.isdir(workdir):
        return []
    for folder, dirs, names in os.walk(workdir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, workdir)
            if rel == skip or _same_file(path, os.path.join(code_dir, rel)):
                continue
            top, sep, _ = rel.partition(os.sep)
            label = f"./{top}/" if sep else f"./{top}"
            counts[label] = counts.get(label, 0) + 1
    return sorted(counts.items())


def left_behind_line(found: list[tuple[str, int]], *, most: int = 5) -> str | None:
    """One line naming what `left_behind` found (the first `most` entries), and where to write instead."""
    if not found:
        return None
    names = [f"{label} ({n} file{'s' if n != 1 else ''})" if label.endswith("/") else label for label, n in found]
    shown = ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
    return (f"not kept, written in the working folder (a scratch copy of the code): {shown}; "
            "write what the run should keep to fit.output_dir() (kept as outputs/)")


def _same_file(path: str, other: str) -> bool:
    """`path` is a copy of `other` as copied (same size and modification time)."""
    try:
        a, b = os.stat(path), os.stat(other)
    except OSError:
        return False
    return a.st_size == b.st_size and int(a.st_mtime) == int(b.st_mtime)


def _relay_stderr(pipe) -> None:
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
