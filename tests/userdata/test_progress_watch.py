"""userdata/progress.sh: a trainer that runs but makes no progress gets its machine replaced, and no other.

The watch's own functions run in bash on the virtual clock (script_functions.py): the store's
progress.json and the data disk's used bytes are timelines the test writes (what each reads at
each second), `docker` and the store's writes are records. Each bound is pinned at its poll: a
hung trainer is stopped after the bound and not before; a start that stages data, a script that
never reports progress and a store that does not answer are not, and an export after the last step
has its own bound; progress that resumes starts the bound again. Then what the machine does after the stop
(`replace_stalled`), and the supervisor's loop handing a stopped trainer to it.
"""

from __future__ import annotations

import json
import shlex

from tests.userdata.script_functions import START, Ran, run_script
from tests.userdata.test_supervise_loop import _loop

NO_ANSWER = "!"


def _doc(step: int, total: int = 1000, attempt: int = 2) -> str:
    return json.dumps({"step": step, "total": total, "loss": 0.5, "attempt": attempt,
                       "updated": f"2026-01-01T00:00:{step % 60:02d}.000Z"})


def _timeline(name: str, points: list[tuple[int, str]]) -> str:
    """A bash function NAME printing, at each virtual second, the value of the latest point at or
    before it (seconds from START); the value NO_ANSWER makes it fail (the store not answering)."""
    branches = "".join(f"elif ((t >= {t})); then v={shlex.quote(v)}; " for t, v in sorted(points, reverse=True))
    return (f"{name}() {{ local t=$((EPOCHSECONDS - {START})) v=''; if false; then :; {branches}fi; "
            f"[[ \"$v\" != {NO_ANSWER} ]] || return 1; printf '%s' \"$v\"; }}\n")


def _watch(tmp_path, docs: list[tuple[int, str]], *, used: list[tuple[int, str]] = ((0, "1000"),),
           end: int = 20_000, env: str = "") -> Ran:
    """progress_watch with progress.json and the disk as timelines, until it stops the trainer, returns,
    or its next pause would pass `end` seconds."""
    body = ('. "$USERDATA/progress.sh"\n' + _timeline("progress_doc", docs) + _timeline("disk_used", list(used))
            + f'docker() {{ record "docker $* at $((EPOCHSECONDS - {START}))"; }}\n'
            + f'progress_pause() {{ ((EPOCHSECONDS - {START} + $1 <= {end})) || {{ record "still watching"; exit 0; }}; '
            + 'EPOCHSECONDS=$((EPOCHSECONDS + $1)); }\n'
            + 'GRACE_S=100\nprogress_watch\n'
            + f'record "returned at $((EPOCHSECONDS - {START}))"\n'
            + '[[ ! -e "$STALLED_FILE" ]] || record "stalled: $(cat "$STALLED_FILE")"\n')
    ran = run_script(tmp_path, None, body, env=env, timeout=30)
    assert ran.rc == 0, (ran.lines, ran.log[-2000:])
    return ran


STOP = "docker stop --time 100 trainstack-trainer at "
# The run trained before (its earlier attempt's progress.json), then this attempt trains from 300 s.
TRAINS = [(0, _doc(100, attempt=1)), (300, _doc(110)), (360, _doc(120))]


# -- training ----------------------------------------------------------------------------------


def test_a_trainer_without_progress_is_stopped_at_the_bound_and_not_before(tmp_path):
    # The last change is seen at the 360 s poll: the 30-minute bound ends at the 2160 s poll.
    ran = _watch(tmp_path, TRAINS)
    assert ran.lines == [STOP + "2160", "returned at 2160",
                         "stalled: the trainer made no progress for 1800s after step 120"]
    assert "the trainer makes progress (step 110)" in ran.log
    before = _watch(tmp_path / "before", TRAINS, end=2159)
    assert before.lines == ["still watching"]


def test_progress_that_resumes_starts_the_bound_again(tmp_path):
    # Quiet for 25 minutes (an evaluation pass), then a step: the bound counts from there.
    ran = _watch(tmp_path, [*TRAINS, (1860, _doc(130))])
    assert ran.lines[0] == STOP + "3660"
    assert ran.lines[-1] == "stalled: the trainer made no progress for 1800s after step 130"


def test_the_bound_is_the_setting(tmp_path):
    ran = _watch(tmp_path, TRAINS, env="TRAINSTACK_STALL_S=600\nTRAINSTACK_STALL_POLL_S=30\n")
    assert ran.lines[0] == STOP + "960"


def test_a_store_that_does_not_answer_is_no_verdict(tmp_path):
    # The trainer's writes and the watch's reads fail alike for 40 minutes: the bound starts again
    # at the last poll the store did not answer (2940 s), not from the last step seen.
    ran = _watch(tmp_path, [*TRAINS, (600, NO_ANSWER), (2941, _doc(120))])
    assert ran.lines[0] == STOP + "4740"
    assert ran.log.count("the store does not answer") == 40


def test_after_the_last_step_the_export_has_its_own_bound_and_writing_to_the_disk_is_progress(tmp_path):
    # Step 1000 of 1000 at 600 s: the final evaluation, commit and export. Two hours of writes to the
    # disk, then nothing (a hung collective in the final evaluation): stopped 2 hours after the last write.
    done = [*TRAINS, (600, _doc(1000))]
    used = [(t, str(1000 + t)) for t in range(600, 7801, 60)]
    ran = _watch(tmp_path, done, used=[(0, "1000"), *used], end=40_000)
    assert ran.lines[0] == STOP + str(7800 + 7200)
    assert ran.lines[-1] == ("stalled: the trainer made no progress for 7200s after its last step (1000: the final "
                             "evaluation, commit or export), nothing written to the data disk")
    assert "reached its last step (1000)" in ran.log
    # Silent from its last step: the training bound (30 minutes) does not apply, the end's does.
    silent = _watch(tmp_path / "silent", done, end=40_000)
    assert silent.lines[0] == STOP + str(600 + 7200)
    assert _watch(tmp_path / "before", done, end=600 + 7199).lines == ["still watching"]


# -- starting ----------------------------------------------------------------------------------


def test_a_start_that_never_reaches_its_first_step_is_stopped_after_the_start_bound(tmp_path):
    # The earlier attempt's progress.json is no progress of this one; nothing lands on the disk.
    ran = _watch(tmp_path, [(0, _doc(100, attempt=1))])
    assert ran.lines[0] == STOP + "3600"
    assert ran.lines[-1] == ("stalled: the trainer showed no progress for 3600s after it started "
                             "(no progress.json of its own, nothing written to the data disk)")
    assert _watch(tmp_path / "before", [(0, "")], end=3599).lines == ["still watching"]


def test_a_start_that_stages_data_for_longer_than_the_bound_is_not_stopped(tmp_path):
    # A resume with no index waits for every file: two hours of staging, the disk filling every poll,
    # no progress.json yet; then nothing moves (the trainer hung before its first step).
    used = [(t, str(1000 + t)) for t in range(0, 7201, 60)]
    ran = _watch(tmp_path, [(0, "")], used=used)
    assert ran.lines[0] == STOP + str(7200 + 3600)


def test_a_script_that_never_reports_progress_is_never_stopped(tmp_path):
    # Script mode: a command without fit.callbacks() writes no progress.json; ten hours of silence.
    script = "TRAINSTACK_COMMAND='[\"python\", \"train.py\"]'\n"
    ran = _watch(tmp_path, [(0, "")], end=36_000, env=script)
    assert ran.lines == ["still watching"]
    # Nor what it does after its last epoch (its own export, predictions): its own.
    after = _watch(tmp_path / "after", [(0, ""), (120, _doc(1000))], end=36_000, env=script)
    assert after.lines == ["still watching"]
    # Once it reports, the training bound holds for it too, whether or not it knows its total.
    reports = _watch(tmp_path / "reports", [(0, ""), (120, _doc(5))], env=script)
    assert reports.lines[0] == STOP + str(120 + 1800)
    unknown = _watch(tmp_path / "unknown", [(0, ""), (120, _doc(5, total=0))], env=script)
    assert unknown.lines[0] == STOP + str(120 + 1800)


def test_a_store_that_does_not_answer_at_the_start_sets_no_progress(tmp_path):
    # The first answer (at 300 s) is the earlier attempt's document: what this attempt's progress
    # will change, not progress itself.
    ran = _watch(tmp_path, [(0, NO_ANSWER), (300, _doc(100, attempt=1))])
    assert ran.lines[0] == STOP + str(240 + 3600)


def test_progress_doc_tells_an_absent_progress_file_from_a_store_that_does_not_answer(tmp_path):
    body = ('. "$USERDATA/progress.sh"\n'
            'store_cat() { [[ -n "${DOC:-}" ]] || return 1; printf "%s\\n" "$DOC"; }\n'
            'run_entries() { [[ "${LS:-}" != fail ]] || return 1; printf "%s\\n" "${LS:-}"; }\n'
            'for case in "DOC=a" "LS=checkpoints/" "LS=fail" "LS=$PROGRESS_KEY"; do\n'
            '  (eval "$case"; out="$(progress_doc)" && record "$case: [$out]" || record "$case: no answer")\n'
            'done\n')
    ran = run_script(tmp_path, None, body)
    assert ran.lines == ["DOC=a: [a]", "LS=checkpoints/: []", "LS=fail: no answer", "LS=progress.json: no answer"]


# -- after the stop ------------------------------------------------------------------------------


def _stalled(other: str, s: str) -> str:
    """One machine-events line of another machine's stall."""
    return json.dumps({"event": "stalled", "time": "2026-01-01T00:00:00.000Z", "instance": other, **json.loads(s)})


def _replace(tmp_path, earlier: list[str], *, env: str = "", generation: str = "") -> Ran:
    body = ('. "$USERDATA/rendezvous.sh"\n. "$USERDATA/progress.sh"\n'
            'MAX_FAILURES="${TRAINSTACK_MAX_FAILURES:-3}"\n'
            'newest_committed() { echo 500; }\n'
            'event() { record "event $*"; }\n'
            'store_cp_dir() { record "logs to $2"; }\n'
            f'store_cat_all() {{ printf "%s\\n" {" ".join(shlex.quote(e) for e in earlier)}; }}\n'
            + (f'echo {generation} >"$LAST_GENERATION_FILE"\n' if generation else "")
            + 'echo "the trainer made no progress for 1800s after step 520" >"$STALLED_FILE"\n'
            'replace_stalled\nrecord "not reached"\n')
    ran = run_script(tmp_path, None, body, env=env)
    assert ran.rc == 0, (ran.lines, ran.log[-2000:])
    return ran


REASON = "the trainer made no progress for 1800s after step 520"


def test_a_stalled_machine_records_why_uploads_its_logs_and_shuts_down_for_a_fresh_one(tmp_path):
    ran = _replace(tmp_path, [])
    assert ran.lines == [f"event stalled reason={REASON} committed:=500 key=i-0fake",
                         "logs to s3://bucket/runs/r1/logs/i-0fake/", "shutdown -h now"]
    assert "(1/3 in a row): shutting down so that the group brings a fresh machine" in ran.log


def test_the_third_stall_in_a_row_without_a_newer_checkpoint_fails_the_run(tmp_path):
    earlier = [_stalled("i-1", '{"committed": 500, "key": "i-1"}'), _stalled("i-2", '{"committed": 500, "key": "i-2"}')]
    ran = _replace(tmp_path, earlier)
    assert ran.lines[-1] == (f"finish FAILED {REASON}; 3 machines in a row made no progress "
                             "(newest checkpoint: step 500) 3")
    # Stalls before the newest checkpoint are not in a row with this one.
    older = _replace(tmp_path / "older", [_stalled("i-1", '{"committed": 400, "key": "i-1"}'), earlier[1]])
    assert older.lines[-1] == "shutdown -h now"
    assert "(2/3 in a row)" in older.log


def test_machines_of_one_generation_stalling_together_are_one_stall(tmp_path):
    # Both machines of generation 7 stop together (the collective waits for all): one stall, not two.
    same = [_stalled("i-1", '{"committed": 500, "key": "generation-7"}')]
    ran = _replace(tmp_path, same, env="TRAINSTACK_NODES=2\n", generation="7")
    assert ran.lines[0].endswith("key=generation-7") and ran.lines[-1] == "shutdown -h now"
    assert "(1/3 in a row)" in ran.log
    older = [*same, _stalled("i-3", '{"committed": 500, "key": "generation-5"}'),
             _stalled("i-4", '{"committed": 500, "key": "generation-6"}')]
    assert _replace(tmp_path / "third", older, env="TRAINSTACK_NODES=3\n", generation="7").lines[-1].startswith(
        "finish FAILED")


# -- the supervisor's loop -------------------------------------------------------------------------

STOPPED = 'echo "the trainer made no progress for 1800s after step 520" >"$STALLED_FILE"; return 137'
# What replace_stalled did, defined inside the attempt: main sources the real one before the loop.
AFTER = 'replace_stalled() { record "replace: $(cat "$STALLED_FILE")"; trap - EXIT; exit 0; }; '


def test_a_trainer_stopped_for_a_stall_replaces_the_machine_instead_of_counting_a_failure(tmp_path):
    ran = _loop(tmp_path, AFTER + STOPPED)
    assert ran.lines == ["run 100000", f"replace: {REASON}"]
    # A run that ended meanwhile finishes with its marker.
    ended = _loop(tmp_path / "ended", AFTER + "MARKER=COMPLETE; " + STOPPED)
    assert ended.lines == ["run 100000", "finish COMPLETE"]


# -- beside the container ----------------------------------------------------------------------------

# run_container with real time: `docker run` holds until `docker stop` (or returns at once with
# RETURNS=1), each poll of the watch is 50 ms and says "stalled" from its POLLS-th on.
BESIDE = """
unset -f sleep
. "$USERDATA/progress.sh"
docker() {
  case "$1" in
    run) record "docker run"; [[ -z "${RETURNS:-}" ]] || return 0
         for _ in {1..200}; do [[ ! -e "$OUT.stopped" ]] || return 137; command sleep 0.05; done; return 99 ;;
    stop) record "docker $*"; touch "$OUT.stopped" ;;
    *) : ;;
  esac
}
progress_doc() { :; }
progress_pause() { command sleep 0.05 & wait $!; }
progress_poll() { (($(count poll) < POLLS)) || { P_REASON="no progress"; return 1; }; }
CODE_DIR="" PIP_DIR="" GRACE_S=100 DATA_DIR="$TRAINSTACK_ROOT/data"
mkdir -p "$RUNTIME_DIR"
: >"$CONTAINER_ENV"
rc=0; run_container 100 || rc=$?
record "rc $rc"
command sleep "${AFTER_S:-0}"
[[ ! -e "$STALLED_FILE" ]] || record "stalled: $(cat "$STALLED_FILE")"
"""


def test_the_watch_runs_beside_the_trainer_and_stops_it_on_a_stall(tmp_path):
    ran = run_script(tmp_path, "supervise.sh", "POLLS=3\n" + BESIDE)
    assert ran.lines == ["docker run", "docker stop --time 100 trainstack-trainer", "rc 137", "stalled: no progress"]


def test_the_watch_ends_with_the_trainer(tmp_path):
    # The trainer ends at once; the watch would have said "stalled" at its 4th poll (200 ms later).
    ran = run_script(tmp_path, "supervise.sh", "POLLS=4 RETURNS=1 AFTER_S=0.5\n" + BESIDE)
    assert ran.lines == ["docker run", "rc 0"]


def test_the_disk_that_counts_is_the_trainers_own_folders(tmp_path):
    # Staging and the work folder count; the packages beside them and the machine's logs do not.
    body = ('. "$USERDATA/progress.sh"\n'
            'DATA_DIR="$TRAINSTACK_ROOT/data"; mkdir -p "$DATA_DIR/stage" "$DATA_DIR/work" "$DATA_DIR/pip"\n'
            'a=$(disk_used); head -c 5000 /dev/zero >"$DATA_DIR/stage/part-0"; b=$(disk_used)\n'
            'head -c 7000 /dev/zero >"$DATA_DIR/work/model.keras"; c=$(disk_used)\n'
            'head -c 9000 /dev/zero >"$DATA_DIR/pip/wheel"; head -c 9000 /dev/zero >"$LOG_DIR/trainstack.log"\n'
            'record "grew $((b - a)) $((c - b)) then $(($(disk_used) - c))"\n')
    ran = run_script(tmp_path, None, body)
    assert ran.lines == ["grew 5000 7000 then 0"]
