"""A finished run's outputs: the SavedModel in `<run-uri>/model/` and the `COMPLETE` record.

The SavedModel is made with Keras 3 `model.export` (a `serve` signature that predicts)
and uploaded whole before `COMPLETE` is written, so `COMPLETE` only ever names a run whose
outputs are all there. `COMPLETE` holds the final step, metrics, examples seen, number of
attempts, seconds lost to preemption and total seconds.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime

COMPLETE_KEY = "COMPLETE"
MODEL_PREFIX = "model"


def export_model(model, local_dir: str, store) -> int:
    """Export `model` as a SavedModel to `local_dir` and upload it to `model/`; returns files uploaded."""
    shutil.rmtree(local_dir, ignore_errors=True)
    model.export(local_dir, format="tf_saved_model", verbose=False)
    # A previous attempt may have left part of an upload; start the folder afresh.
    store.delete_prefix(MODEL_PREFIX + "/")
    return store.upload_dir(local_dir, MODEL_PREFIX, changed_only=False)


def complete_record(*, step: int, metrics: dict, examples_seen: int, events: list[dict], finished_at: float) -> dict:
    """The `COMPLETE` document, from the run's events (all attempts) and the final state."""
    from trainer.events import parse_time
    from trainer.loop import seconds_lost

    starts = [parse_time(e["time"]) for e in events if e.get("event") == "started" and "time" in e]
    first = min(starts) if starts else finished_at
    return {
        "step": step,
        "metrics": metrics,
        "examples_seen": examples_seen,
        "attempts": len(starts) or 1,
        "seconds_lost_to_preemption": seconds_lost(events),
        "total_seconds": round(finished_at - first, 3),
        "finished_at": datetime.fromtimestamp(finished_at, UTC).isoformat(timespec="milliseconds"),
    }


def write_complete(store, **kw) -> dict:
    """Write `COMPLETE` (one atomic object) and return what was written."""
    doc = complete_record(**kw)
    store.put_bytes(COMPLETE_KEY, json.dumps(doc, indent=2).encode())
    return doc

