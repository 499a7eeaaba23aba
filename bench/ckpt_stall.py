"""Checkpoint stall and upload throughput, for checkpoints of a given size, against the run's S3 endpoint.

For each size, with the trainer's own `Checkpointer` and `CheckpointStore`:

* blocked — the seconds the loop waits per checkpoint, as `trainer.loop.TrainLoop._checkpoint`
  does on a background checkpoint: `Checkpointer.save(sync=False)` (a snapshot of the
  variables; TF's write, the resume fingerprint and the upload go on on threads), plus what
  the snapshot costs the next training step: every variable updated once (as an optimizer
  step does) right after the save, against the same update with no snapshot held — TF's
  variables are copy-on-write, so the first update copies each variable the snapshot holds;
* before — the same checkpoint written in the loop, as before the background write existed
  (`save_local`: TF's write and the fingerprint, then the hand-over to the upload);
* tf_async — TF's own `CheckpointOptions(experimental_enable_async_checkpoint=True)` on the
  same variables: how long `write` blocks, the first time (it makes its host copies) and
  the third (it refreshes them; the second traces the function that does), without the
  resume fingerprint;
* memory — for each of the three, the peak resident memory above what the process held just
  before (`VmHWM` reset through `/proc/self/clear_refs`), what else the process does included;
* SIGTERM — a background save just handed over, then a synchronous save of the next step
  (`trainer.loop.TrainLoop.commit_current` on a stop): seconds until that one is committed;
* contention — while the background write and upload run, a small training step (the `mlp`
  at batch 64, in memory) keeps stepping in this process; its speed against the same step
  with nothing beside it gives the training seconds the background work costs on a shared
  CPU. moto_server runs on the same cores here, so this overstates what a remote bucket would cost;
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

from bench.ckpt_sigterm import status_mib

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
    from trainer.models import seeded_model
    from trainer.step import per_example_loss

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


class _PeakMemory:
    """The peak resident memory above the present one, from here to `extra()` (Linux: `VmHWM`, reset)."""

    def __init__(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # resets the peak to the present
        except OSError:
            pass  # the peak then counts from the process's start: an overstatement, never an understatement
        self.before = status_mib("VmRSS")

    def extra(self) -> float:
        return round(status_mib("VmHWM") - self.before, 1)


def _updater(variables):
    """Every variable updated once, in place where TF can (an optimizer step's writes, no gradients)."""
    import tensorflow as tf

    @tf.function
    def update():
        for v in variables:
            v.assign_add(tf.fill(tf.shape(v), 1e-7))

    update()
    return update


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _before(cp, ckstore, state) -> tuple[float, float, int, float]:
    """Before: TF's write and the fingerprint in the loop, then the hand-over to the upload: the save's
    seconds, the seconds blocked, the checkpoint's bytes and the extra memory."""
    mem = _PeakMemory()
    t0 = time.perf_counter()
    folder = cp.save_local(1, state(1))
    t1 = time.perf_counter()
    nbytes = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    cp.commit(1, folder, sync=False)
    t2 = time.perf_counter()
    before_mem = mem.extra()
    ckstore.wait(None)
    return t1 - t0, t2 - t0, nbytes, before_mem


def _plain_upload_s(folder: str, bucket: str, run_prefix: str) -> float:
    """Seconds to upload a checkpoint's files with plain boto3 (default TransferConfig), one by one."""
    import boto3

    client = boto3.session.Session().client("s3")
    p0 = time.perf_counter()
    for name in sorted(os.listdir(folder)):
        client.upload_file(os.path.join(folder, name), bucket, f"{run_prefix}/plain/{name}")
    return time.perf_counter() - p0


def _sigterm_s(cp, ckstore, committed: list[dict], state, size_mb: float) -> float:
    """Seconds for the stop's own step, committed synchronously right after a background save began."""
    cp.save(5, state(5), sync=False)
    s0 = time.perf_counter()
    cp.save(6, state(6), sync=True)
    sigterm_s = time.perf_counter() - s0
    if cp.wait_uploads() is not None or committed[-1]["step"] != 6 or 5 in ckstore.committed_steps():
        raise RuntimeError(f"the stop's checkpoint 6 ({size_mb} MB) was not the one committed: {committed[-2:]}")
    return sigterm_s


def _tf_async(variables, update, work: str) -> tuple[float, float, float, float]:
    """TF's own async checkpoint on the same variables: its first and next write, the update after
    it, and its extra memory (its host copies stay for the process's life)."""
    import tensorflow as tf

    tf_ckpt = tf.train.Checkpoint(v=list(variables))
    opts = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
    mem = _PeakMemory()
    tf_first_s = _timed(lambda: tf_ckpt.write(os.path.join(work, "tf-async", "a"), options=opts))
    tf_ckpt.sync()
    tf_ckpt.write(os.path.join(work, "tf-async", "b"), options=opts)  # traces its copy function
    tf_ckpt.sync()
    tf_next_s = _timed(lambda: tf_ckpt.write(os.path.join(work, "tf-async", "c"), options=opts))
    tf_update_s = _timed(update)
    tf_ckpt.sync()
    return tf_first_s, tf_next_s, tf_update_s, mem.extra()


def measure_size(size_mb: float, bucket: str, run_prefix: str, step, per_call: int) -> dict:
    """All figures for one checkpoint size (see the module docstring)."""
    import tensorflow as tf

    from runfolder.storage import open_store
    from trainer.checkpoint_store import CheckpointStore
    from trainer.tf_checkpoint import Checkpointer

    variables = _variables(int(size_mb * 1e6))
    update = _updater(variables)
    store = open_store(f"s3://{bucket}/{run_prefix}")
    committed: list[dict] = []
    ckstore = CheckpointStore(store, keep=1, on_commit=committed.append)
    work = tempfile.mkdtemp(prefix="bench-ckpt-")

    def state(n: int) -> dict:
        return {"step": n, "batches_seen": n, "examples_seen": n}

    try:
        cp = Checkpointer(ckstore, work=work, chief=True, variables=variables, model="bench",
                          checkpoint_of=lambda values: tf.train.Checkpoint(v=list(values)), background=True)
        before_save_s, before_blocked_s, nbytes, before_mem = _before(cp, ckstore, state)

        # Now: the background save, and the copy its snapshot costs the next update.
        update_s = min(_timed(update) for _ in range(2))
        base_rate, _ = _rate(step, per_call, lambda t: t >= 1.5)  # just before: the machine's load drifts
        mem = _PeakMemory()
        t3 = time.perf_counter()
        cp.save(2, state(2), sync=False)
        t4 = time.perf_counter()
        update_after_s = _timed(update)
        t5 = time.perf_counter()
        waiter = threading.Thread(target=cp.wait_uploads, daemon=True)
        waiter.start()
        during, _ = _rate(step, per_call, lambda _: not waiter.is_alive())
        waiter.join()
        background_wall = time.perf_counter() - t5  # the last probe call may end after the upload did
        ours_mem = mem.extra()
        if not committed or committed[-1]["step"] != 2:
            raise RuntimeError(f"the {size_mb} MB checkpoint was not committed; see the trainer's errors above")
        ours_s = float(committed[-1]["seconds"])

        # The same files, uploaded with plain boto3 (default TransferConfig), one by one.
        folder3 = cp.save_local(3, state(3))
        plain_s = _plain_upload_s(folder3, bucket, run_prefix)
        # Ours again with nothing beside it, as the plain upload ran: the fair comparison.
        folder4 = cp.save_local(4, state(4))
        ckstore.commit(4, folder4)
        alone_s = float(committed[-1]["seconds"])
        store.delete_prefix("plain/")

        # SIGTERM right after a background save began: the stop's own step, committed synchronously.
        sigterm_s = _sigterm_s(cp, ckstore, committed, state, size_mb)
        # moto keeps objects in memory: free them before the next size.
        store.delete_prefix("checkpoints/")

        # TF's own async checkpoint, on the same variables (its host copies stay for the process's life).
        tf_first_s, tf_next_s, tf_update_s, tf_mem = _tf_async(variables, update, work)
        cow_s = max(0.0, update_after_s - update_s)
        return {
            "size_mb": size_mb, "bytes": nbytes,
            "before_save_s": round(before_save_s, 3), "before_blocked_s": round(before_blocked_s, 3),
            "save_s": round(t4 - t3, 3), "update_s": round(update_s, 3), "update_after_s": round(update_after_s, 3),
            "copy_on_write_s": round(cow_s, 3), "blocked_s": round(t4 - t3 + cow_s, 3),
            "tf_async_first_s": round(tf_first_s, 3), "tf_async_next_s": round(tf_next_s, 3),
            "tf_async_update_s": round(tf_update_s, 3),
            "memory_mib": {"before": before_mem, "ours": ours_mem, "tf_async": tf_mem},
            "sigterm_s": round(sigterm_s, 3),
            "upload_s": round(ours_s, 3), "upload_alone_s": round(alone_s, 3), "upload_wall_s": round(background_wall, 3),
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
