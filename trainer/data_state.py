"""A user `make_dataset`'s position in the stream, kept in each checkpoint as tf.data's own iterator state.

Without it, a resume rebuilds the stream and skips the batches already consumed
(`Dataset.skip`), which reads every one of them again: the cost grows with the run. With it,
the iterator's state (the position of every stage, shuffle and prefetch buffers included) is
written with `tf.train.Checkpoint(iterator=...)` beside the variables, as the files
`data.index` and `data.data-*` of the same checkpoint folder, so it is committed (or ignored)
with the rest of the checkpoint; a resume restores it and reads nothing again.

`state.json` says which of the two a checkpoint allows, under `data_state`:
  * `{"skip": K, "bytes": N}`: the iterator's state is saved; the pipeline it belongs to was
    built with `skip(K)` (the skip of an earlier resume that could not restore a state), and
    is rebuilt the same way before the state is restored into it;
  * `{"reason": "..."}`: no state was saved (why), a resume skips;
  * absent (checkpoints written before this existed): a resume skips.

Not every pipeline can be saved, and not every save is worth it:
  * TF cannot save a pipeline holding Python state (`from_generator`, `py_function`,
    `numpy_function`): the first save fails, and the run goes on without it;
  * a state larger than `--data-state-max-mb` (a large shuffle buffer: 10,000 MNIST images
    are ~10 MiB, written in ~0.3 s; 100,000 are ~96 MiB, ~2 s to write, ~4 s to restore; see
    bench/RESULTS.md) would cost more on every checkpoint and in the spot notice than it saves;
  * the input is fed through `tf.distribute`'s distributed iterator (several replicas, or a
    GPU), which TF 2.21 cannot checkpoint (`DistributedIterator` is not trackable).
Each of these is said once in a `data_state_unsaved` event, and a resume that skips says
how many batches it skipped and how long that took in a `data_skipped` event.
"""

from __future__ import annotations

import glob
import os
import re

import tensorflow as tf

from runfolder import layout

__all__ = ["DATA_PREFIX", "DataState", "restore_iterator", "saved_state_prefix", "state_bytes"]

# The iterator state's file prefix inside a checkpoint folder (TF adds .index and .data-*).
DATA_PREFIX = "data"

DISTRIBUTED = ("the input is fed through tf.distribute's distributed iterator (several replicas or a GPU), "
               "which TensorFlow cannot checkpoint")


def state_bytes(folder: str) -> int:
    """Bytes of the iterator state files in a checkpoint folder."""
    return sum(os.path.getsize(f) for f in glob.glob(os.path.join(folder, DATA_PREFIX + ".*")))


def _tf_words(message: str) -> str:
    """TensorFlow's own words in an error, without its node and op decorations."""
    message = re.sub(r"\{\{.*?\}\}", "", message)
    message = re.sub(r"\[Op:.*$", "", message, flags=re.S)
    return " ".join(message.split())[:200]


def _drop(folder: str) -> None:
    for f in glob.glob(os.path.join(folder, DATA_PREFIX + ".*")):
        os.remove(f)


def saved_state_prefix(folder: str, saved: dict) -> tuple[str, int] | None:
    """The restored checkpoint's iterator state as (file prefix, the pipeline's skip), or None when it has none."""
    entry = saved.get("data_state")
    if not isinstance(entry, dict) or not isinstance(entry.get("skip"), int) or not state_bytes(folder):
        return None
    return os.path.join(folder, DATA_PREFIX), int(entry["skip"])


def restore_iterator(iterator, prefix: str) -> None:
    """Read a saved iterator state into `iterator` (a fresh iterator of the same pipeline)."""
    tf.train.Checkpoint(iterator=iterator).read(prefix).assert_consumed()


class _Captured(tf.__internal__.tracking.Trackable):
    """A serialized iterator state, saved under the key the iterator's own checkpoint gives it."""

    def __init__(self, state) -> None:
        self._state = state

    def _serialize_to_tensors(self):
        return {"ITERATOR_STATE": self._state}

    def checkpoint(self) -> tf.train.Checkpoint:
        """The checkpoint `tf.train.Checkpoint(iterator=...)` would write of the iterator, from the captured state."""
        return tf.train.Checkpoint(iterator=self)


class DataState:
    """Saves the input iterator's state into each checkpoint folder while it can and is small enough.

    `iterator` is the plain `tf.data` iterator the loop feeds from (None when it cannot be
    saved, with `reason`); `skip` is the `Dataset.skip` its pipeline was built with;
    `max_mb` is the bound in MiB (--data-state-max-mb; 0: never save). `emit(kind, **fields)` reports the first time a
    state is not saved, and why.
    """

    def __init__(self, iterator, *, skip: int, max_mb: float, emit, reason: str | None = None) -> None:
        self.skip = int(skip)
        self.max_mb = max_mb
        self.emit = emit
        self.iterator = iterator if reason is None and max_mb > 0 else None
        if reason is None and max_mb <= 0:
            reason = "--data-state-max-mb is 0"
        self.reason = reason
        self._said = False

    def save(self, folder: str, step: int) -> dict:
        """Write the state into `folder` (beside the variables); returns what `state.json` records under `data_state`."""
        iterator = self.iterator
        return self._write(folder, step, None if iterator is None else lambda: tf.train.Checkpoint(iterator=iterator))

    def capture(self):
        """The iterator's state at this step, serialized (None when it is not saved): what `write` writes.

        The serialization is the part that must happen at the step, in the loop; the tensor it
        returns stays as it is while the iterator moves on, so the file can be written later (on
        the background write's thread) without holding the loop.
        """
        if self.iterator is None:
            return None
        try:
            return self.iterator._serialize_to_tensors()["_STATE"]
        except (tf.errors.OpError, ValueError, TypeError) as e:
            self._cannot_save(e)
            return None

    def write(self, folder: str, captured, step: int) -> dict:
        """Write a `capture`d state into `folder`; returns what `state.json` records under `data_state`."""
        return self._write(folder, step, None if captured is None else lambda: _Captured(captured).checkpoint())

    def _write(self, folder: str, step: int, checkpoint) -> dict:
        if checkpoint is not None:
            try:
                checkpoint().write(os.path.join(folder, DATA_PREFIX))
            except (tf.errors.OpError, ValueError, TypeError) as e:
                _drop(folder)
                self._cannot_save(e)
            else:
                size = state_bytes(folder)
                if size <= self.max_mb * 2**20:
                    return {"skip": self.skip, "bytes": size}
                _drop(folder)
                self._give_up(f"the input pipeline's state is {size / 2**20:.3g} MiB, over "
                              f"--data-state-max-mb {self.max_mb:g} (a large shuffle buffer?)")
        self._say(step)
        return {"reason": self.reason}

    def _cannot_save(self, e: BaseException) -> None:
        detail = _tf_words(getattr(e, "message", str(e)))
        self._give_up(f"TensorFlow cannot save this input pipeline ({detail}); a pipeline built "
                      "from Python (from_generator, py_function, numpy_function) has state only Python holds")

    def _give_up(self, reason: str) -> None:
        self.iterator, self.reason = None, reason

    def _say(self, step: int) -> None:
        if not self._said:
            self._said = True
            self.emit(layout.DATA_STATE_UNSAVED, step=step,
                      reason=f"{self.reason}: a resume will skip the batches already consumed")
