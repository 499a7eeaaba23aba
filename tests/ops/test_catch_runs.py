"""`ops runs` dates each run by its newest object, wherever that object falls in the listing.

A run's files change at different times (checkpoints long ago, progress a minute ago), and a
store lists them by name, not by time. Here every file of a run has a time of its own, and the
newest is neither the first nor the last key of its run, so only the newest of them all gives
the age and the order the operator expects.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ops import runs
from trainer.storage import open_store
from trainer.storage.keys import file_root

FILES = ["checkpoints/ckpt-10/COMMITTED", "events.jsonl", "progress.json", "tensorboard/events.out"]


def _run(bucket: str, run_id: str, ages: dict[str, float], now: float) -> None:
    """A run folder whose files were last written `ages[name]` seconds before `now`."""
    store = open_store(f"{bucket}/runs/{run_id}")
    for name in FILES:
        store.put_bytes(name, b"{}" if name.endswith(".json") else b"")
    root = Path(file_root(f"{bucket}/runs/{run_id}"))
    for name, age in ages.items():
        os.utime(root / name, (now - age, now - age))


@pytest.mark.parametrize("newest_of_recent", FILES[1:3])
def test_a_runs_age_and_order_come_from_its_newest_file(tmp_path, newest_of_recent):
    bucket, now = f"file://{tmp_path}/bucket", time.time()
    # "recent": one file a minute old between files hours old; "steady": every file 20-40 min old.
    recent = {name: 3600.0 * (i + 2) for i, name in enumerate(FILES)}
    recent[newest_of_recent] = 60.0
    _run(bucket, "recent", recent, now)
    _run(bucket, "steady", {name: 1200.0 + 300 * i for i, name in enumerate(FILES)}, now)
    _run(bucket, "old", {name: 86400.0 - 100 * i for i, name in enumerate(FILES)}, now)

    listed = runs.list_runs(bucket, now=now)

    assert [r["id"] for r in listed] == ["recent", "steady", "old"]
    ages = {r["id"]: r["age_seconds"] for r in listed}
    assert ages == pytest.approx({"recent": 60.0, "steady": 1200.0, "old": 86400.0 - 300}, abs=1.0)


def test_a_run_written_in_the_future_by_a_fast_clock_is_age_zero(tmp_path):
    bucket, now = f"file://{tmp_path}/bucket", time.time()
    _run(bucket, "ahead", {name: -30.0 for name in FILES}, now)
    _run(bucket, "behind", {name: 10.0 for name in FILES}, now)
    listed = runs.list_runs(bucket, now=now)
    assert [(r["id"], r["age_seconds"]) for r in listed] == [("ahead", 0.0), ("behind", 10.0)]
