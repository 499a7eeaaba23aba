"""Reading a run's checkpoints without the trainer (`runfolder.checkpoints`): which steps are committed, which markers hold."""

from __future__ import annotations

import subprocess
import sys

from runfolder import checkpoints, layout
from runfolder.storage import open_store

GOOD = {"step": 20, "files": {"ckpt.index": {"size": 3, "sha256": "a" * 64}}}


def test_only_steps_with_a_marker_count_in_order(tmp_path):
    store = open_store(f"file://{tmp_path}/run")
    store.put_bytes(f"{layout.checkpoint_dir(30)}/ckpt.index", b"abc")  # files, no marker yet: not committed
    for step in (100, 20):
        store.put_bytes(f"{layout.checkpoint_dir(step)}/ckpt.index", b"abc")
        store.put_bytes(layout.committed_key(step), b"{}")
    store.put_bytes(f"{layout.CHECKPOINTS_PREFIX}notes.txt", b"not a checkpoint")
    assert checkpoints.committed_steps(store) == [20, 100]  # numeric order, not the keys' (100 < 20 as text)
    assert checkpoints.scan(store) == ({20, 30, 100}, {20, 100})


def test_a_marker_that_names_another_step_or_lacks_checksums_is_refused():
    assert checkpoints.marker_problem(20, GOOD) is None
    assert checkpoints.marker_problem(21, GOOD) == "marker names step 20"
    assert checkpoints.marker_problem(20, {**GOOD, "files": {"ckpt.index": {"size": 3}}}) == \
        "marker entry for ckpt.index lacks size or sha256"
    assert checkpoints.marker_problem(20, {**GOOD, "files": {"../x": GOOD["files"]["ckpt.index"]}}) == \
        "marker lists an unsafe path '../x'"


def test_reading_a_run_imports_no_trainer():
    code = ("import sys, runfolder.checkpoints, runfolder.events, runfolder.cost, runfolder.lease, runfolder.exits; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('trainer', 'tensorflow', 'controller')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]"
