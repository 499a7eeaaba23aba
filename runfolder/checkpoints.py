"""The run's committed checkpoints as a reader sees them: which steps are committed, and whether a marker holds.

A checkpoint is visible only once ``checkpoints/ckpt-<step>/COMMITTED`` exists (written last by
the trainer, ``trainer.checkpoint_store``); its JSON lists every file with its size and SHA-256.
``ops status`` and ``ops pull`` read these without TensorFlow or the trainer; the trainer's
restore uses the same checks.
"""

from __future__ import annotations

import re

from runfolder import layout
from runfolder.storage import Store, check_key

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def scan(store: Store) -> tuple[set[int], set[int]]:
    """(steps with any object, steps with a marker) under the run's checkpoints, in one listing."""
    present: set[int] = set()
    committed: set[int] = set()
    for key in store.list(layout.CHECKPOINTS_PREFIX):
        found = layout.checkpoint_key_step(key)
        if found is None:
            continue
        step, rest = found
        present.add(step)
        if rest == layout.COMMITTED:
            committed.add(step)
    return present, committed


def committed_steps(store: Store) -> list[int]:
    """Steps of the run in ``store`` that have a ``COMMITTED`` marker, ascending."""
    return sorted(scan(store)[1])


def marker_problem(step: int, marker: dict) -> str | None:
    """Why a marker cannot be trusted, or None if it is well-formed."""
    if marker.get("step") != step:
        return f"marker names step {marker.get('step')!r}"
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return "marker lists no files"
    for rel, meta in files.items():
        try:
            check_key(rel)
        except ValueError:
            return f"marker lists an unsafe path {rel!r}"
        if (
            not isinstance(meta, dict)
            or not isinstance(meta.get("size"), int)
            or not _SHA256_RE.match(str(meta.get("sha256", "")))
        ):
            return f"marker entry for {rel} lacks size or sha256"
    return None
