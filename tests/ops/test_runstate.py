"""`ops.runstate.classify`: one table of what a run's folder holds and the state it is in.

Facts are built by hand (no store, no clock): each row is the smallest folder that puts a
run in its state, at a fixed time.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ops import runstate
from ops.runstate import RunFacts, classify
from runfolder import layout

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC).timestamp()
S3 = "s3://bucket/runs/r"
LOCAL = "file:///tmp/runs/r"


def at(seconds_ago: float) -> str:
    """An event time ``seconds_ago`` before NOW, as the trainer writes it."""
    return datetime.fromtimestamp(NOW - seconds_ago, UTC).isoformat()


def ev(name: str, ago: float, **fields) -> dict:
    return {layout.EVENT: name, layout.TIME: at(ago), **fields}


STARTED = ev(layout.STARTED, 7200, attempt=1, config={"steps": 100, "progress_every_seconds": 10})


def progress(ago: float, step: int = 40) -> dict:
    return {"step": step, "total": 100, "loss": 0.5, "examples_per_sec": 64.0, "updated": at(ago)}


CASES = [
    # (id, facts, state, the detail starts with)
    ("nothing written", RunFacts(S3), runstate.NOT_STARTED, "nothing written yet"),
    ("complete", RunFacts(S3, [STARTED], end_marker=layout.COMPLETE, end={layout.MARKER_STEP: 100}),
     layout.COMPLETE, f"model in {S3}/{layout.MODEL_PREFIX}"),
    ("cancelled", RunFacts(S3, [STARTED], end_marker=layout.CANCELLED, end={layout.MARKER_STEP: 50,
                                                                           layout.MARKER_REASON: "budget"}),
     layout.CANCELLED, "stopped on request at step 50 (budget)"),
    ("failed", RunFacts(S3, [STARTED], end_marker=layout.FAILED, end={layout.MARKER_REASON: "crash loop"}),
     layout.FAILED, "crash loop"),
    ("unreadable end marker", RunFacts(S3, [STARTED], end_marker=layout.TIMED_OUT, end={}), layout.TIMED_OUT, ""),
    ("training", RunFacts(S3, [STARTED], progress=progress(5)), runstate.RUNNING, ""),
    ("heartbeat stopped", RunFacts(S3, [STARTED], progress=progress(3600)), runstate.STALLED,
     "no heartbeat for 1h 00m while training"),
    ("local heartbeat stopped", RunFacts(LOCAL, [STARTED], progress=progress(3600)), runstate.STOPPED,
     runstate.RESUME_LOCAL),
    ("preempted", RunFacts(S3, [STARTED, ev(layout.PREEMPTED, 60, step=40)], progress=progress(60)),
     runstate.PREEMPTED, "stopped at step 40; waiting for the group"),
    ("local ctrl-c", RunFacts(LOCAL, [STARTED, ev(layout.PREEMPTED, 60, step=40)], progress=progress(60)),
     runstate.STOPPED, f"{runstate.RESUME_LOCAL} (stopped at step 40)"),
    ("spot notice, still beating", RunFacts(S3, [STARTED], [ev(layout.SPOT_NOTICE, 20)], progress=progress(5)),
     runstate.RUNNING, "spot notice received"),
    ("taken after a notice", RunFacts(S3, [STARTED], [ev(layout.SPOT_NOTICE, 3600)], progress=progress(3500)),
     runstate.PREEMPTED, "the machine was taken after a spot notice"),
    ("attempt failed, retrying", RunFacts(S3, [STARTED, ev(layout.FAILED_EVENT, 30, attempt=1, reason="oom")],
                                          progress=progress(60)),
     runstate.RUNNING, "attempt 1 failed (oom); the machine retries"),
    ("starting, quiet by design", RunFacts(S3, [ev(layout.STARTED, 600, attempt=1)]), runstate.RUNNING,
     "attempt 1 starting"),
    ("starting for too long", RunFacts(S3, [ev(layout.STARTED, 3600, attempt=1)]), runstate.STALLED,
     "no heartbeat for 1h 00m while starting"),
    ("exporting", RunFacts(S3, [STARTED, ev(layout.FINISHED, 600)], progress=progress(600, 100)), runstate.RUNNING,
     "training finished; writing the model"),
    ("waiting for the other machines", RunFacts(
        S3, [STARTED], [ev(layout.WAITING_FOR_MACHINES, 10, came=1, nodes=2, generation=3, since=at(600),
                           until=at(-600))], progress=progress(3600)),
     runstate.PREEMPTED, "waiting for the other machines: 1 of 2"),
    ("a checkpoint only", RunFacts(S3, checkpoint_step=20, checkpoint_marker={"created": at(100)}),
     runstate.RUNNING, ""),
]


@pytest.mark.parametrize(("facts", "state", "detail"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_classify(facts, state, detail):
    st = classify(facts, NOW)
    assert (st.state, st.detail[:len(detail)]) == (state, detail), st.detail
    assert st.final == (state in layout.END_MARKERS)


def test_classify_is_pure_and_reads_the_figures():
    facts = RunFacts(S3, [STARTED, ev(layout.CHECKPOINT, 10, global_batch=32)],
                     progress=progress(5), checkpoint_step=40, checkpoint_marker={"created": at(120)})
    first, again = classify(facts, NOW, events=1), classify(facts, NOW, events=1)
    assert first == again
    assert (first.step, first.total, first.loss, first.progress_age_seconds) == (40, 100, 0.5, 5.0)
    assert first.eta_seconds == round(60 * 32 / 64.0, 1)
    assert first.checkpoint == runstate.Checkpoint(step=40, created=at(120), age_seconds=120.0)
    assert len(first.events) == 1 and "config" not in first.events[0]


@pytest.mark.parametrize("uri", [S3, LOCAL])
@pytest.mark.parametrize("progress_step", [2423, 2800])
def test_a_stopped_run_stands_where_it_stopped_in_its_bar_and_its_words(uri, progress_step):
    # progress.json is a heartbeat (every few seconds); the stop's commit is where the run resumes.
    facts = RunFacts(uri, [STARTED, ev(layout.PREEMPTED, 30, step=2742)], progress={**progress(40, progress_step),
                                                                                      "total": 2814})
    st = classify(facts, NOW)
    assert (st.step, st.total) == (2742, 2814)
    assert "stopped at step 2742" in st.detail


def test_a_stall_is_bounded_below_and_by_the_runs_interval():
    assert runstate.stall_after(60) == 360 and runstate.stall_after(1) == runstate.STALL_MIN_S
