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
        if enabled:
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(local_dir)

    @property
    def enabled(self) -> bool:
        """Whether this writer writes anything (only the chief's does)."""
        return self._writer is not None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Write each `name: value` at `step`."""
        if self._writer is None:
            return
        import tensorflow as tf

        with self._writer.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(name, value)

    def sync(self) -> None:
        """Flush the event files and upload what changed (safe to call from a writer thread)."""
        if self._writer is None:
            return
        self._writer.flush()
        self.store.upload_dir(self.local_dir, layout.TENSORBOARD_PREFIX, changed_only=True)


def local_dir(work: str) -> str:
    """Where a run's event files are written before upload."""
    return os.path.join(work, layout.TENSORBOARD_PREFIX.rstrip("/"))
