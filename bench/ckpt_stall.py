"""Checkpoint stall and upload throughput, for checkpoints of a given size, against the run's S3 endpoint.

For each size, with the trainer's own `Checkpointer` and `CheckpointStore` (what
`trainer.loop.TrainLoop._checkpoint` does on a background checkpoint):

* blocked — the seconds the loop waits per checkpoint: `save_local` (TF writes the
  variables, the resume fingerprint hashes them) plus `commit(sync=False)` (a hard-link
  snapshot, then the upload goes on in the background);
* contention — while the upload runs, a small training step (the `mlp` at batch 64, in
  memory) keeps stepping in this process; its speed against the same step with no upload
  gives the training seconds the upload costs on a shared CPU. moto_server runs on the same
  cores here, so this overstates what a remote bucket would cost;
* ours — the background commit's own duration (hashing, parallel multipart upload,
  listing check, marker), and its throughput; and the same commit once more with nothing
  running beside it (`commit`, synchronous), as the plain upload runs;
* plain — `boto3`'s `upload_file` (its default multipart settings) of the same files,
  one after the other, in the same run.

Usage: AWS_ENDPOINT_URL=... python -m bench.ckpt_stall --bucket B --sizes-mb 10,100,1000
Prints one JSON line: {"sizes": [{...}, ...]}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_CHUNK_FLOATS = 16 * 1024 * 1024  # 64 MiB per variable: large checkpoints as several files' worth of tensors


def _variables(nbytes: int):
    import tensorflow as tf

    floats = max(1, nbytes // 4)
    out, i = [], 0
    while floats > 0:
        n = min(floats, _CHUNK_FLOATS)
        out.append(tf.Variable(tf.random.uniform([n], seed=i), name=f"w{i}"))
        floats -= n
        i += 1
    return out


def _probe_step():
    """A small in-memory training step (the mlp, batch 64, 20 steps per call) and its examples per call."""
    import tensorflow as tf

    from trainer.config import TrainConfig
    from trainer.data import preprocess
    from trainer.loop import per_example_loss, seeded_model

    cfg = TrainConfig(run_uri="file:///nowhere", synthetic=True, batch_size=64)
    spec = seeded_model(cfg, tf.distribute.get_strategy())
    x, y = spec.synthetic(0)
    xb, yb = preprocess(tf.constant(x[:64])), tf.constant(y[:64])

    @tf.function
    def steps():
        for _ in tf.range(20):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(per_example_loss(spec, yb, spec.model(xb, training=True)))
            grads = tape.gradient(loss, spec.model.trainable_variables)
            spec.optimizer.apply_gradients(zip(grads, spec.model.trainable_variables, strict=True))
        return loss

    steps()
    return steps, 20 * 64


def _rate(step, per_call: int, until) -> tuple[float, float]:
    """Step until `until()` is true; returns (examples/s, seconds)."""
    n, t0 = 0, time.perf_counter()
    while True:
        step()
        n += 1
        if until(time.perf_counter() - t0):
            break
    dt = time.perf_counter() - t0
    return n * per_call / dt, dt


def measure_size(size_mb: float, bucket: str, run_prefix: str, step, per_call: int) -> dict:
    """All figures for one checkpoint size (see the module docstring)."""
    import boto3
    import tensorflow as tf

    from trainer.checkpointer import Checkpointer
    from trainer.checkpoints import CheckpointStore
    from trainer.storage import open_store

    variables = _variables(int(size_mb * 1e6))
    base_rate, _ = _rate(step, per_call, lambda t: t >= 1.5)  # just before: the machine's load drifts
    store = open_store(f"s3://{bucket}/{run_prefix}")
    committed: list[dict] = []
    ckstore = CheckpointStore(store, keep=1, on_commit=committed.append)
    work = tempfile.mkdtemp(prefix="bench-ckpt-")
    try:
        ckpt = tf.train.Checkpoint(v=list(variables))
        cp = Checkpointer(ckstore, ckpt, work=work, chief=True, variables=variables, model="bench")
        state = {"step": 1, "batches_seen": 1, "examples_seen": 1}
        t0 = time.perf_counter()
        folder = cp.save_local(1, state)
        t1 = time.perf_counter()
        nbytes = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        cp.commit(1, folder, sync=False)
        t2 = time.perf_counter()
        waiter = threading.Thread(target=ckstore.wait, args=(None,), daemon=True)
        waiter.start()
        during, upload_wall = _rate(step, per_call, lambda _: not waiter.is_alive())
        waiter.join()
        upload_wall = time.perf_counter() - t2  # the last probe call may end after the upload did
        if not committed:
            raise RuntimeError(f"the {size_mb} MB checkpoint was not committed; see the trainer's errors above")
        ours_s = float(committed[-1]["seconds"])

        # The same files, uploaded with plain boto3 (default TransferConfig), one by one.
        folder2 = cp.save_local(2, {**state, "step": 2})
        client = boto3.session.Session().client("s3")
        p0 = time.perf_counter()
        for name in sorted(os.listdir(folder2)):
            client.upload_file(os.path.join(folder2, name), bucket, f"{run_prefix}/plain/{name}")
        plain_s = time.perf_counter() - p0
        # Ours again with nothing beside it, as the plain upload ran: the fair comparison.
        folder3 = cp.save_local(3, {**state, "step": 3})
        ckstore.commit(3, folder3)
        alone_s = float(committed[-1]["seconds"])
        # moto keeps objects in memory: free them before the next size.
        store.delete_prefix("checkpoints/")
        store.delete_prefix("plain/")
        return {
            "size_mb": size_mb, "bytes": nbytes,
            "save_s": round(t1 - t0, 3), "snapshot_s": round(t2 - t1, 3), "blocked_s": round(t2 - t0, 3),
            "upload_s": round(ours_s, 3), "upload_alone_s": round(alone_s, 3), "upload_wall_s": round(upload_wall, 3),
            "plain_s": round(plain_s, 3),
            "rate_base": round(base_rate, 1), "rate_during": round(during, 1),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    """CLI: print every size's figures as one JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", default="runs/bench-stall")
    p.add_argument("--sizes-mb", default="10,100,1000")
    a = p.parse_args()
    step, per_call = _probe_step()
    sizes = [measure_size(float(s), a.bucket, f"{a.prefix}-{s}", step, per_call) for s in a.sizes_mb.split(",")]
    print(json.dumps({"sizes": sizes}), flush=True)


if __name__ == "__main__":
    main()
