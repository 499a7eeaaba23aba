"""The training input at the run's position: the stream, and where a resume takes it up.

In-memory arrays (`--synthetic`, or a `make_dataset` that returns `(x, y)` arrays) on one
replica are batched inside the step's graph (`trainer.data.ArraySource`), with no tf.data:
the run's `batches_seen` is their whole position. A model's own `make_dataset` pipeline
continues from the iterator state saved in the checkpoint where there is one
(`trainer.data_state`); otherwise the pipeline skips the batches already consumed, and the
loop reports the skip once its first call has waited for it. Several workers shard each
global batch by DATA, so N workers train on exactly the examples one worker would. The
stream itself (files, staging, batching) is `trainer.data`'s.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf

from runfolder import layout
from trainer import data as data_mod
from trainer import data_state
from trainer.config import TrainConfig
from trainer.models import ModelSpec
from trainer.tf_checkpoint import STATE_FILE


@dataclass
class Feed:
    """What `open_feed` made: the iterator and what the loop needs to know about it."""

    iterator: object
    skipped: tuple | None  # (batches skipped, why, when the pipeline was made), or None
    staging: object | None  # the --data-uri files downloading while the stream runs (trainer.staging)
    element_spec: object  # the training stream's (x, y) specs
    data: data_state.DataState | None  # what each checkpoint saves of a make_dataset's position


def open_feed(spec: ModelSpec, cfg: TrainConfig, strategy, *, global_batch: int, multi_worker: bool,
              plain: bool, batches_seen: int, restored_dir: str | None, emit: Callable[..., dict]) -> Feed:
    """The input iterator at the run's position (`batches_seen`, restored from `restored_dir`).

    `plain`: one replica on the CPU, fed by the data set's own iterator rather than the
    distributed one (whose state TF cannot save). In-memory arrays on one replica (the CPU or
    one GPU, one worker) skip tf.data: an `ArraySource` on the replica's device at `batches_seen`.
    """
    made: dict = {}
    own = spec.make_dataset(global_batch, cfg.seed) if spec.make_dataset is not None else None
    arrays = data_mod.arrays_of(own) if own is not None else spec.synthetic(cfg.seed) if cfg.synthetic else None
    if arrays is not None and strategy.num_replicas_in_sync == 1 and not multi_worker:
        source = data_mod.ArraySource(*arrays, global_batch, cfg.seed, data_mod.Position(batches_seen),
                                      device=strategy.extended.worker_devices[0])
        return Feed(source, None, None, source.element_spec, None)

    def pipeline(skip: int):
        ds, made["staging"] = data_mod.make_stream(spec, cfg, global_batch, data_mod.Position(skip), emit=emit,
                                                   own=own if arrays is None else arrays)
        if multi_worker:
            # DATA sharding of a stream batched by the global batch: every worker builds the same
            # stream and takes its own slice of each global batch, so N workers train on exactly
            # the examples one worker would (tests/trainer/test_cluster.py compares the weights).
            opts = tf.data.Options()
            opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
            ds = ds.with_options(opts)
        made["element_spec"] = ds.element_spec
        return ds

    user = own is not None and arrays is None  # a model's own pipeline: its position is tf.data's state
    saved, why = None, "the checkpoint holds no input pipeline state"
    if cfg.data_state_max_mb <= 0:
        why = "--data-state-max-mb is 0"  # neither saved nor used
    elif user and batches_seen and restored_dir:
        with open(os.path.join(restored_dir, STATE_FILE)) as fh:
            entry = json.load(fh)
        saved = data_state.saved_state_prefix(restored_dir, entry)
        why = (entry.get("data_state") or {}).get("reason") or why
    skipped = None
    if saved is not None and plain:
        prefix, skip = saved
        started = time.monotonic()
        iterator = iter(pipeline(skip))
        try:
            data_state.restore_iterator(iterator, prefix)
        except (tf.errors.OpError, ValueError, AssertionError) as e:
            # The pipeline changed since (another make_dataset): its old state cannot place it.
            detail = " ".join(str(e).split())[:200]
            skipped = (batches_seen, f"the saved input pipeline state does not fit this make_dataset ({detail})")
        else:
            emit(layout.DATA_RESTORED, batches_seen=batches_seen, skip=skip,
                 seconds=round(time.monotonic() - started, 3), bytes=data_state.state_bytes(restored_dir))
    elif user and batches_seen:
        skipped = (batches_seen, why if plain else data_state.DISTRIBUTED)
    skip = saved[1] if saved is not None and skipped is None else batches_seen
    if saved is None or skipped is not None:
        ds = pipeline(batches_seen)
        iterator = iter(ds) if plain else iter(strategy.experimental_distribute_dataset(ds))
        if skipped is not None:
            skipped = (*skipped, time.monotonic())  # the skip runs from here, in tf.data's threads
    data = None
    if user:
        data = data_state.DataState(iterator if plain else None, skip=skip, max_mb=cfg.data_state_max_mb, emit=emit,
                                    reason=None if plain else data_state.DISTRIBUTED)
    return Feed(iterator, skipped, made.get("staging"), made["element_spec"], data)
