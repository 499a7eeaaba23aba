"""The supervisor's steps before the trainer runs, each run in bash on a virtual clock.

`supervise.sh`'s own functions with the store, the CLIs and `finish` replaced by shell
functions (script_functions.py): reading the run folder and its deadline (`check_run_folder`,
waiting out a store that does not answer with lib.sh's `retry_for`), setting the machine up
(`run_bootstrap`, retried for a passing reason within its bounds), having a cloud CLI
(`cli_first`) and the container's arguments on a machine whose store is the other cloud's
(`run_container`). Each bound is pinned at its second; the boot sandbox runs them end to end.
"""

from __future__ import annotations

from tests.userdata.script_functions import START, Ran, run_script


def _sleeps(ran: Ran) -> list[int]:
    return [int(line.split()[1]) for line in ran.starting("sleep ")]


# -- the run folder at boot ----------------------------------------------------------------------

# The store as the test's variables: LS_FAILS listings fail first, then ENTRIES is the listing;
# CAT_FAILS reads of the deadline fail, then it reads DEADLINE_TEXT.
STORE = """
run_entries() { (($(count ls) > ${LS_FAILS:-0})) || return 1; printf '%s\\n' "${ENTRIES:-}"; }
store_cat() { (($(count cat) > ${CAT_FAILS:-0})) || return 1; printf '%s\\n' "$DEADLINE_TEXT"; }
store_put() { record "put $1 $(cat)"; }
"""


def _check(tmp_path, body: str, env: str = "") -> Ran:
    ran = run_script(tmp_path, "supervise.sh", STORE + body + '\ncheck_run_folder\nrecord "deadline $DEADLINE"\n',
                     env=env, timeout=15)
    assert ran.rc == 0, (ran.lines, ran.log[-2000:])
    return ran


def test_a_first_boot_writes_the_deadline_from_its_runtime(tmp_path):
    ran = _check(tmp_path, "", env="TRAINSTACK_MAX_RUNTIME_S=3600\n")
    deadline = START + 3600
    assert ran.lines == [f"put s3://bucket/runs/r1/deadline {deadline}", f"deadline {deadline}"]


def test_a_later_boot_reads_the_deadline_and_one_that_has_passed_times_out(tmp_path):
    ran = _check(tmp_path, f"ENTRIES=$'checkpoints/\\ndeadline' DEADLINE_TEXT={START + 1}")
    assert ran.lines == [f"deadline {START + 1}"]
    now = _check(tmp_path / "now", f"ENTRIES=deadline DEADLINE_TEXT={START}")
    assert now.lines == ["finish TIMED_OUT the run's deadline passed"]


def test_a_run_that_has_ended_finishes_at_once(tmp_path):
    ran = _check(tmp_path, "ENTRIES=$'deadline\\nCOMPLETE' DEADLINE_TEXT=5")
    assert ran.lines == ["finish COMPLETE"]


def test_a_store_that_does_not_answer_is_waited_out_with_doubling_pauses(tmp_path):
    # Three listings and two deadline reads fail: pauses 2, 4, 8 (capped at 60 further on), then 2, 4.
    ran = _check(tmp_path, f"LS_FAILS=3 CAT_FAILS=2 ENTRIES=deadline DEADLINE_TEXT={START + 999}")
    assert _sleeps(ran) == [2, 4, 8, 2, 4]
    assert ran.lines[-1] == f"deadline {START + 999}"


def test_the_store_reads_double_their_pause_up_to_a_minute(tmp_path):
    # supervise.sh waits out the store through lib.sh's retry_for: 2 s doubling, capped at 60.
    ran = _check(tmp_path, "LS_FAILS=7 ENTRIES=COMPLETE", env="TRAINSTACK_STORE_WAIT_S=100000\n")
    assert _sleeps(ran) == [2, 4, 8, 16, 32, 60, 60]
    # From 25 s: 50, then the minute.
    late = run_script(tmp_path / "late", "supervise.sh", STORE + "LS_FAILS=3 ENTRIES=COMPLETE\ncheck_run_folder",
                      extra_env={"TRAINSTACK_RETRY_BASE_S": "25"})
    assert _sleeps(late) == [25, 50, 60]


def test_a_store_unreadable_past_its_bound_ends_the_run(tmp_path):
    # Pauses 2 and 4 end at the bound (6 s); a third would pass it.
    ran = _check(tmp_path, "LS_FAILS=100", env="TRAINSTACK_STORE_WAIT_S=6\n")
    assert _sleeps(ran) == [2, 4]
    assert ran.lines[-1] == ("finish FAILED cannot read the run folder s3://bucket/runs/r1: no answer for 6s "
                             "(see logs)")
    deadline = _check(tmp_path / "deadline", "ENTRIES=deadline CAT_FAILS=100", env="TRAINSTACK_STORE_WAIT_S=6\n")
    assert deadline.lines[-1] == "finish FAILED cannot read the run's deadline: no answer for 6s (see logs)"


# -- setting the machine up ----------------------------------------------------------------------

BOOT = """
check_run_folder() { DEADLINE=$((EPOCHSECONDS + ${DEADLINE_IN:-100000})); }
boot_scripts() { record boot_scripts; EPOCHSECONDS=$((EPOCHSECONDS + ${BOOT_S:-0})); }
BOOTSTRAP_BACKOFF_S=${BACKOFF:-15}
"""


def _bootstrap(tmp_path, before: str, bootstrap: str = "exit 1", env: str = "") -> Ran:
    script = tmp_path / "root/opt/trainstack/bin/bootstrap.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"#!/bin/bash\n{bootstrap}\n")
    script.chmod(0o755)
    ran = run_script(tmp_path, "supervise.sh", before + BOOT + "\ncheck_run_folder\nrun_bootstrap\nrecord done\n",
                     env=env, timeout=15)
    assert ran.rc == 0, (ran.lines, ran.log[-2000:])
    return ran


def test_bootstrap_failing_for_a_passing_reason_is_retried_for_its_bound(tmp_path):
    # Pauses of 301 s capped at 300: the twelfth failure, at 3300 s, leaves no 300 s in the hour.
    ran = _bootstrap(tmp_path, "BACKOFF=301")
    assert _sleeps(ran) == [300] * 11
    assert ran.lines[-1] == ("finish FAILED could not set up the machine in 3600s (bootstrap failed 12 times for a "
                             "passing reason; see logs)")


def test_bootstrap_pauses_grow_with_its_failures(tmp_path):
    ran = _bootstrap(tmp_path, "BACKOFF=10", bootstrap='n=$(cat "$0.n" 2>/dev/null || echo 0); echo $((n + 1)) >"$0.n"; '
                                                      '((n >= 3))')
    assert _sleeps(ran) == [10, 20, 30] and ran.lines[-1] == "done"


def test_bootstrap_retries_end_at_the_runs_deadline(tmp_path):
    ran = _bootstrap(tmp_path, "BACKOFF=301 DEADLINE_IN=600")
    assert _sleeps(ran) == [300]
    assert ran.lines[-1] == ("finish TIMED_OUT the run's deadline passed while setting up the machine (bootstrap "
                             "failed 2 times; see logs)")


def test_a_bootstrap_that_hangs_is_cut_at_its_bound(tmp_path):
    # An image pull that never ends: the try is stopped when the set-up's bound (2 s, real time here) is
    # spent, and no pause is left in it.
    ran = _bootstrap(tmp_path, "", bootstrap="sleep 60", env="TRAINSTACK_BOOTSTRAP_WAIT_S=2\n")
    assert ran.lines == ["boot_scripts", "finish FAILED could not set up the machine in 2s (bootstrap failed 1 times "
                         "for a passing reason; see logs)"]
    # Fetching the boot scripts took the whole hour (timeout 0 would be no bound at all): a 1 s try.
    spent = _bootstrap(tmp_path / "spent", "BOOT_S=3600", bootstrap="sleep 60")
    assert spent.lines[-1].startswith("finish FAILED could not set up the machine in 3600s")


def test_a_bootstrap_failure_with_a_reason_ends_the_run_at_once(tmp_path):
    ran = _bootstrap(tmp_path, "", bootstrap='echo "no GPU: nvidia-smi sees none" >"$TRAINSTACK_ROOT/run/trainstack/failure-reason"; exit 1')
    assert ran.lines == ["boot_scripts", "finish FAILED no GPU: nvidia-smi sees none"]


# -- a cloud CLI first ---------------------------------------------------------------------------


def _cli(tmp_path, body: str, env: str = "") -> Ran:
    return run_script(tmp_path, "supervise.sh", body + "\ntrap 'on_exit $?' EXIT\ncli_first\nrecord done\n",
                      env=env, timeout=15)


def test_no_cli_within_its_wait_shuts_the_machine_down_without_a_verdict(tmp_path):
    # An install that takes 271 s leaves 29 s of the 300: less than a 30 s pause, so it stops.
    ran = _cli(tmp_path, 'cloud_cli() { record try; EPOCHSECONDS=$((EPOCHSECONDS + 271)); return 1; }')
    assert (ran.rc, ran.lines) == (0, ["try", "shutdown -h now"])
    assert "error: no aws CLI on this image and none could be installed" in ran.log
    tries = _cli(tmp_path / "quick", 'cloud_cli() { record try; return 1; }')
    assert tries.lines == ["try", "sleep 30"] * 10 + ["try", "shutdown -h now"]


def test_a_machine_whose_store_is_the_other_clouds_names_both_clis(tmp_path):
    ran = _cli(tmp_path, 'cloud_cli() { return 1; }\nTRAINSTACK_CLOUD=gcp STORE_CLOUD=aws')
    assert "error: no gcp or aws CLI on this image" in ran.log


def test_a_cli_that_comes_within_the_wait_goes_on(tmp_path):
    ran = _cli(tmp_path, 'N=0; cloud_cli() { N=$((N + 1)); ((N > 2)); }')
    assert (ran.rc, ran.lines) == (0, ["sleep 30", "sleep 30", "done"])


# -- the container -------------------------------------------------------------------------------

# The watchdog's real `sleep` outlives it when the kill comes before its trap is set (a loaded
# machine): 3 s, so that orphan holds the output pipes for moments, not the test's timeout.
CONTAINER = """
unset -f sleep
docker() { record "docker $*"; }
CODE_DIR="" PIP_DIR="" GRACE_S=100 DATA_DIR="$TRAINSTACK_ROOT/data"
mkdir -p "$RUNTIME_DIR"
: >"$CONTAINER_ENV"
rc=0; run_container 3 || rc=$?
record "rc $rc"
"""


def test_a_machine_whose_store_is_the_other_clouds_gives_the_container_its_token_folder(tmp_path):
    cross = run_script(tmp_path, "supervise.sh", "TRAINSTACK_CLOUD=gcp STORE_CLOUD=aws\n"
                       "federation_token() { record token; }\n"
                       "FEDERATION_CONTAINER_ARGS=(-v /run/fed:/run/fed:ro -e TOKEN=/run/fed/t)\n" + CONTAINER)
    (run,) = [line for line in cross.lines if line.startswith("docker run ")]
    assert "token" in cross.lines and run.endswith(
        "-v /run/fed:/run/fed:ro -e TOKEN=/run/fed/t tensorflow/tensorflow:2.21.0-gpu python -m trainer")
    same = run_script(tmp_path / "same", "supervise.sh", "federation_token() { record token; }\n"
                      "FEDERATION_CONTAINER_ARGS=(-v /run/fed:/run/fed:ro)\n" + CONTAINER)
    (run,) = [line for line in same.lines if line.startswith("docker run ")]
    assert "/run/fed" not in run and "token" not in same.lines and same.lines[-1] == "rc 0"
