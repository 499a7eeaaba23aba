"""`finish.sh`'s steps, run in bash without a machine: which endings it writes a marker for,
what the marker says, and how long it tries to scale the group to zero.

The real `finish.sh` functions with the store, the events, the logs' upload and the group's
CLI call replaced by shell functions (script_functions.py) on a virtual clock: FAILED and
TIMED_OUT are written here with the run's step and the attempts counted, COMPLETE and
CANCELLED (the trainer's) are not, a run that already has its marker keeps it; the group's
scale-down is retried with doubling pauses for TRAINSTACK_SCALE_WAIT_S, or 30 s when an
earlier machine of the run already failed it, and a failure leaves a `scale_failed` event.
"""

from __future__ import annotations

import json

import pytest

from tests.userdata.script_functions import Ran, run_script

FAKES = """
end_marker() { [[ -z "${MARKER:-}" ]] || echo "$MARKER"; }
store_cat() { [[ "$1" != */progress.json ]] || echo '{"step": 40, "loss": 0.5}'; }
store_put() { record "put ${1##*/} $(cat)"; }
event() { record "event $*"; }
upload_logs() { record logs; }
store_cat_all() { [[ "$1" == */machine-events ]] && printf '%s' "${EARLIER:-}"; }
scale_to_zero() {
  (($(count scale) > ${SCALE_FAILS:-0})) || { echo "Throttling: Rate exceeded" >&2; return 1; }
  record scaled
}
"""


def _finish(tmp_path, *args: str, before: str = "") -> Ran:
    quoted = " ".join(f"'{a}'" for a in args)
    ran = run_script(tmp_path, "finish.sh", FAKES + before + f"\nmain {quoted}\n", timeout=15)
    assert ran.rc == 0, (ran.lines, ran.log[-2000:])
    return ran


def _sleeps(ran: Ran) -> list[int]:
    return [int(line.split()[1]) for line in ran.starting("sleep ")]


@pytest.mark.parametrize("outcome", ["FAILED", "TIMED_OUT"])
def test_failed_and_timed_out_are_written_here_with_the_step_and_attempts(tmp_path, outcome):
    ran = _finish(tmp_path, outcome, "the trainer failed 3 times in a row", "3")
    (put,) = ran.starting("put ")
    name, body = put.split(" ", 2)[1:]
    marker = json.loads(body)
    assert name == outcome
    assert (marker["outcome"], marker["reason"], marker["step"], marker["attempts"], marker["instance"]) == (
        outcome, "the trainer failed 3 times in a row", 40, 3, "i-0fake")
    assert ran.lines[1:] == [f"event finish outcome={outcome} reason=the trainer failed 3 times in a row", "logs",
                             "scaled", "shutdown -h now"]
    assert "could not" not in ran.log


@pytest.mark.parametrize("outcome", ["COMPLETE", "CANCELLED"])
def test_the_trainers_own_endings_are_not_written_again(tmp_path, outcome):
    ran = _finish(tmp_path, outcome)
    assert ran.lines == [f"event finish outcome={outcome} reason=", "logs", "scaled", "shutdown -h now"]


def test_a_run_that_already_has_its_end_marker_keeps_it(tmp_path):
    # Another machine wrote COMPLETE first: this one's FAILED is not written, and that is no error.
    ran = _finish(tmp_path, "FAILED", "a late crash", "1", before="MARKER=COMPLETE")
    assert ran.starting("put ") == [] and ran.lines[-1] == "shutdown -h now"
    assert "run already has its end marker: COMPLETE" in ran.log and "could not write" not in ran.log


def test_a_scale_down_that_fails_for_a_while_is_retried_until_it_passes(tmp_path):
    ran = _finish(tmp_path, "COMPLETE", before="SCALE_FAILS=2")
    assert _sleeps(ran) == [2, 4] and ran.lines[-2:] == ["scaled", "shutdown -h now"]
    assert "could not scale trainstack-g to zero: Throttling: Rate exceeded; retrying in 2s" in ran.log
    assert "group trainstack-g scaled to zero" in ran.log and not ran.starting("event scale_failed")


def test_a_group_that_cannot_be_scaled_is_tried_for_the_bound_then_recorded(tmp_path):
    # Pauses 2 .. 32, then a minute each: the next would end past the 600 s.
    ran = _finish(tmp_path, "COMPLETE", before="SCALE_FAILS=1000")
    assert _sleeps(ran) == [2, 4, 8, 16, 32] + [60] * 8
    assert ran.starting("event scale_failed") == ["event scale_failed reason=Throttling: Rate exceeded earlier:=0"]
    assert ran.lines[-1] == "shutdown -h now"
    assert "could not scale trainstack-g to zero in 600s: Throttling: Rate exceeded; shutting down" in ran.log


def test_scale_down_says_whether_the_group_is_at_zero(tmp_path):
    body = FAKES + 'load_env; SCALE_WAIT_S=5\nfor f in 1000 0; do SCALE_FAILS=$f; rc=0; scale_down || rc=$?; record "rc $rc"; done'
    ran = run_script(tmp_path, "finish.sh", body)
    assert ran.starting("rc ") == ["rc 1", "rc 0"]


def test_after_an_earlier_machine_failed_to_scale_the_group_a_machine_tries_for_30_s(tmp_path):
    earlier = '{"event": "finish", "outcome": "FAILED"}\\n{"event": "scale_failed", "reason": "AccessDenied"}\\n'
    ran = _finish(tmp_path, "FAILED", "x", before=f"SCALE_FAILS=1000 EARLIER=$'{earlier}'")
    assert _sleeps(ran) == [2, 4, 8, 16]
    assert ran.starting("event scale_failed") == ["event scale_failed reason=Throttling: Rate exceeded earlier:=1"]
    assert "1 earlier machine(s) of this run could not scale the group: trying for 30s" in ran.log
