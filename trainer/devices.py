"""The GPUs a run asked for against the GPUs TensorFlow sees: refuse to train on the wrong machine.

A machine whose image gives TensorFlow no GPU (e.g. a cuDNN older than the one TF was built
against) would otherwise train on its CPU while the stack pays GPU prices until the runtime
cap. With `--gpus-per-node N` (`TRAINSTACK_GPUS_PER_NODE`, set by the machine's boot from
the stack's `compute.gpusPerNode`; unset locally, where nothing is checked) the trainer
compares N with the devices TF lists and, when they differ, ends the attempt with one
`failed` event whose reason says what was seen, and exit code `exits.UNUSABLE`: the
machine's supervisor marks the run FAILED at once instead of retrying on the same machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess


class DeviceMismatch(RuntimeError):
    """TensorFlow sees a different number of GPUs than the run asked for."""

    def __init__(self, reason: str, details: dict) -> None:
        super().__init__(reason)
        self.details = details


def driver_version() -> str | None:
    """The NVIDIA driver version, from the kernel module or nvidia-smi; None when neither is there."""
    try:
        with open("/proc/driver/nvidia/version") as fh:
            first = fh.readline()
        # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..."
        for word in first.split():
            if word[:1].isdigit() and "." in word:
                return word
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10, check=False)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return None


def build_info() -> dict:
    """The CUDA and cuDNN versions this TensorFlow was built against (empty for a CPU-only build)."""
    import tensorflow as tf

    info = tf.sysconfig.get_build_info()
    keys = ("is_cuda_build", "cuda_version", "cudnn_version", "cuda_compute_capabilities")
    return {k: info[k] for k in keys if k in info}


def visible_gpus(list_devices=None) -> list[str]:
    """Names of the GPUs TensorFlow sees (`list_devices` stands in for `tf.config.list_physical_devices`)."""
    if list_devices is None:
        import tensorflow as tf

        list_devices = tf.config.list_physical_devices
    return [d.name for d in list_devices("GPU")]


def check_gpus(expected: int | None, list_devices=None) -> None:
    """Raise :class:`DeviceMismatch` when TF's GPUs differ from `expected` (None: no check)."""
    if expected is None:
        return
    seen = visible_gpus(list_devices)
    if len(seen) == expected:
        return
    details = {
        "expected_gpus": expected,
        "devices": seen,
        "build": build_info(),
        "driver": driver_version(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # Where the CUDA/cuDNN libraries were looked for (the machines name the pip wheels' folders).
        "ld_library_path": os.environ.get("LD_LIBRARY_PATH"),
    }
    build = details["build"]
    built = (f"TensorFlow built for CUDA {build.get('cuda_version')} / cuDNN {build.get('cudnn_version')}"
             if build.get("is_cuda_build") else "TensorFlow is a CPU-only build")
    reason = (
        f"the run asks for {expected} GPU(s) per machine but TensorFlow sees {len(seen)} "
        f"({', '.join(seen) or 'none'}); {built}; NVIDIA driver {details['driver'] or 'not found'}. "
        "The image's CUDA/cuDNN libraries or the driver do not match this TensorFlow (see docs: "
        "supported images and drivers); not training on the wrong devices"
    )
    raise DeviceMismatch(reason, details)
