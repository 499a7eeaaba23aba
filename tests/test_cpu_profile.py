"""The CPU profile plugin (tests/cpu_profile.py) charges a child's CPU to the test that ran it,
whether the child is still running at that test's end or reaped by a later test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCENARIO = '''
import os, signal, subprocess, sys, time

BURN = "import time\\nwhile time.process_time() < 1.0: pass\\nopen(%r, 'w').close()\\ntime.sleep(120)\\n"
child = None


def test_starts_a_child_that_outlives_it(tmp_path):
    global child
    done = str(tmp_path / "burnt")
    child = subprocess.Popen([sys.executable, "-c", BURN % done])
    deadline = time.monotonic() + 120
    while not os.path.exists(done):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(1.5)  # the plugin's poll (every 0.5 s) sees the child, on a loaded machine too


def test_reaps_it():
    child.send_signal(signal.SIGKILL)
    child.wait()


def test_fails():
    assert False
'''


def test_a_child_is_charged_to_the_test_that_ran_it_not_to_the_one_that_reaps_it(tmp_path):
    (tmp_path / "test_scenario.py").write_text(SCENARIO)
    out = tmp_path / "profile"
    # The inner pytest runs without xdist: an xdist worker's variables would name its file after this worker.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(CPU_PROFILE_DIR=str(out), PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.cpu_profile", "-p", "no:cacheprovider", "-n0",
                        "-q", "-o", "addopts=", "--rootdir", str(tmp_path), "test_scenario.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "1 failed, 2 passed" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    rows = {json.loads(line)["id"].split("::")[1]: json.loads(line) for line in (out / "main.jsonl").read_text().splitlines()}
    ran, reaped = rows["test_starts_a_child_that_outlives_it"], rows["test_reaps_it"]
    # The child burnt 1 s of CPU and was still running: RUSAGE_CHILDREN alone says 0 here.
    assert ran["live"] >= 0.9 and ran["children"] >= 0.9, ran
    assert ran["procs"] == 1 and ran["py"] == 1 and ran["tf"] == 0 and ran["left"], ran
    # Reaping it adds its whole CPU to RUSAGE_CHILDREN; what it spent before this test is taken off.
    assert reaped["children"] < 0.5, reaped
    assert ran["outcome"] == reaped["outcome"] == "passed" and rows["test_fails"]["outcome"] == "failed"
