"""lib.sh's one retry loop: `retry_for SECONDS` and `retry ATTEMPTS`, run in bash with a counting command.

No sandbox machine: the library is sourced with its log folder in a temporary root, and the
pauses start at TRAINSTACK_RETRY_BASE_S. The clock is virtual, as in `script_functions.py`:
`EPOCHSECONDS` is a plain variable that `sleep N` moves by N (and writes to the `sleeps` file), so
a loop bounded in seconds gives the same verdict on a loaded machine as on a quiet one (with the
real clock, a second boundary crossed between two reads ended a 3 s loop after two runs).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[2] / "userdata" / "lib.sh"

# A command that fails until its FAILS-th run has passed, counting its runs in a file.
SCRIPT = """
set -euo pipefail
. "$LIB"
unset EPOCHSECONDS
EPOCHSECONDS=1000000
sleep() { echo "$1" >>"$ROOT/sleeps"; EPOCHSECONDS=$((EPOCHSECONDS + $1)); }
flaky() {
  local n; n=$(( $(cat "$ROOT/runs" 2>/dev/null || echo 0) + 1 )); echo "$n" >"$ROOT/runs"
  ((n > FAILS)) && return 0
  [[ -z "${SAYS:-}" ]] || RETRY_SAYS="$SAYS $n"
  return 1
}
if "$@"; then echo "rc=0"; else echo "rc=$?"; fi
echo "runs=$(cat "$ROOT/runs")"
echo "slept=$(paste -sd, "$ROOT/sleeps" 2>/dev/null || true)"
echo "clock=$((EPOCHSECONDS - 1000000))"
"""


def _run(tmp_path: Path, fails: int, *call: str, base: str = "0", says: str = "") -> tuple[dict, str]:
    env = {"PATH": "/usr/bin:/bin", "TRAINSTACK_ROOT": str(tmp_path), "ROOT": str(tmp_path), "LIB": str(LIB),
           "FAILS": str(fails), "TRAINSTACK_RETRY_BASE_S": base, "SAYS": says}
    done = subprocess.run(["bash", "-c", SCRIPT, "-", *call], env=env, capture_output=True, text=True, timeout=60)
    found = dict(line.split("=", 1) for line in done.stdout.split())
    return found, done.stderr


@pytest.mark.parametrize(("fails", "rc", "runs"), [(0, "0", "1"), (2, "0", "3"), (5, "1", "3")])
def test_retry_runs_the_command_at_most_its_attempts(tmp_path, fails, rc, runs):
    found, err = _run(tmp_path, fails, "retry", "3", "flaky", "arg")
    assert (found["rc"], found["runs"]) == (rc, runs), err
    assert found["slept"] == ",".join(["0"] * (int(runs) - 1 if rc == "0" else 2)), found
    if rc == "1":
        assert "attempt 2/3 failed: flaky arg; retrying in 0s" in err and "gave up after 3 attempts: flaky arg" in err


def test_retry_for_keeps_trying_for_its_seconds_with_the_pause_doubling(tmp_path):
    # Pauses of 1 s, then 2 s: a third would end past the 3 s, so it gives up after three runs.
    found, err = _run(tmp_path, 10, "retry_for", "3", "flaky", base="1")
    assert (found["rc"], found["runs"]) == ("1", "3"), err
    assert "retrying in 1s" in err and "retrying in 2s" in err and "gave up after 3s: flaky" in err
    assert (found["slept"], found["clock"]) == ("1,2", "3"), found  # slept for its pauses, and no more


@pytest.mark.parametrize(("seconds", "runs", "slept"), [("2", "2", "1"), ("7", "4", "1,2,4"), ("200", "9", "1,2,4,8,16,32,60,60")])
def test_retry_for_never_sleeps_past_its_seconds_and_caps_the_pause_at_a_minute(tmp_path, seconds, runs, slept):
    found, err = _run(tmp_path, 100, "retry_for", seconds, "flaky", base="1")
    assert (found["rc"], found["runs"], found["slept"]) == ("1", runs, slept), err
    assert int(found["clock"]) <= int(seconds) and f"gave up after {seconds}s: flaky" in err


def test_retry_for_says_the_commands_own_failure_and_stops_once_it_passes(tmp_path):
    found, err = _run(tmp_path, 4, "retry_for", "30", "flaky", says="throttled, run")
    assert (found["rc"], found["runs"]) == ("0", "5"), err
    assert "throttled, run 4; retrying in 0s" in err and "gave up" not in err

