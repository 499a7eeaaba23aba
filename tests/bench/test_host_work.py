"""`python -m bench.host_work` times a real trainer run's calls and its host work by function: what it
wraps must still be the loop's (a rename fails here, not in the lead's next measurement)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_runs_calls_and_host_functions_are_all_counted(tmp_path):
    p = subprocess.run([sys.executable, "-m", "bench.host_work", "--run-uri", f"file://{tmp_path}/run",
                        "--work-dir", str(tmp_path / "work"), "--synthetic", "--model", "mlp", "--batch-size", "16",
                        "--steps", "40", "--log-every", "10"],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    calls = doc["calls"]
    assert sum(n for n, *_ in calls) == 40 and calls[0][3] == 0.0
    assert all(wall > 0 and gap >= 0 for _, wall, _, gap in calls)
    host = doc["host"]
    assert host["training_scalars"]["n"] == 4  # a log point every 10 steps
    assert host["results"]["n"] == 5  # the four points' metrics and the end's evaluation
    assert 1 <= host["_log"]["n"] <= 4  # once a call that holds log points
    assert host["evaluate"]["n"] == 1  # the end's
    assert doc["speed"]["loop_seconds"] > 0 and doc["in_call_examples_per_sec"] > 0
