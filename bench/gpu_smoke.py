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
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the trainer package, run from anywhere
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # keep "Skipping registering GPU devices" visible


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
    print(f"matmul on {checks.get('matmul_device')}: {'ok' if checks.get('matmul_on_gpu') else 'FAILED'}; "
          f"training step on {checks.get('variables_device')}: {'ok' if checks.get('train_step_on_gpu') else 'FAILED'}"
          + (f"; {checks['error']}" if "error" in checks else ""))
    print(json.dumps(report, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
