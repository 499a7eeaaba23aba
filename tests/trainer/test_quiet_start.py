"""Trainer start-up prints no TensorFlow/absl noise by default, and `--verbose` brings it back.

A short start that really imports TensorFlow: the trainer on a run that is already COMPLETE
(it loads TF, reads the marker, says so and exits 0). This TensorFlow build prints the absl
"before absl::InitializeLog()" warning and INFO lines (oneDNN's or the CPU feature guard's) at import even with
TF_CPP_MIN_LOG_LEVEL=3, so the verbose run proves the check can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.trainer.helpers import REPO
from trainer.__main__ import TF_NOISE

NOISE_MARKS = ("absl::InitializeLog", "port.cc", "oneDNN", "cpu_feature_guard", "cuda_dnn", "cuda_fft",
               "cuda_blas", "computation_placer")


def _start(tmp_path, *flags: str, **env_extra: str) -> subprocess.CompletedProcess:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "COMPLETE").write_text(json.dumps({"step": 10, "attempts": 1, "metrics": {},
                                              "finished_at": "2026-11-30T12:00:00.000+00:00"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CPP", "TRAINSTACK_"))}
    env.update({"PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", **env_extra})
    return subprocess.run([sys.executable, "-m", "trainer", "--run-uri", run.as_uri(), "--synthetic", "--steps", "10",
                           *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_start_up_prints_no_tensorflow_noise_and_verbose_brings_it_back(tmp_path):
    quiet = _start(tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert "run already COMPLETE" in quiet.stdout  # TensorFlow was loaded: the trainer got that far
    assert [line for line in quiet.stderr.splitlines() if any(m in line for m in NOISE_MARKS)] == []
    assert quiet.stderr == ""

    for loud in (_start(tmp_path, "--verbose"), _start(tmp_path, TRAINSTACK_VERBOSE="1")):
        assert loud.returncode == 0, loud.stderr
        # Which INFO lines follow absl's depends on the CPU: oneDNN's on Intel, the CPU
        # feature guard's on AMD EPYC (no oneDNN line there).
        assert "absl::InitializeLog" in loud.stderr
        assert "oneDNN" in loud.stderr or "cpu_feature_guard" in loud.stderr, loud.stderr


@pytest.mark.parametrize(("line", "noise"), [
    ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n", True),
    ("I0000 00:00:1796080294.542576    7310 port.cc:153] oneDNN custom operations are on.\n", True),
    ("To enable the following instructions: AVX2 AVX512F, in other operations, rebuild TensorFlow\n", True),
    ("E0000 00:00:1732.123  1234 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to register\n", True),
    ("E0000 00:00:1732.123  1234 cuda_blas.cc:1418] Unable to register cuBLAS factory: Attempting\n", True),
    ("W0000 00:00:1732.123  1234 computation_placer.cc:177] computation placer already registered. Please\n", True),
    ("W0000 00:00:1732.123  1234 gpu_device.cc:2344] Cannot dlopen some GPU libraries.\n", False),
    ("E0000 00:00:1732.123  1234 cuda_driver.cc:152] failed call to cuInit: INTERNAL: CUDA error\n", False),
    ("Traceback (most recent call last):\n", False),
    ('{"event": "failed", "reason": "..."}\n', False),
])
def test_only_known_start_up_lines_count_as_noise(line, noise):
    assert bool(TF_NOISE.match(line)) is noise
