"""Property test of the trainer's first read: an end marker, whatever it holds, means the run ended.

Before training, an attempt reads `COMPLETE` and `CANCELLED` (`RunAttempt._already_complete`, in both modes). A
machine that reboots after the run ended must say so and exit 0, never train again (a second
model and end marker would be written over the first) and never crash on the marker's
content: the supervisor would retry a crash until the run's attempts are spent. The marker is
written as any bytes, or as an object whose fields hold any JSON value.
"""

from __future__ import annotations

import io
import json
import tempfile
import types

from hypothesis import example, given
from hypothesis import strategies as st

from runfolder import exits, layout
from runfolder.events import utc_now
from runfolder.storage import FileStore
from trainer.loop_attempt import LoopAttempt as Run

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
SHAPED = st.fixed_dictionaries({}, optional={layout.MARKER_STEP: JSON, "finished_at": JSON, "cancelled_at": JSON,
                                             layout.MARKER_REASON: JSON}).map(lambda d: json.dumps(d).encode())
MARKER_BYTES = SHAPED | st.binary(max_size=40) | JSON.map(lambda v: json.dumps(v).encode())


def _attempt(store):
    """What `_already_complete` reads of its Run: the store, the event stream, the steps asked for."""
    stub = types.SimpleNamespace(store=store, events=types.SimpleNamespace(attempt=3, stream=io.StringIO()), AGAIN_HINT="",
                                 cfg=types.SimpleNamespace(steps=100))
    stub._complete_message = lambda done: Run._complete_message(stub, done)
    return stub


@given(st.sampled_from([layout.COMPLETE, layout.CANCELLED]), MARKER_BYTES)
@example(layout.COMPLETE, b'{"step": 10')
@example(layout.COMPLETE, b"[]")
@example(layout.CANCELLED, b"\xff\xfe")
def test_any_end_marker_ends_the_attempt_with_one_line(marker, content):
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStore(f"file://{tmp}/runs/r")
        store.put_bytes(marker, content)
        run = _attempt(store)
        started = utc_now()
        assert Run._already_complete(run) is True
        lines = run.events.stream.getvalue().splitlines()
        assert len(lines) == 1, lines
        said = json.loads(lines[0])
        expected = layout.ALREADY_COMPLETE if marker == layout.COMPLETE else layout.ALREADY_CANCELLED
        assert said[layout.EVENT] == expected and said["message"]
        # Said now, of no new attempt: the marker's own count, not the next attempt's number (3).
        try:
            doc = json.loads(content)
        except ValueError:
            doc = {}
        attempts = doc.get("attempts") if isinstance(doc, dict) else None
        want = attempts if type(attempts) is int else None
        assert said[layout.ATTEMPT] == want and said[layout.TIME] >= started, said


def test_no_end_marker_means_train():
    with tempfile.TemporaryDirectory() as tmp:
        run = _attempt(FileStore(f"file://{tmp}/runs/r"))
        assert Run._already_complete(run) is False
        assert run.events.stream.getvalue() == ""


def test_the_first_read_before_tensorflow_says_what_the_attempt_would():
    """`python -m trainer` reads the markers before importing TensorFlow (`ended_before_start`):
    the same line as the attempt's own read, nothing for a run still going, and the attempt's
    `failed` line and exit code for a store it cannot read at all."""
    from trainer.run_attempt import ended_before_start, loop_complete_message

    with tempfile.TemporaryDirectory() as tmp:
        cfg = types.SimpleNamespace(run_uri=f"file://{tmp}/runs/r", steps=100)

        def said(run_cfg):
            out = io.StringIO()
            code = ended_before_start(run_cfg, complete_message=lambda done: loop_complete_message(done, 100),
                                      stream=out)
            return code, [json.loads(line) for line in out.getvalue().splitlines()]

        assert said(cfg) == (None, [])
        FileStore(cfg.run_uri).put_bytes(layout.COMPLETE, json.dumps({"step": 10}).encode())
        code, lines = said(cfg)
        assert code == exits.OK and len(lines) == 1, lines
        assert (lines[0][layout.EVENT], lines[0][layout.ATTEMPT], lines[0]["step"]) == (layout.ALREADY_COMPLETE, None, 10)
        assert "COMPLETE at 10 steps; --steps 100 does not extend it" in lines[0]["message"]
        code, lines = said(types.SimpleNamespace(run_uri="nope://bucket/run", steps=100))
        assert code == exits.FAILED and len(lines) == 1, lines
        assert lines[0][layout.EVENT] == layout.FAILED_EVENT and lines[0][layout.ATTEMPT] is None
        assert "nope://" in lines[0]["reason"], lines
