"""The training loop's checkpoints in TensorFlow terms: save, restore, and the resume fingerprint.

:class:`Checkpointer` writes the model's and optimizer's variables (a ``tf.train.Checkpoint``)
and the loop's counters to a local folder per step, and hands the folder to
:class:`~trainer.checkpoint_store.CheckpointStore`, which commits it to the run. On restore it
reads the newest committed folder back into the variables and proves the resume exact:
the same model (``--model`` and variable shapes) and the same values, random streams and
data position as were saved (:func:`resume_fingerprint`), else :class:`ResumeMismatch`.

A background save (:meth:`Checkpointer.save`, one worker) blocks the loop only for a
snapshot: each variable's value is read into a tensor, which costs no copy (TensorFlow's
variables are copy-on-write: the next update of a variable whose value is still held copies
it first, so the snapshot keeps the values of its step while training goes on, and the
copy, one of each updated variable, lands in the next step). The input pipeline's state is
written in the loop too, at the same step. TF's write of the snapshot, the resume
fingerprint and ``state.json`` then happen on a thread, which hands the finished folder to
the upload; the snapshot's memory (at most the variables' size once more, where training
updates them) is freed when the write ends. See bench/RESULTS.md, checkpoint stall.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from runfolder import layout
from trainer.checkpoint_store import CheckpointStore

__all__ = ["Checkpointer", "ResumeMismatch", "STATE_FILE", "resume_fingerprint", "structure", "variables_digest"]

# The loop's counters beside the variables in each checkpoint (see Checkpointer).
STATE_FILE = "state.json"
# The variables' file prefix inside a checkpoint folder (TF adds .index and .data-*).
CKPT_PREFIX = "ckpt"


class ResumeMismatch(RuntimeError):
    """What was restored differs from what the checkpoint recorded: training on would not be an exact resume.

    Also raised when a run folder's checkpoints belong to another model or other shapes: no
    retry can help, so the trainer exits with `exits.UNUSABLE`.
    """


_TRAIN_ELSEWHERE = ("Nothing was changed in the run. Train this model under a new run id (another --run-uri, or "
                    "run.id in the stack), or start this run again with the model and options it was started with.")


# How long a save waits for the previous background write (local disk) before going on without it.
WRITE_WAIT_S = 120.0


def _frozen_checkpoint(checkpoint_of, values):
    """``checkpoint_of`` over the snapshot's tensors: the checkpoint of the variables as they were read.

    Each tensor is saved as a variable saves its value (``VARIABLE_VALUE``), so the files
    have the keys of the variables' own checkpoint and restore into it.
    """
    import tensorflow as tf

    class Frozen(tf.__internal__.tracking.Trackable):
        def __init__(self, value) -> None:
            self._value = value

        def _serialize_to_tensors(self):
            return {"VARIABLE_VALUE": self._value}

    return checkpoint_of([Frozen(v) for v in values])


class _Write:
    """One background write: its thread, its step, and the flag that tells it not to hand its folder on."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.superseded = threading.Event()
        self.thread: threading.Thread | None = None


# Keras keeps each random stream's state (e.g. a Dropout layer's) in a variable of this name.
RNG_STATE_NAME = "seed_generator_state"


def variables_digest(variables) -> str:
    """A digest of the values (with shapes and dtypes) of ``variables``, in order.

    Names are left out: the checkpoint matches variables by position, and Keras numbers
    layer names per process, so the same model may carry other names in another attempt.
    """
    import numpy as np

    h = hashlib.blake2b(digest_size=16)
    for v in variables:
        value = v.numpy()
        h.update(f"{value.dtype}|{value.shape}|".encode())
        # The same bytes as `value.tobytes()` without copying them again (a large model's
        # checkpoint waits for this hash); a uint8 view also serves dtypes such as bfloat16.
        h.update(np.ascontiguousarray(value).reshape(-1).view(np.uint8))
    return h.hexdigest()


def structure(variables) -> list[str]:
    """Each variable's dtype and shape, in order (`float32[784, 128]`): what a checkpoint can be restored into."""
    return [f"{getattr(v.dtype, 'name', v.dtype)}{list(v.shape)}" for v in variables]


def _parameters(shapes: list[str]) -> int:
    total = 0
    for s in shapes:
        dims = [int(d) for d in s[s.index("[") + 1 : -1].split(",") if d.strip()]
        n = 1
        for d in dims:
            n *= d
        total += n
    return total


def resume_fingerprint(state: dict, variables, rng_variables) -> dict:
    """What an exact resume depends on: step, data position, random streams and variable values."""
    return {
        "step": int(state["step"]),
        "batches_seen": int(state["batches_seen"]),
        "examples_seen": int(state["examples_seen"]),
        "rng": variables_digest(rng_variables),
        "variables": variables_digest(variables),
    }


class Checkpointer:
    """The training loop's checkpoints: save its variables and counters, commit them, restore the newest.

    A checkpoint folder holds the variables written by ``ckpt`` (the caller's
    ``tf.train.Checkpoint``) under :data:`CKPT_PREFIX`, and :data:`STATE_FILE`, the
    loop's counters as JSON. Each save goes to its own local folder under ``work``; the
    chief commits it to the run through ``ckstore`` (in the background unless ``sync``),
    other workers save too (the strategy requires every worker to) and drop their copy.

    ``state.json`` also holds a resume fingerprint (:func:`resume_fingerprint` of the
    checkpointed ``variables``, the random streams among them and the counters). After a
    restore the same fingerprint is taken of what was actually restored; any difference
    raises :class:`ResumeMismatch` rather than train on from a state that is not the saved one.

    ``checkpoint_of(values)`` builds a ``tf.train.Checkpoint`` of the same layout as ``ckpt``
    over a list parallel to ``variables`` (``ckpt`` is ``checkpoint_of(variables)`` when not
    given). With it and ``background``, the chief's :meth:`save` of a background checkpoint
    writes from a snapshot on a thread (see the module docstring); without, it writes in the
    caller's thread.
    """

    def __init__(self, ckstore: CheckpointStore, ckpt=None, *, work: str, chief: bool, variables=(),
                 model: str | None = None, checkpoint_of: Callable[[list], object] | None = None,
                 background: bool = False, write_wait_s: float = WRITE_WAIT_S) -> None:
        self.ckstore = ckstore
        self.model = model
        self.variables = list(variables)
        if ckpt is None:
            if checkpoint_of is None:
                raise ValueError("Checkpointer needs ckpt or checkpoint_of")
            ckpt = checkpoint_of(self.variables)
        self.ckpt = ckpt
        self.checkpoint_of = checkpoint_of
        self.background = bool(background and checkpoint_of is not None and chief)
        self.write_wait_s = write_wait_s
        self._write: _Write | None = None  # the background write in progress, if any
        self._write_error: BaseException | None = None
        self._rng_index = [i for i, v in enumerate(self.variables) if RNG_STATE_NAME in getattr(v, "name", "")]
        self.rng_variables = [self.variables[i] for i in self._rng_index]
        self.work = work
        self.chief = chief
        self.last_committed: int | None = None
        self.async_step: int | None = None  # the newest step handed to a background upload
        # The input pipeline's state (a `trainer.data_state.DataState`), saved into each folder once set.
        self.data = None
        self.restored_dir: str | None = None  # the folder the newest restore read, kept for the data state

    def committed(self, step: int) -> None:
        """Record a commit (called from the upload thread too)."""
        self.last_committed = max(self.last_committed or 0, int(step))

    def _new_folder(self, step: int, *, background: bool = False) -> str:
        sub = "checkpoints" if self.chief else "worker-tmp"  # only the chief's copy is kept
        # A background write has its own folder: a stuck one that ends late removes only its own,
        # never the synchronous save of the same step that went on without it.
        suffix = ".background" if background else ""
        folder = os.path.join(self.work, sub, f"{layout.CHECKPOINT_DIR}-{step}{suffix}")
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        return folder

    def save_local(self, step: int, state: dict) -> str:
        """Write the checkpoint of ``step`` (variables and ``state``) to its own folder; returns it."""
        folder = self._new_folder(step)
        if self.data is not None:
            state = {**state, "data_state": self.data.save(folder, step)}
        self._write_folder(folder, step, state, self.ckpt, self.variables)
        return folder

    def _write_folder(self, folder: str, step: int, state: dict, ckpt, values) -> None:
        """TF's write of ``values`` (through ``ckpt``), their fingerprint, then ``state.json``, last."""
        if values:
            # The fingerprint hashes every value while TF writes the same values: both release
            # the GIL, so for a large model the two overlap instead of adding up.
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-fingerprint") as pool:
                fingerprint = pool.submit(resume_fingerprint, {**state, "step": step}, values,
                                          [values[i] for i in self._rng_index])
                ckpt.write(os.path.join(folder, CKPT_PREFIX))
                state = {**state, "structure": structure(self.variables), "fingerprint": fingerprint.result()}
        else:
            ckpt.write(os.path.join(folder, CKPT_PREFIX))
        tmp = os.path.join(folder, STATE_FILE + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(state, fh)
        os.replace(tmp, os.path.join(folder, STATE_FILE))

    def save(self, step: int, state: dict, *, sync: bool) -> bool:
        """Save ``step`` and commit it (in the background unless ``sync``); returns whether this worker commits it.

        In the background (the chief, with ``background``): the loop waits for the snapshot
        and the input pipeline's serialized state only; the writes and the upload follow on threads, one
        write at a time. Synchronous (a stop, the end): a background write of an older step
        still running is waited for (at most ``write_wait_s``) and then not uploaded: this
        step supersedes it.
        """
        if sync or not self.background:
            self._finish_write(superseded_by=step if sync else None)
            self._raise_write_error()
            return self.commit(step, self.save_local(step, state), sync=sync)
        if not self._finish_write():
            return False  # the previous write is stuck: this checkpoint is skipped, wait_uploads reports it
        self._raise_write_error()
        folder = self._new_folder(step, background=True)
        # Reading a variable costs no copy; its next update copies it while the snapshot holds it.
        values = [self._read(v) for v in self.variables]
        # The input pipeline's state is serialized at this step, here; its file is written on the thread.
        data = self.data.capture() if self.data is not None else None
        job = _Write(step)
        job.thread = threading.Thread(target=self._write_then_commit, args=(job, folder, state, values, data),
                                      name="checkpoint-write", daemon=True)
        self._write = job
        self.async_step = step
        job.thread.start()
        return True

    @staticmethod
    def _read(variable):
        import tensorflow as tf

        return tf.convert_to_tensor(variable)

    def _write_then_commit(self, job: _Write, folder: str, state: dict, values: list, data=None) -> None:
        try:
            if self.data is not None:
                state = {**state, "data_state": self.data.write(folder, data, job.step)}
            self._write_folder(folder, job.step, state, _frozen_checkpoint(self.checkpoint_of, values), values)
            if job.superseded.is_set():
                shutil.rmtree(folder, ignore_errors=True)  # a synchronous save of a newer step took over
                return
            self.ckstore.commit_async(job.step, folder)
        except BaseException as e:  # noqa: BLE001 - kept for wait_uploads(): this thread has no caller to raise to
            if self._write_error is None:
                self._write_error = e
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _raise_write_error(self) -> None:
        """A background write that failed fails the next save, as a write in the loop would have failed it."""
        error = self._write_error
        if error is not None and not isinstance(error, TimeoutError):
            self._write_error = None
            raise error

    def _finish_write(self, superseded_by: int | None = None) -> bool:
        """Wait for the background write, at most ``write_wait_s``; False if it is still running.

        ``superseded_by``: the step a synchronous save is about to write; an older write in
        progress then ends without being uploaded.
        """
        job = self._write
        if job is None:
            return True
        if superseded_by is not None and job.step < superseded_by:
            job.superseded.set()
        job.thread.join(self.write_wait_s)
        if job.thread.is_alive():
            if self._write_error is None:
                self._write_error = TimeoutError(f"the background write of checkpoint {job.step} is still running "
                                                 f"after {self.write_wait_s:g} s")
            job.superseded.set()  # whenever it ends, a newer checkpoint is on its way: not uploaded
            self._write = None if superseded_by is not None else job
            return False
        self._write = None
        return True

    def commit(self, step: int, folder: str, *, sync: bool) -> bool:
        """Commit a saved folder (in the background unless ``sync``), then drop it; returns whether it was committed.

        Only the chief commits: another worker's folder is just removed.
        """
        if not self.chief:
            shutil.rmtree(folder, ignore_errors=True)
            return False
        try:
            if sync:
                # An older background upload still running is cancelled by the store so
                # this commit gets the bandwidth; it is waited for by the caller afterwards.
                self.ckstore.commit(step, folder)
            else:
                self.async_step = step
                # The store snapshots the folder (hard links) before returning, so the
                # local copy can go at once and the next save never races the upload.
                self.ckstore.commit_async(step, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return True

    def wait_uploads(self) -> BaseException | None:
        """Wait for the background write and uploads; returns the failure of one (superseded by a newer commit), if any."""
        self._finish_write()
        error, self._write_error = self._write_error, None
        try:
            self.ckstore.wait(None)
        except Exception as e:  # noqa: BLE001 - the caller reports it; a newer commit follows
            return error or e
        return error

    def restore(self) -> tuple[int, dict] | None:
        """Restore the newest committed checkpoint into ``ckpt``; returns (step, saved state) or None."""
        dest = os.path.join(self.work, "restore")
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        step = self.ckstore.restore_latest(dest)
        if step is None:
            return None
        with open(os.path.join(dest, STATE_FILE)) as fh:
            saved = json.load(fh)
        self.check_same_model(step, saved)
        try:
            self.ckpt.read(os.path.join(dest, CKPT_PREFIX)).assert_existing_objects_matched()
        except (ValueError, AssertionError) as e:
            # TensorFlow's own words (e.g. "RestoreV2 ... expected dtype float") are one detail, not the message.
            detail = " ".join(str(e).split())[:300]
            raise ResumeMismatch(f"checkpoint ckpt-{step} cannot be restored into this model ({detail}); "
                                 f"{_TRAIN_ELSEWHERE}") from None
        if saved.get("step") != step:
            raise ValueError(f"checkpoint ckpt-{step} holds state for step {saved.get('step')}")
        self.check_resume(step, saved)
        self.last_committed = step
        self.restored_dir = dest
        return step, saved

    def read_step(self, step: int) -> bool:
        """Read committed checkpoint ``step``'s variables into ``ckpt`` (no resume checks: the export of
        an older checkpoint, e.g. the run's best); False when it cannot be downloaded intact."""
        dest = os.path.join(self.work, f"read-{step}")
        try:
            if not self.ckstore.restore_step(step, dest):
                return False
            self.ckpt.read(os.path.join(dest, CKPT_PREFIX)).assert_existing_objects_matched()
            return True
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    def check_same_model(self, step: int, saved: dict) -> None:
        """Refuse, before anything is restored or written, a checkpoint of another model or shape.

        ``model`` (the --model the checkpoint was saved with) and ``structure`` (its variables'
        dtypes and shapes) are recorded in ``state.json``; older checkpoints carry neither.
        """
        was, now = saved.get("model"), self.model
        if was and now and was != now:
            raise ResumeMismatch(f"this run was trained with --model {was} (checkpoint ckpt-{step}); this attempt "
                                 f"asks for --model {now}. {_TRAIN_ELSEWHERE}")
        recorded = saved.get("structure")
        if not recorded or not self.variables:
            return
        current = structure(self.variables)
        if recorded != current:
            diff = next((i for i, (a, b) in enumerate(zip(recorded, current, strict=False)) if a != b),
                        min(len(recorded), len(current)))
            what = (f"variable {diff}: saved {recorded[diff]}, now {current[diff]}"
                    if diff < min(len(recorded), len(current)) else
                    f"{len(recorded)} variables saved, {len(current)} now")
            raise ResumeMismatch(f"checkpoint ckpt-{step} holds another model's shapes ({_parameters(recorded):,} "
                                 f"parameters saved, {_parameters(current):,} now; first difference: {what}). "
                                 f"{_TRAIN_ELSEWHERE}")

    def check_resume(self, step: int, saved: dict) -> None:
        """Compare the restored state with the fingerprint saved beside it; raise :class:`ResumeMismatch`.

        Checkpoints written before fingerprints existed carry none and are taken as they are.
        """
        recorded = saved.get("fingerprint")
        if not recorded or not self.variables:
            return
        now = resume_fingerprint({**saved, "step": step}, self.variables, self.rng_variables)
        wrong = [f"{k}: saved {recorded.get(k)!r}, restored {now[k]!r}" for k in now if recorded.get(k) != now[k]]
        if wrong:
            raise ResumeMismatch(
                f"checkpoint ckpt-{step} did not restore the state it recorded ({'; '.join(wrong)}); "
                "refusing to train on from a different state. The model or optimizer built by this attempt "
                "does not match the one that saved the checkpoint (changed code or --model options?)"
            )
