"""Trainer start-up prints no TensorFlow/absl noise by default, and `--verbose` brings it back.

A short start that really imports TensorFlow: a second machine's trainer on a run whose lease
another machine holds (it loads TF, waits its 1 s bound, names the holder and exits 77). A run
already COMPLETE ends before the import (checked below). This TensorFlow build prints the absl
"before absl::InitializeLog()" warning and INFO lines (oneDNN's or the CPU feature guard's) at import even with
TF_CPP_MIN_LOG_LEVEL=3, so the verbose run proves the check can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runfolder import exits, layout
from tests.trainer.helpers import REPO
from trainer.quiet import TF_NOISE

NOISE_MARKS = ("absl::InitializeLog", "port.cc", "oneDNN", "cpu_feature_guard", "cuda_dnn", "cuda_fft",
               "cuda_blas", "computation_placer")


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CPP", "TRAINSTACK_"))}
    env.update({"PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", **extra})
    return env


def _start(tmp_path, *flags: str, **env_extra: str) -> subprocess.CompletedProcess:
    from runfolder.lease import RunLease
    from runfolder.storage import open_store

    run = tmp_path / "run"
    if not run.exists():
        # Held by machine-a, never renewed, for far longer than the test runs.
        RunLease(open_store(run.as_uri()), holder="machine-a/1", ttl_s=3600).acquire()
    env = _env(TRAINSTACK_MACHINE_ID="machine-b", **env_extra)
    return subprocess.run([sys.executable, "-m", "trainer", "--run-uri", run.as_uri(), "--synthetic", "--steps", "10",
                           "--lease-wait-s", "1", *flags], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)


@pytest.mark.slow
def test_start_up_prints_no_tensorflow_noise_and_verbose_brings_it_back(tmp_path):
    quiet = _start(tmp_path)
    assert quiet.returncode == exits.LEASE_HELD, quiet.stderr
    # The lease is taken after TensorFlow's import: the trainer got that far.
    assert "another trainer (machine-a/1" in quiet.stdout, quiet.stdout
    assert [line for line in quiet.stderr.splitlines() if any(m in line for m in NOISE_MARKS)] == []
    assert quiet.stderr == ""

    for loud in (_start(tmp_path, "--verbose"), _start(tmp_path, TRAINSTACK_VERBOSE="1")):
        assert loud.returncode == exits.LEASE_HELD, loud.stderr
        # Which INFO lines follow absl's depends on the CPU: oneDNN's on Intel, the CPU
        # feature guard's on AMD EPYC (no oneDNN line there).
        assert "absl::InitializeLog" in loud.stderr
        assert "oneDNN" in loud.stderr or "cpu_feature_guard" in loud.stderr, loud.stderr


ENDED = """
import sys
from trainer.__main__ import main
code = main(sys.argv[1:])
print("tensorflow imported:", "tensorflow" in sys.modules, "exit", code)
"""


def _ended(run, *flags: str, **env_extra: str) -> tuple[list[dict], str]:
    p = subprocess.run([sys.executable, "-c", ENDED, "--run-uri", run.as_uri(), "--synthetic", "--steps", "10", *flags],
                       cwd=REPO, env=_env(**env_extra), capture_output=True, text=True, timeout=240)
    said = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    return said, (p.stdout.splitlines() or [""])[-1]


def test_a_run_that_already_ended_says_so_before_importing_tensorflow(tmp_path):
    for marker, expected in ((layout.COMPLETE, layout.ALREADY_COMPLETE), (layout.CANCELLED, layout.ALREADY_CANCELLED)):
        run = tmp_path / marker
        run.mkdir()
        (run / marker).write_text(json.dumps({"step": 10, "attempts": 1, "metrics": {},
                                              "finished_at": "2026-11-30T12:00:00.000+00:00"}))
        said, last = _ended(run)
        assert [(e["event"], e["step"], e["attempt"]) for e in said] == [(expected, 10, 1)], said
        assert last == "tensorflow imported: False exit 0", (marker, last)
    # A run still training goes on to TensorFlow (what makes the check above able to fail):
    # here one whose lease machine-a holds, refused after the import.
    run = tmp_path / "held"
    from runfolder.lease import RunLease
    from runfolder.storage import open_store

    RunLease(open_store(run.as_uri()), holder="machine-a/1", ttl_s=3600).acquire()
    said, last = _ended(run, "--lease-wait-s", "1", TRAINSTACK_MACHINE_ID="machine-b")
    assert said[-1]["event"] == layout.FAILED_EVENT and last == f"tensorflow imported: True exit {exits.LEASE_HELD}"


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
