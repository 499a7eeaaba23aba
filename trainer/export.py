"""A finished run's outputs: the SavedModel in `<run-uri>/model/` and the `COMPLETE` record.

The SavedModel is made with Keras 3 `model.export` (a `serve` signature that predicts)
and uploaded whole before `COMPLETE` is written, so `COMPLETE` only ever names a run whose
outputs are all there. `COMPLETE` holds the final step, metrics, examples seen, number of
attempts, seconds lost to preemption, total seconds, the machine-hours and their cost
(`runfolder.cost`: every attempt x nodes x the price the stack gave) and the SavedModel's
signature (its inputs and outputs by name, dtype and shape), read back from the exported model.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime

from runfolder import cost, layout
from runfolder.events import parse_time, seconds_lost


def export_model(model, local_dir: str, store) -> int:
    """Export `model` as a SavedModel to `local_dir` and upload it to `model/`; returns files uploaded."""
    shutil.rmtree(local_dir, ignore_errors=True)
    model.export(local_dir, format="tf_saved_model", verbose=False)
    # A previous attempt may have left part of an upload; start the folder afresh.
    store.delete_prefix(layout.MODEL_PREFIX)
    return store.upload_dir(local_dir, layout.MODEL_PREFIX, changed_only=False)


SIGNATURE = "serving_default"  # the signature Keras `export` writes beside the `serve` endpoint


def saved_model_signature(local_dir: str) -> dict:
    """The exported model's serving signature, as the SavedModel itself declares it."""
    import tensorflow as tf

    fn = tf.saved_model.load(local_dir).signatures[SIGNATURE]

    def specs(structure: dict) -> dict:
        return {name: {"dtype": spec.dtype.name, "shape": [None if d is None else int(d) for d in spec.shape]}
                for name, spec in sorted(structure.items())}

    return {"endpoint": "serve", "signature": SIGNATURE, "inputs": specs(fn.structured_input_signature[1]),
            "outputs": specs(fn.structured_outputs)}


def complete_record(*, step: int, metrics: dict, examples_seen: int, events: list[dict], finished_at: float,
                    signature: dict | None = None, best: dict | None = None, eval_seconds: float | None = None,
                    model_files: int | None = None, model_note: str | None = None) -> dict:
    """The `COMPLETE` document, from the run's events (all attempts) and the final state.

    `metrics` are the final ones (the training loss and metrics, the last evaluation's
    val_…); `best` the best evaluation by --keep-best (its step, value and metrics, and
    whether `model/` holds it); `eval_seconds` the time all validation passes took; a script's
    `model_files` (how many files `model/` got) and `model_note` (what became of a model it
    saved outside `fit.model_dir()`).
    """
    starts = [parse_time(e[layout.TIME]) for e in events if e.get(layout.EVENT) == layout.STARTED and layout.TIME in e]
    first = min(starts) if starts else finished_at
    return {
        layout.MARKER_STEP: step,
        "metrics": metrics,
        "examples_seen": examples_seen,
        layout.MARKER_ATTEMPTS: layout.attempts(events) or 1,
        "seconds_lost_to_preemption": seconds_lost(events),
        "total_seconds": round(finished_at - first, 3),
        "finished_at": datetime.fromtimestamp(finished_at, UTC).isoformat(timespec="milliseconds"),
        **_cost_fields(events, finished_at),
        **({"signature": signature} if signature else {}),
        **({"best": best} if best else {}),
        **({"eval_seconds": eval_seconds} if eval_seconds is not None else {}),
        **({"model_files": model_files} if model_files is not None else {}),
        **({"model_note": model_note} if model_note else {}),
    }


def _cost_fields(events: list[dict], finished_at: float) -> dict:
    total = cost.run_cost(events, end=finished_at)
    return total.to_json() if total is not None else {}


def write_complete(store, **kw) -> dict:
    """Write `COMPLETE` (one atomic object) and return what was written."""
    doc = complete_record(**kw)
    store.put_bytes(layout.COMPLETE, json.dumps(doc, indent=2).encode())
    return doc

