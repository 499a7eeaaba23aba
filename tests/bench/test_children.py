"""A bench that dies takes its trainers with it: a killed `python -m bench` must not leave a
probe training on (one was left running a million steps, a core's worth, for hours)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PARENT = """
import subprocess, sys
from bench.run_all import _dies_with_parent
child = subprocess.Popen(["sleep", "300"], preexec_fn=_dies_with_parent if sys.argv[1] == "yes" else None)
print(child.pid, flush=True)
sys.stdin.read()
"""


def _alive(pid: int) -> bool:
    """Running: not gone and not a zombie waiting for a parent that no longer reaps it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


def _orphan(tied: bool, wait_s: float = 30.0) -> tuple[int, bool, float]:
    """Start a parent that starts `sleep`, SIGKILL the parent; (the child's pid, whether it died within
    `wait_s` of the parent's end, the seconds it took or waited)."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, "yes" if tied else "no"], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    assert _alive(pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    t0 = time.monotonic()
    while _alive(pid) and time.monotonic() < t0 + wait_s:
        time.sleep(0.05)
    return pid, not _alive(pid), time.monotonic() - t0


def test_a_killed_bench_takes_its_children_with_it():
    pid, died, took = _orphan(tied=True)
    assert died, f"the bench's child {pid} outlived it"
    # The same child without the tie is still alive well after the tied one was gone: the
    # check above would catch a bench that stopped tying them.
    pid, died, _ = _orphan(tied=False, wait_s=2 * took + 1.0)
    try:
        assert not died
    finally:
        os.kill(pid, signal.SIGKILL)


UNWINDS = """
import pathlib, signal, sys, time
def stop(*_):
    pathlib.Path(sys.argv[1]).write_text("unwound")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(1)
"""

TIED_TO_UNWIND = """
import subprocess, sys
from bench.run_all import _dies_with_parent_sigterm
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], preexec_fn=_dies_with_parent_sigterm,
                         stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "ready\\n"
print(child.pid, flush=True)
sys.stdin.read()
"""


def test_a_killed_bench_lets_a_child_that_unwinds_stop_its_own(tmp_path):
    # bench/boot_cache.py powers its sandboxes off on a SIGTERM; a SIGKILL would leave their trainers on.
    marker = tmp_path / "unwound"
    parent = subprocess.Popen([sys.executable, "-c", TIED_TO_UNWIND, UNWINDS, str(marker)], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    t0 = time.monotonic()
    while _alive(pid) and time.monotonic() < t0 + 30:
        time.sleep(0.05)
    assert not _alive(pid), f"the bench's child {pid} outlived it"
    assert marker.read_text() == "unwound"  # it ran its SIGTERM handler


def test_a_timed_out_child_that_unwinds_gets_a_sigterm_before_the_kill(tmp_path):
    from bench.run_all import QUICK, Bench

    bench = Bench(QUICK, "http://127.0.0.1:9", "bucket")
    try:
        for unwinds in (True, False):
            marker = tmp_path / f"unwound-{unwinds}"
            with pytest.raises(TimeoutError):
                # 8 s: time for the interpreter to start and set its handler on a loaded machine.
                bench.spawn([sys.executable, "-c", UNWINDS, str(marker)], timeout=8, unwinds_on_sigterm=unwinds)
            # Told to stop, it ran its handler; without the flag the timeout kills it outright (the check
            # above would catch a spawn that stopped sending the SIGTERM).
            assert marker.exists() is unwinds
    finally:
        shutil.rmtree(bench.tmp, ignore_errors=True)
