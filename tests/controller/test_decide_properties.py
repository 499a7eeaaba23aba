"""Properties of the controller's decision over any record, run and group (hypothesis, `ci` profile)."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from controller.config import parse
from controller.decide import (
    FINISH,
    HUNG_S,
    MOVE,
    REPLACE,
    STAY,
    GroupState,
    LaunchFailure,
    RunView,
    candidates,
    decide,
)
from controller.record import Record, iso

NOW = 1_800_000_000.0
MESSAGES = ("We currently do not have sufficient g5.xlarge capacity. Launching EC2 instance failed.",
            "QUOTA_EXCEEDED: Quota 'NVIDIA_L4_GPUS' exceeded.", "The image id '[ami-1]' does not exist.")


def _config(n: int, wait: int, nodes: int = 1):
    return parse({"run_uri": "s3://b/runs/r", "nodes": nodes, "wait_minutes": wait, "placements": [
        {"cloud": "aws", "region": f"r-{i}", "group": f"g{i}"} for i in range(n)]})


ages = st.one_of(st.none(), st.floats(min_value=0, max_value=6 * 3600))


MOVED: list[int] = []


@given(n=st.integers(2, 5), wait=st.integers(1, 60), active=st.integers(0, 4),
       failed_at=st.dictionaries(st.sampled_from("01234"), st.floats(min_value=NOW - 10 * 3600, max_value=NOW),
                                 max_size=5),
       heartbeat=ages, since=ages, ended=st.sampled_from([None, "COMPLETE", "FAILED"]), running=st.integers(0, 4),
       nodes=st.integers(1, 3), failures=st.lists(st.tuples(ages, st.sampled_from(MESSAGES)), max_size=4))
@example(n=3, wait=15, active=0, failed_at={"1": NOW - 60}, heartbeat=16 * 60.0, since=None, ended=None,
         running=0, nodes=1, failures=[(60.0, MESSAGES[0])]).via("a move, to the placement that did not fail")
@example(n=2, wait=15, active=1, failed_at={}, heartbeat=16 * 60.0, since=None, ended=None,
         running=2, nodes=3, failures=[(60.0, MESSAGES[1])]).via("two of three machines: a move")
def test_a_move_goes_somewhere_allowed_and_only_after_the_wait(n, wait, active, failed_at, heartbeat, since, ended,
                                                               running, nodes, failures):
    config = _config(n, wait, nodes)
    active %= n
    failed_at = {k: v for k, v in failed_at.items() if int(k) < n}
    rec = Record(active=active, since=None if since is None else iso(NOW - since), failed_at=failed_at)
    beat = None if heartbeat is None else NOW - heartbeat
    run = RunView(ended=ended, heartbeat=beat, progress_at=beat)  # progress.json: a heartbeat, and progress
    group = GroupState(running, nodes, tuple(LaunchFailure(None if a is None else NOW - a, m) for a, m in failures))

    d = decide(config, rec, run, group, NOW)

    if ended:
        assert d.action == FINISH
    elif running >= nodes:  # all the run's machines: it stays, or replaces them once they made no progress for long
        signs = [t for t in (run.progress_at, None if since is None else NOW - since,
                             *(f.time for f in group.failures)) if t is not None]
        quiet = bool(signs) and NOW - max(signs) >= HUNG_S
        assert (d.action, f"{running} machine(s) running" in d.reason) == ((REPLACE, True) if quiet else (STAY, True))
    if d.action != MOVE:
        return
    assert d.to != active and 0 <= d.to < n
    assert str(d.to) not in failed_at or NOW - failed_at[str(d.to)] >= 2 * config.wait_s
    assert d.to == candidates(config, rec, NOW)[0]
    assert running < config.nodes and ended is None
    signs = [t for t in (run.heartbeat, None if since is None else NOW - since) if t is not None]
    if signs:
        assert NOW - max(signs) >= config.wait_s - 0.01  # no sign of a machine for the whole wait
    assert any(f.kind != "other" for f in group.failures)
    MOVED.append(d.to)


def test_the_property_checks_moves():
    # The property's move branch runs (at least on its explicit example), whichever worker runs this.
    MOVED.clear()
    test_a_move_goes_somewhere_allowed_and_only_after_the_wait()
    assert 2 in MOVED and 0 in MOVED
