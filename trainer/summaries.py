"""TensorBoard scalars of a run: written locally by the chief, mirrored to `<run-uri>/tensorboard/`.

A small writer, as TF Model Garden keeps one beside its loop: the loop hands it values,
it owns the event files and their upload. On workers other than the chief it does nothing.
"""

from __future__ import annotations

import os

from runfolder import layout


class Summaries:
    """Scalars to TensorBoard event files under `local_dir`, uploaded to the run's `tensorboard/`."""

    def __init__(self, local_dir: str, store, *, enabled: bool = True) -> None:
        self.local_dir = local_dir
        self.store = store
        self._writer = None
        self._writes: dict[tuple[str, ...], object] = {}  # one traced writer per set of names
        if enabled:
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(local_dir)

    @property
    def enabled(self) -> bool:
        """Whether this writer writes anything (only the chief's does)."""
        return self._writer is not None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Write each `name: value` at `step`."""
        self.series([(step, values)])

    def series(self, points: list[tuple[int, dict[str, float]]]) -> None:
        """Write several points, each `(step, {name: value})`, in one graph call per set of names.

        Not one eager summary op per value: the loop writes a point per --log-every step, a
        call of the step spans many of them, and five eager ops per point cost the seed's model
        about 5 % of its steps (bench/RESULTS.md). The event files hold the same float32 scalars.
        A single point of a set of names not traced yet (an evaluation's, a checkpoint's time) is
        written by eager ops: a trace of its writer costs more CPU than a run writes such points.
        """
        if self._writer is None or not points:
            return
        import tensorflow as tf

        groups: dict[tuple[str, ...], list] = {}
        for step, values in points:
            groups.setdefault(tuple(values), []).append((step, values))
        with self._writer.as_default():
            for names, group in groups.items():
                write = self._writes.get(names)
                if write is None and len(group) == 1:
                    step, values = group[0]
                    for n in names:
                        tf.summary.scalar(n, float(values[n]), step=step)
                    continue
                if write is None:
                    write = self._writes[names] = _scalar_writer(names)
                write(tf.constant([step for step, _ in group], tf.int64),
                      tf.constant([[float(values[n]) for n in names] for _, values in group], tf.float32))

    def sync(self) -> None:
        """Flush the event files and upload what changed (safe to call from a writer thread)."""
        if self._writer is None:
            return
        self._writer.flush()
        self.store.upload_dir(self.local_dir, layout.TENSORBOARD_PREFIX, changed_only=True)


def _scalar_writer(names: tuple[str, ...]):
    """A `tf.function(steps, values)` writing `values[j, i]` as the scalar `names[i]` at `steps[j]`."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, len(names)], tf.float32)])
    def write(steps, values):
        for j in tf.range(tf.shape(steps)[0]):
            # At the root name scope: the loop's own ("while/") would prefix every tag.
            with tf.compat.v1.name_scope(None):
                for i, name in enumerate(names):
                    tf.summary.scalar(name, values[j, i], step=steps[j])

    return write


def local_dir(work: str) -> str:
    """Where a run's event files are written before upload."""
    return os.path.join(work, layout.TENSORBOARD_PREFIX.rstrip("/"))
