"""The supervisor's decisions after each trainer exit, run in bash without a machine.

`supervise.sh`'s own `main` runs with the trainer's container replaced by a list of attempts
(each a line of bash that ends in the exit code the trainer gave), the store by variables
(`STEP`, the newest committed checkpoint; `MARKER`, the run's end marker) and the clock by a
virtual one (script_functions.py): every pause it takes and what it tells `finish` are read
back exactly. The boot sandbox runs the same paths end to end (test_boot.py); here each rule
is pinned at its edge, in milliseconds: how many failures in a row end a run and with which
count, what resets that count, the lease's growing pause and its bound, a notice's wait, the
deadline, a driver that needs a reboot, and the several-machine exits.
"""

from __future__ import annotations

import shlex

import pytest

from tests.userdata.script_functions import Ran, run_script

# The loop's surroundings: setup done, a deadline far away, the store as two variables.
LOOP = """
cli_first() { :; }
run_bootstrap() { :; }
check_run_folder() { DEADLINE=$((EPOCHSECONDS + ${DEADLINE_IN:-100000})); }
STEP=-1 MARKER="" RUNS=0
newest_committed() { echo "$STEP"; }
end_marker() { [[ -z "$MARKER" ]] || echo "$MARKER"; }
nvidia-smi() { echo "GPU 0: NVIDIA H100 80GB HBM3"; }
run_container() {
  RUNS=$((RUNS + 1))
  record "run $1"
  ((RUNS <= ${#ATTEMPTS[@]})) || { record "no attempt $RUNS"; trap - EXIT; exit 99; }
  EPOCHSECONDS=$((EPOCHSECONDS + 10))
  eval "${ATTEMPTS[RUNS - 1]}"
}
"""
FAIL = "return 1"


def _loop(tmp_path, *attempts: str, env: str = "", before: str = "", joins: tuple[str, ...] = ()) -> Ran:
    # With several machines, join_generation (rendezvous.sh) answers from JOINS, one a call.
    rendezvous = ""
    if joins:
        rendezvous = ("JOINS=(" + " ".join(shlex.quote(j) for j in joins) + ")\nJ=0\n"
                      'join_generation() { J=$((J + 1)); record "join"; '
                      '((J <= ${#JOINS[@]})) || { record "no join $J"; trap - EXIT; exit 98; }; eval "${JOINS[J - 1]}"; }\n')
    body = LOOP + "ATTEMPTS=(" + " ".join(shlex.quote(a) for a in attempts) + ")\n" + before + "\nmain\n"
    ran = run_script(tmp_path, "supervise.sh", body, env=env, rendezvous=rendezvous, timeout=15)
    assert ran.rc == 0, (ran.rc, ran.lines, ran.log[-3000:])
    return ran


def _sleeps(ran: Ran) -> list[int]:
    return [int(line.split()[1]) for line in ran.starting("sleep ")]


# -- failures in a row -------------------------------------------------------------------------


def test_failures_in_a_row_end_the_run_failed_with_their_count_after_growing_pauses(tmp_path):
    ran = _loop(tmp_path, FAIL, FAIL, FAIL)
    assert ran.lines == ["run 100000", "sleep 15", "run 99975", "sleep 30", "run 99935",
                         "finish FAILED the trainer failed 3 times in a row (last exit 1) 3"]
    assert (tmp_path / "root/var/lib/trainstack/failures").read_text() == "3\n"


def test_an_attempt_that_committed_a_newer_checkpoint_starts_the_count_again(tmp_path):
    # The second attempt committed step 5 before it failed: it counts as the first in a row.
    # The third committed nothing newer (still 5): it counts.
    ran = _loop(tmp_path, FAIL, "STEP=5; return 1", FAIL, FAIL, env="TRAINSTACK_MAX_FAILURES=3\n")
    assert _sleeps(ran) == [15, 15, 30]
    assert ran.lines[-1] == "finish FAILED the trainer failed 3 times in a row (last exit 1) 3"
    assert "committed step 5 (from -1) before it failed" in ran.log


def test_failures_counted_by_an_earlier_boot_count_on(tmp_path):
    ran = _loop(tmp_path, FAIL, before='echo 2 >"$STATE_DIR/failures"')
    assert ran.lines == ["run 100000", "finish FAILED the trainer failed 3 times in a row (last exit 1) 3"]


def test_an_exit_0_without_an_end_marker_is_a_failure_and_with_one_the_run_finishes(tmp_path):
    ran = _loop(tmp_path, "return 0", "return 0", "return 0")
    assert _sleeps(ran) == [15, 30]
    assert ran.lines[-1] == "finish FAILED the trainer failed 3 times in a row (last exit 70) 3"
    done = _loop(tmp_path / "marker", FAIL, "MARKER=COMPLETE; return 0")
    assert done.lines == ["run 100000", "sleep 15", "run 99975", "finish COMPLETE"]


def test_a_machine_that_can_never_run_the_run_fails_at_once_with_the_trainers_reason(tmp_path):
    events = '{"event": "started", "reason": "not this"}\\n{"event": "failed", "reason": "1 GPU seen, 8 asked"}'
    ran = _loop(tmp_path, FAIL, "return 78", before=f"store_cat() {{ printf '{events}\\n'; }}")
    assert ran.lines == ["run 100000", "sleep 15", "run 99975",
                         "finish FAILED the trainer cannot run on this machine (exit 78): 1 GPU seen, 8 asked 2"]


# -- a lease another machine holds -------------------------------------------------------------


def test_the_lease_pause_grows_per_try_and_starts_again_after_any_other_exit(tmp_path):
    ran = _loop(tmp_path, "return 77", "return 77", FAIL, "return 77", "MARKER=CANCELLED; return 0",
                env="TRAINSTACK_LEASE_RETRY_S=70\n")
    assert _sleeps(ran) == [70, 140, 15, 70]
    assert ran.lines[-1] == "finish CANCELLED"


def test_a_lease_held_for_the_bound_stands_the_group_down_and_the_pause_is_capped(tmp_path):
    # Each attempt takes 10 s. Pauses 70, 140, 210, 280, then 350 capped at 300: the sixth
    # exit 77 comes 1050 s after the first, exactly the bound.
    ran = _loop(tmp_path, *["return 77"] * 7, env="TRAINSTACK_LEASE_RETRY_S=70\nTRAINSTACK_LEASE_HELD_S=1050\n")
    assert _sleeps(ran) == [70, 140, 210, 280, 300]
    assert ran.lines[-1].startswith("finish CANCELLED another machine held the run's lease for 1050s (6 tries)")
    assert not (tmp_path / "root/var/lib/trainstack/failures").exists()


def test_a_lease_pause_of_more_than_300_s_is_capped(tmp_path):
    ran = _loop(tmp_path, "return 77", "MARKER=CANCELLED; return 0", env="TRAINSTACK_LEASE_RETRY_S=301\n")
    assert _sleeps(ran) == [300]


# -- notices, the deadline, the driver ---------------------------------------------------------


def test_a_stop_for_a_notice_waits_for_the_cloud_and_forgets_the_failures_before_it(tmp_path):
    notice = 'touch "$NOTICE_FILE"; return 143'
    ran = _loop(tmp_path, FAIL, FAIL, notice, FAIL, FAIL, FAIL, env="TRAINSTACK_NOTICE_WAIT_S=900\n")
    assert _sleeps(ran) == [15, 30, 900, 15, 30]
    assert ran.lines[-1] == "finish FAILED the trainer failed 3 times in a row (last exit 1) 3"
    assert "still here 900s after the notice: resuming training" in ran.log


def test_a_single_machines_exit_143_without_a_notice_is_a_failure(tmp_path):
    ran = _loop(tmp_path, "return 143", "return 143", "return 143")
    assert _sleeps(ran) == [15, 30]
    assert ran.lines[-1] == "finish FAILED the trainer failed 3 times in a row (last exit 143) 3"


@pytest.mark.parametrize(("deadline_in", "runs"), [(26, ["run 26", "run 1"]), (25, ["run 25"])])
def test_the_deadline_ends_the_restarts_at_its_second(tmp_path, deadline_in, runs):
    # The first attempt takes 10 s and its pause 15 s: with 25 s to go nothing is left.
    ran = _loop(tmp_path, FAIL, FAIL, before=f"DEADLINE_IN={deadline_in}")
    assert ran.starting("run ") == runs
    assert ran.lines[-1] == "finish TIMED_OUT the run's deadline passed"


def test_a_failed_attempt_with_a_mismatched_driver_reboots_once_and_then_fails(tmp_path):
    mismatch = 'nvidia-smi() { echo "Failed to initialize NVML: Driver/library version mismatch"; return 18; }'
    ran = _loop(tmp_path, FAIL, before=mismatch)
    assert ran.lines == ["run 100000", "shutdown -r now"]
    assert (tmp_path / "root/var/lib/trainstack/driver-rebooted").exists()
    again = _loop(tmp_path, FAIL, before=mismatch)
    assert again.lines[-1].startswith("finish FAILED the NVIDIA driver still fails after a reboot: Failed to ")


def test_the_driver_is_asked_only_after_a_failure_and_only_a_mismatch_reboots(tmp_path):
    asked = 'nvidia-smi() { record "nvidia-smi"; echo "NVIDIA-SMI has failed: no devices"; return 6; }'
    ran = _loop(tmp_path, "return 0", 'touch "$NOTICE_FILE"; return 143', FAIL, "MARKER=COMPLETE; return 0",
                before=asked, env="TRAINSTACK_NOTICE_WAIT_S=60\n")
    assert ran.lines == ["run 100000", "sleep 15", "run 99975", "sleep 60", "run 99905", "nvidia-smi",
                         "sleep 15", "run 99880", "finish COMPLETE"]


# -- several machines --------------------------------------------------------------------------

NODES = "TRAINSTACK_NODES=2\n"


def test_a_single_machine_joins_no_generation(tmp_path):
    ran = _loop(tmp_path, "MARKER=COMPLETE; return 0", joins=("return 0",))
    assert ran.lines == ["run 100000", "finish COMPLETE"]


def test_each_attempt_of_several_machines_joins_a_generation_first(tmp_path):
    # A notice while joining waits for the cloud; no address is this machine's failure (71).
    notice = 'touch "$NOTICE_FILE"; return 1'
    ran = _loop(tmp_path, "MARKER=COMPLETE; return 0", joins=(notice, "return 4", "return 0"),
                env=NODES + "TRAINSTACK_NOTICE_WAIT_S=60\n")
    assert ran.lines == ["join", "sleep 60", "join", "sleep 15", "join", "run 99925", "finish COMPLETE"]
    assert "restarting in 15s" in ran.log and "(failures in a row: 1)" in ran.log


def test_clusters_that_form_without_progress_end_the_run_after_the_idle_bound(tmp_path):
    # 75 (no cluster) and 76 (a peer lost) count; 143 without a notice is stopping with the others.
    ran = _loop(tmp_path, "return 75", "return 143", "return 76", "return 75", joins=("return 0",) * 4,
                env=NODES + "TRAINSTACK_MAX_IDLE_GENERATIONS=3\n")
    assert _sleeps(ran) == []
    assert ran.lines[-1].startswith("finish FAILED the cluster formed 3 generations in a row without progress "
                                    "(last exit 75)")
    assert (tmp_path / "root/var/lib/trainstack/idle-generations").read_text() == "3 -1\n"
    assert not (tmp_path / "root/var/lib/trainstack/failures").exists()


def test_a_generation_that_commits_a_newer_checkpoint_starts_the_idle_count_again(tmp_path):
    ran = _loop(tmp_path, "return 75", "STEP=9; return 76", "return 75", "return 75", "MARKER=COMPLETE; return 0",
                joins=("return 0",) * 5, env=NODES + "TRAINSTACK_MAX_IDLE_GENERATIONS=3\n")
    assert ran.lines[-1] == "finish COMPLETE"
    assert (tmp_path / "root/var/lib/trainstack/idle-generations").read_text() == "2 9\n"


def test_a_failure_of_one_of_several_machines_counts_as_a_failure(tmp_path):
    ran = _loop(tmp_path, FAIL, FAIL, FAIL, joins=("return 0",) * 3, env=NODES)
    assert _sleeps(ran) == [15, 30]
    assert ran.lines[-1] == "finish FAILED the trainer failed 3 times in a row (last exit 1) 3"


def test_a_worker_that_ends_before_the_chief_waits_for_its_end_marker(tmp_path):
    # The chief's COMPLETE comes 25 s after this worker's trainer ended; it polls every 10 s.
    ran = _loop(tmp_path, "MARKER_AT=$((EPOCHSECONDS + 25)); return 0", joins=("return 0",), env=NODES,
                before='end_marker() { ((EPOCHSECONDS < ${MARKER_AT:-2000000})) || echo COMPLETE; }\n'
                       "TRAINSTACK_CLUSTER_POLL_S=10")
    assert _sleeps(ran) == [10, 10, 10]
    assert ran.lines[-1] == "finish COMPLETE"


def test_a_worker_waits_for_the_chiefs_end_marker_for_its_bound_then_counts_a_failure(tmp_path):
    ran = _loop(tmp_path, "return 0", "MARKER=COMPLETE; return 0", joins=("return 0",) * 2, env=NODES,
                before="TRAINSTACK_CLUSTER_POLL_S=10 TRAINSTACK_FINISH_WAIT_S=30")
    assert _sleeps(ran) == [10, 10, 10, 15]
    assert "trainer exited 0 but the run has no end marker" in ran.log
    assert ran.lines[-1] == "finish COMPLETE"


def test_a_sigterm_ends_the_supervisor_with_143_and_no_verdict(tmp_path):
    # systemd stopping the unit (the machine shutting down) while the trainer runs.
    body = LOOP + "ATTEMPTS=('kill -TERM $$; return 1')\nmain\n"
    ran = run_script(tmp_path, "supervise.sh", body, timeout=15)
    assert (ran.rc, ran.lines) == (143, ["run 100000"]), ran.log[-2000:]
