"""Every ending of a run that had several attempts counts them all.

A run's end marker speaks for the whole run, not for the attempt that wrote it: `COMPLETE`'s
`total_seconds` runs from the first attempt's start, `attempts` counts every `started`, and the
time lost to preemption sums every gap. The attempts here differ on purpose (gaps and lengths
of their own), so a figure taken from the wrong attempt cannot match by chance. The endings
through the CLI run a user's command in script mode (no TensorFlow) after earlier attempts'
events written as the trainer writes them, dated in the past.
"""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runfolder import layout
from runfolder.events import seconds_lost
from tests.trainer.helpers import Trainer, kinds, run_trainer, store_events, trainer_env
from trainer.export import complete_record

T0 = 1_790_000_000.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def _history(spans: list[tuple[float, float]]) -> list[dict]:
    """Attempts that started and were preempted at the given (start, end) times, each resumed after the first."""
    out = []
    for n, (start, end) in enumerate(spans, 1):
        out.append({layout.EVENT: layout.STARTED, layout.TIME: _iso(start), layout.ATTEMPT: n, "workers": 1,
                    "config": {"steps": 10}})
        if n > 1:
            out.append({layout.EVENT: layout.RESUMED, layout.TIME: _iso(start + 1), layout.ATTEMPT: n, "step": n})
        out.append({layout.EVENT: layout.PREEMPTED, layout.TIME: _iso(end), layout.ATTEMPT: n, "step": n})
    return out


ATTEMPTS = st.lists(st.tuples(st.integers(1, 3600), st.integers(2, 7200)), min_size=1, max_size=5)


@given(attempts=ATTEMPTS, last=st.integers(2, 3600))
def test_complete_counts_from_the_first_attempt_and_every_gap(attempts, last):
    spans, t = [], T0
    for gap, length in attempts:
        spans.append((t, t + length))
        t += length + gap
    events = _history(spans)
    # The attempt that finishes: started after the last gap, resumed a second later.
    events += [{layout.EVENT: layout.STARTED, layout.TIME: _iso(t), layout.ATTEMPT: len(spans) + 1},
               {layout.EVENT: layout.RESUMED, layout.TIME: _iso(t + 1), layout.ATTEMPT: len(spans) + 1}]
    finished = t + last

    rec = complete_record(step=10, metrics={"loss": 0.1}, examples_seen=640, events=events, finished_at=finished)

    assert rec["attempts"] == len(spans) + 1
    assert rec["total_seconds"] == pytest.approx(finished - T0, abs=0.002)
    lost = sum(gap + 1 for gap, _ in attempts)  # each preemption's end to the next attempt's `resumed`
    assert rec["seconds_lost_to_preemption"] == pytest.approx(lost, abs=0.01)
    assert seconds_lost(events) == pytest.approx(lost, abs=0.01)


def test_complete_of_one_attempt_counts_that_attempt_only():
    events = [{layout.EVENT: layout.STARTED, layout.TIME: _iso(T0), layout.ATTEMPT: 1}]
    rec = complete_record(step=3, metrics={}, examples_seen=3, events=events, finished_at=T0 + 42.5)
    assert (rec["attempts"], rec["total_seconds"], rec["seconds_lost_to_preemption"]) == (1, 42.5, 0)


STANDIN = textwrap.dedent('''
    import json, os, signal, sys, time
    def send(kind, **f):
        with open(os.environ["TRAINSTACK_MESSAGES_FILE"], "a") as out:
            out.write(json.dumps({"kind": kind, **f}) + "\\n")
    if sys.argv[1] == "wait":
        send("checkpoint", step=7, seconds=0.1, bytes=10)
        print(json.dumps({"event": "standin_ready"}), flush=True)
        time.sleep(60)
        sys.exit(5)
    send("epoch", step=10, total=10, epoch=1, metrics={"loss": 0.5})
    with open(os.path.join(os.environ["TRAINSTACK_MODEL_DIR"], "weights.bin"), "wb") as f:
        f.write(b"model")
    sys.exit(int(sys.argv[1]))
''')
# Two earlier attempts, an hour and half an hour before this one, of different lengths.
EARLIER = [(-3600.0, -3000.0), (-1700.0, -1500.0)]


@pytest.fixture
def earlier_run(tmp_path):
    """A script-mode run folder whose events hold two earlier attempts; its URI, its code, the first start."""
    import time

    from runfolder.storage import open_store

    code = tmp_path / "code"
    code.mkdir()
    (code / "standin.py").write_text(STANDIN)
    uri = f"file://{tmp_path}/run"
    now = time.time()
    lines = "".join(json.dumps(e) + "\n" for e in _history([(now + a, now + b) for a, b in EARLIER]))
    open_store(uri).put_bytes(layout.EVENTS_KEY, lines.encode())
    return uri, code, now + EARLIER[0][0]


@pytest.mark.slow
def test_complete_after_two_preempted_attempts_counts_three_and_the_whole_hour(earlier_run, tmp_path):
    import time

    uri, code, first = earlier_run
    rc, events, err = run_trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", "0", timeout=120)
    assert rc == 0, err
    assert kinds(events)[-1] == layout.FINISHED
    done = json.loads((tmp_path / "run" / layout.COMPLETE).read_text())
    assert done["attempts"] == 3
    assert time.time() - first - 120 < done["total_seconds"] <= time.time() - first
    # Gaps: 1,700 - 3,000 + 1 s (the first preemption to the second `resumed`), and the second
    # preemption to this attempt (no `resumed`: a script does not say it resumed), under 1,500 + 120 s.
    assert 1300 < done["seconds_lost_to_preemption"] < 1300 + 1500 + 120


@pytest.mark.slow
def test_failed_and_cancelled_endings_name_the_third_attempt(earlier_run, tmp_path):
    uri, code, _ = earlier_run
    rc, _, err = run_trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", "3", timeout=120)
    assert rc == 1, err
    [failed] = [e for e in store_events(uri) if e["event"] == layout.FAILED_EVENT]
    assert failed[layout.ATTEMPT] == 3 and failed["exit_code"] == 3

    # The fourth attempt is cancelled (ops stop wrote STOP) after its command committed step 7.
    t = Trainer(uri, "--code-dir", str(code), "--", "python", "standin.py", "wait", env=trainer_env())
    t.wait_event("standin_ready", timeout=60)
    from runfolder.storage import open_store

    open_store(uri).put_bytes(layout.STOP_KEY, json.dumps({"reason": "enough"}).encode())
    assert t.wait(timeout=60) == 0, t.stderr
    marker = json.loads((tmp_path / "run" / layout.CANCELLED).read_text())
    assert (marker["attempts"], marker["step"], marker["reason"]) == (4, 7, "enough")


def test_complete_record_is_exactly_the_documented_fields():
    # A machine's event before the trainer's first start (not a start); a priced attempt on two
    # machines whose last event was long before the end; an end 0.0004 s past a whole second.
    events = [{layout.EVENT: "bootstrap", layout.TIME: _iso(T0 - 100)},
              {layout.EVENT: layout.STARTED, layout.TIME: _iso(T0), layout.ATTEMPT: 1, "workers": 2,
               "config": {"price_per_hour": 2.0, "price_note": "spot estimate"}},
              {layout.EVENT: layout.CHECKPOINT, layout.TIME: _iso(T0 + 100), layout.ATTEMPT: 1, "step": 5}]
    signature = {"endpoint": "serve", "signature": "serving_default", "inputs": {}, "outputs": {}}
    best = {"metric": "val_loss", "mode": "min", "step": 5, "value": 0.5}

    rec = complete_record(step=10, metrics={"loss": 0.25}, examples_seen=640, events=events,
                          finished_at=T0 + 1800.0004, signature=signature, best=best, eval_seconds=0.0)

    assert rec == {"step": 10, "metrics": {"loss": 0.25}, "examples_seen": 640, "attempts": 1,
                   "seconds_lost_to_preemption": 0, "total_seconds": 1800.0,
                   "finished_at": _iso(T0 + 1800.0004), "machine_hours": 1.0, "cost_usd": 2.0,
                   "cost_note": "spot estimate", "signature": signature, "best": best, "eval_seconds": 0.0}
    assert rec["finished_at"].endswith("+00:00")
    # The attempt counts up to the end (1,800 s on two machines), not to its last event (100 s).
    bare = complete_record(step=10, metrics={}, examples_seen=0, events=events[:2], finished_at=T0 + 0.0004)
    assert bare["total_seconds"] == 0.0 and "signature" not in bare and "best" not in bare
    assert "eval_seconds" not in bare and bare["machine_hours"] == 0.0


def test_complete_record_of_a_run_without_events_has_one_attempt_and_no_cost():
    rec = complete_record(step=0, metrics={}, examples_seen=0, events=[], finished_at=T0)
    assert rec == {"step": 0, "metrics": {}, "examples_seen": 0, "attempts": 1, "seconds_lost_to_preemption": 0,
                   "total_seconds": 0.0, "finished_at": _iso(T0)}


def test_a_scripts_complete_says_how_many_files_model_got_and_what_became_of_a_model_saved_elsewhere():
    note = "./x.keras was saved outside fit.model_dir(): taken as model/x.keras"
    rec = complete_record(step=4, metrics={}, examples_seen=0, events=[], finished_at=T0, model_files=3,
                          model_note=note)
    assert (rec["model_files"], rec["model_note"]) == (3, note)
    # No file is a count a user reads ("model/ got nothing"); no note is no key.
    empty = complete_record(step=4, metrics={}, examples_seen=0, events=[], finished_at=T0, model_files=0,
                            model_note="")
    assert empty["model_files"] == 0 and "model_note" not in empty
    assert "model_files" not in complete_record(step=4, metrics={}, examples_seen=0, events=[], finished_at=T0)


def test_write_complete_stores_what_it_returns(tmp_path):
    from runfolder.storage import open_store
    from trainer.export import write_complete

    store = open_store(f"file://{tmp_path}/run")
    events = _history([(T0, T0 + 60)]) + [{layout.EVENT: layout.STARTED, layout.TIME: _iso(T0 + 90),
                                           layout.ATTEMPT: 2}]
    doc = write_complete(store, step=4, metrics={"loss": 1.0}, examples_seen=8, events=events, finished_at=T0 + 120)
    # One JSON document, indented as every end marker is for whoever reads it with `cat`.
    assert store.get_bytes(layout.COMPLETE).decode() == json.dumps(doc, indent=2)
    assert (doc["attempts"], doc["total_seconds"], doc["step"]) == (2, 120.0, 4)
