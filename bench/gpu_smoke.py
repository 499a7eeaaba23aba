"""GPU smoke check: does this image's TensorFlow really train on this machine's GPUs?

Run inside the trainer image on a GPU machine, one command from the repository root. The
stock image with the CUDA/cuDNN wheels the machines add to it (trainer/requirements-gpu.txt,
docs/gpu.md), as the machines run it:

    docker run --rm --gpus all -v "$PWD:/w" -w /w tensorflow/tensorflow:2.21.0-gpu sh -c \
      'pip install -q --target /tmp/cuda -r trainer/requirements-gpu.txt &&
       LD_LIBRARY_PATH=$(ls -d /tmp/cuda/nvidia/*/lib | paste -sd:) python bench/gpu_smoke.py'

An image built by the stack (image.build: true) has them already:
`docker run --rm --gpus all -v "$PWD:/w" -w /w IMAGE python bench/gpu_smoke.py`.

It prints the versions that decide whether TF finds the GPU (TF, its CUDA/cuDNN build,
the NVIDIA driver), lists the GPUs TF sees, runs one matmul and one training step of the
trainer's `mlp` on the first GPU, checks that both ran there, and ends with one JSON line
(`"ok": true|false`) to record in bench/RESULTS.md. Exit 0 when every check passed, 1 when
one failed, 2 when TF sees no GPU at all (e.g. the image's cuDNN is older than TF's build).

Once the step runs on the GPU it also measures the loop's step against two limits, `mlp` at
batch 64, 1,000 steps a call, about `LOOP_SECONDS` each (reported, not a check): `loop` is
the trainer's own step (`trainer.step.make_train_step` under its one-machine strategy, fed by
the `--synthetic` stream through the distributed iterator that prefetches to the device, with
its metrics); `loop_plain_iterator` the same step fed by the stream's own iterator (the batch
is copied to the device inside the step); `loop_in_graph_source` the same step fed as the loop
feeds in-memory arrays on one replica (`trainer.data.ArraySource`: the batch gathered on the host
inside the step, its uint8 copied to the device and converted there; `in_graph_source_batches_exact`
says whether its batches are the stream's, bit for bit, on this device); `limit` the same
model's step on one batch already on the device, in the same kind of `tf.range` loop
(`bench.limit`); `jit_limit` that loop compiled whole with XLA (the host out of the loop).
bench/RESULTS.md says what to expect of them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the trainer package, run from anywhere
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # keep "Skipping registering GPU devices" visible


LOOP_SECONDS = 3.0


def loop_speeds(batch: int = 64, per_call: int = 1000, seconds: float = LOOP_SECONDS) -> dict:
    """examples/s of the trainer's step, the limit's and the limit compiled whole, on the default device."""
    import tensorflow as tf

    from bench.limit import limit_steps
    from trainer import data as data_mod
    from trainer.config import TrainConfig
    from trainer.metrics import MetricSet
    from trainer.models import seeded_model
    from trainer.step import make_train_step

    cfg = TrainConfig(run_uri="file:///tmp/gpu-smoke", synthetic=True, batch_size=batch)
    strategy = tf.distribute.MirroredStrategy()  # trainer.strategy's choice for one machine
    spec = seeded_model(cfg, strategy)
    ds = data_mod.make_dataset(spec, cfg, batch, data_mod.Position(0))
    metrics = MetricSet(spec.metrics, ds.element_spec[1], (None, 10))
    step = make_train_step(strategy, spec, cfg, batch, False, tf.Variable(0, dtype=tf.int64), metrics)
    iterator = iter(strategy.experimental_distribute_dataset(ds))
    # The plain iterator (the loop's on one CPU replica): its batch is on the host, copied in the step.
    plain_spec = seeded_model(cfg, strategy)
    plain_step = make_train_step(strategy, plain_spec, cfg, batch, False, tf.Variable(0, dtype=tf.int64), metrics)
    plain = iter(data_mod.make_dataset(plain_spec, cfg, batch, data_mod.Position(0)))
    count, request = tf.constant(per_call, tf.int64), tf.constant((0.0, 0.0, 0.0))
    # In-memory arrays on one replica, as the loop feeds them (trainer.feed): each batch taken inside
    # the step, no tf.data; uint8 copied to the device and converted there.
    source_spec = seeded_model(cfg, strategy)
    source_step = make_train_step(strategy, source_spec, cfg, batch, False, tf.Variable(0, dtype=tf.int64), metrics)
    device = strategy.extended.worker_devices[0]
    source = data_mod.ArraySource(*source_spec.synthetic(cfg.seed), batch, cfg.seed, data_mod.Position(0), device=device)

    steps = limit_steps(tf, seeded_model(cfg, tf.distribute.get_strategy()), cfg.seed, batch)
    limit, jit_limit = tf.function(steps), tf.function(steps, jit_compile=True)
    calls = {"loop": lambda: step(iterator, count, request)[0],
             "loop_plain_iterator": lambda: plain_step(plain, count, request)[0],
             "loop_in_graph_source": lambda: source_step(source, count, request)[0],
             "limit": lambda: limit(count), "jit_limit": lambda: jit_limit(count)}
    out = {}
    for name, call in calls.items():
        try:
            call().numpy()  # traces (and compiles)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                call().numpy()  # a host sync per call, as the trainer's loop has
                n += 1
            out[f"{name}_examples_per_sec"] = round(n * per_call * batch / (time.perf_counter() - t0), 1)
        except Exception as e:  # noqa: BLE001 - a limit XLA cannot compile is reported, the others still run
            out[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
    out["in_graph_source_batches_exact"] = source_batches_exact(cfg, spec, batch, device)
    for loop in ("loop", "loop_plain_iterator", "loop_in_graph_source"):
        for ref in ("limit", "jit_limit"):
            if f"{ref}_examples_per_sec" in out and f"{loop}_examples_per_sec" in out:
                out[f"{loop}_of_{ref}"] = round(out[f"{loop}_examples_per_sec"] / out[f"{ref}_examples_per_sec"], 3)
    return out


def source_batches_exact(cfg, spec, batch: int, device: str, n: int = 3) -> bool:
    """Whether the in-graph source's first `n` batches on `device` are the stream's, bit for bit: taken one
    at a time (`next()`) and as the step's loop takes them (loop state: `open_call`, `following`)."""
    import numpy as np
    import tensorflow as tf

    from trainer import data as data_mod

    x, y = spec.synthetic(cfg.seed)
    source = data_mod.ArraySource(x, y, batch, cfg.seed, data_mod.Position(0), device=device)
    one_at_a_time = tf.function(lambda: [next(source) for _ in range(n)])()
    carried = data_mod.ArraySource(x, y, batch, cfg.seed, data_mod.Position(0), device=device)

    def as_the_loop():
        took, (batch_now, following) = [], carried.open_call()
        for _ in range(n):
            took.append(batch_now)
            batch_now, following = carried.following(following)
        return took

    stream = list(data_mod.from_arrays(x, y, batch, cfg.seed, data_mod.Position(0)).take(n))
    return all(np.array_equal(a.numpy(), c.numpy()) and np.array_equal(b.numpy(), d.numpy())
               for took in (one_at_a_time, tf.function(as_the_loop)())
               for (a, b), (c, d) in zip(took, stream, strict=True))


def main() -> int:
    """Run the checks; returns the exit code."""
    import numpy as np
    import tensorflow as tf

    from trainer.devices import build_info, driver_version

    report: dict = {
        "tensorflow": tf.__version__,
        "build": build_info(),
        "driver": driver_version(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "ld_library_path": os.environ.get("LD_LIBRARY_PATH"),
    }
    gpus = tf.config.list_physical_devices("GPU")
    report["gpus"] = [g.name for g in gpus]
    for g in gpus:
        report.setdefault("gpu_details", []).append(tf.config.experimental.get_device_details(g))
    print(f"TensorFlow {report['tensorflow']}, built for CUDA {report['build'].get('cuda_version')} / "
          f"cuDNN {report['build'].get('cudnn_version')}; NVIDIA driver {report['driver'] or 'not found'}")
    print(f"GPUs TensorFlow sees: {report['gpus'] or 'none'}")
    if not gpus:
        report["ok"] = False
        report["error"] = "TensorFlow sees no GPU"
        print(json.dumps(report, default=str))
        return 2

    checks = {}
    try:
        with tf.device("/GPU:0"):
            a = tf.random.stateless_normal([2048, 2048], seed=[1, 2])
            t0 = time.perf_counter()
            c = tf.linalg.matmul(a, a)
            value = float(tf.reduce_sum(c))  # forces the work to finish
            checks["matmul_seconds"] = round(time.perf_counter() - t0, 4)
        checks["matmul_device"] = c.device
        checks["matmul_on_gpu"] = "GPU" in c.device.upper() and np.isfinite(value)

        import keras

        from trainer.config import load_config
        from trainer.models import build_model

        keras.utils.set_random_seed(0)
        cfg = load_config(["--run-uri", "file:///tmp/gpu-smoke", "--synthetic"], env={})
        with tf.device("/GPU:0"):
            spec = build_model(cfg)
            x = tf.random.stateless_uniform([64, 784], seed=[3, 4])
            y = tf.random.stateless_uniform([64], seed=[5, 6], maxval=10, dtype=tf.int64)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(spec.loss(y, spec.model(x, training=True)))
            grads = tape.gradient(loss, spec.model.trainable_variables)
            spec.optimizer.apply_gradients(zip(grads, spec.model.trainable_variables, strict=True))
        kernel = spec.model.trainable_variables[0]
        checks["train_step_loss"] = float(loss)
        checks["variables_device"] = kernel.value.device if hasattr(kernel, "value") else str(kernel.device)
        checks["train_step_on_gpu"] = "GPU" in str(checks["variables_device"]).upper() and np.isfinite(float(loss))
    except Exception as e:  # noqa: BLE001 - any failure is the answer this check exists to give
        checks["error"] = f"{type(e).__name__}: {e}"
    report.update(checks)
    report["ok"] = bool(checks.get("matmul_on_gpu") and checks.get("train_step_on_gpu"))
    if report["ok"]:
        report["loop_speed"] = loop_speeds()
        print(f"mlp batch 64, examples/s: {report['loop_speed']}")
    print(f"matmul on {checks.get('matmul_device')}: {'ok' if checks.get('matmul_on_gpu') else 'FAILED'}; "
          f"training step on {checks.get('variables_device')}: {'ok' if checks.get('train_step_on_gpu') else 'FAILED'}"
          + (f"; {checks['error']}" if "error" in checks else ""))
    print(json.dumps(report, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
