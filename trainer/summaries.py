"""TensorBoard scalars of a run: written locally by the chief, mirrored to `<run-uri>/tensorboard/`.

A small writer, as TF Model Garden keeps one beside its loop: the loop hands it values,
it owns the event files and their upload. On workers other than the chief it does nothing.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import numpy as np

from runfolder import layout


class Summaries:
    """Scalars to TensorBoard event files under `local_dir`, uploaded to the run's `tensorboard/`.

    The events are the ones `tf.summary.scalar` writes (one float32 scalar tensor a tag, the
    `scalars` plugin's metadata), built as protos and appended by TensorFlow's record writer
    (`tf.io.TFRecordWriter`: an event file is a TFRecord file of `Event`s). Not through
    `tf.summary`: a summary op is a TensorFlow op, eager or traced, and the loop writes a point
    per --log-every step, tens a call. Eager ops cost the seed's model about 5 % of its steps, and
    a traced writer cost 0.13 s to trace in every run and 2 ms a call after (bench/RESULTS.md);
    a proto and a record cost a few microseconds a value.
    """

    def __init__(self, local_dir: str, store, *, enabled: bool = True) -> None:
        self.local_dir = local_dir
        self.store = store
        self._writer = None
        self._values: dict[str, object] = {}  # a Summary.Value a tag: its metadata, dtype and shape filled in
        self._lock = threading.Lock()  # sync() may flush from another thread while the loop writes
        if enabled:
            self._writer = _event_file(local_dir)

    @property
    def enabled(self) -> bool:
        """Whether this writer writes anything (only the chief's does)."""
        return self._writer is not None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Write each `name: value` at `step`."""
        self.series([(step, values)])

    def series(self, points: list[tuple[int, dict[str, float]]]) -> None:
        """Write several points, each `(step, {name: value})`, an event a value as `tf.summary.scalar` does."""
        if self._writer is None or not points:
            return
        import tensorflow as tf

        records = []
        with np.errstate(over="ignore"):  # past float32's range: infinity, as a cast in the graph gives
            scalars = [[np.asarray(v, "<f4") for v in values.values()] for _, values in points]
        for (_, values), row in zip(points, scalars, strict=True):
            for name, value in zip(values, row, strict=True):
                if value.ndim:
                    raise ValueError(f"TensorBoard scalar {name!r}: got a value of shape {value.shape}, not a number")
        contents = [[value.tobytes() for value in row] for row in scalars]
        for (step, values), content in zip(points, contents, strict=True):
            for name, tensor in zip(values, content, strict=True):
                event = tf.compat.v1.Event(wall_time=time.time(), step=int(step))
                v = event.summary.value.add()
                v.CopyFrom(self._value(name))
                v.tensor.tensor_content = tensor  # float32, little-endian, as the op writes it
                records.append(event.SerializeToString())
        # Flushed to the local file at once (a call's points, about a second apart): a TensorBoard reading the
        # machine's folder sees them, and a run that ends without sync() (a failure's exit) loses none of
        # them there. tf.summary's writer wrote its queue every ten events.
        with self._lock:
            for record in records:
                self._writer.write(record)
            self._writer.flush()

    def _value(self, name: str):
        value = self._values.get(name)
        if value is None:
            import tensorflow as tf

            value = tf.compat.v1.Summary.Value(tag=name)
            value.metadata.plugin_data.plugin_name = "scalars"
            value.tensor.dtype = tf.float32.as_datatype_enum
            value.tensor.tensor_shape.SetInParent()  # a scalar: a shape with no dimensions
            self._values[name] = value
        return value

    def sync(self) -> None:
        """Flush the event files and upload what changed (safe to call from a writer thread)."""
        if self._writer is None:
            return
        with self._lock:
            self._writer.flush()
        self.store.upload_dir(self.local_dir, layout.TENSORBOARD_PREFIX, changed_only=True)


def _event_file(local_dir: str):
    """A new event file in `local_dir`, named as TensorFlow's summary writer names its files, opened with
    its first event (the file's version, which TensorBoard reads first)."""
    import tensorflow as tf

    os.makedirs(local_dir, exist_ok=True)
    # TF's own names end with a per-process counter; a random one here, so that no writer of another kind
    # opened in this process in the same second takes (and truncates) this file's name.
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:12]}.v2"
    writer = tf.io.TFRecordWriter(os.path.join(local_dir, name))
    writer.write(tf.compat.v1.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
    writer.flush()
    return writer



def local_dir(work: str) -> str:
    """Where a run's event files are written before upload."""
    return os.path.join(work, layout.TENSORBOARD_PREFIX.rstrip("/"))
