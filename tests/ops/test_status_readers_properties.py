"""Property tests of the run folder's JSON readers: corrupt input reads as corrupt or absent, never a crash.

The run folder is written by several writers (the trainer, the machine's scripts, `ops`),
each of which can be cut off, be an older version, or be edited by hand. `ops status` is
what someone runs when a run looks wrong: a torn `progress.json`, a foreign line in
`events.jsonl` or an end marker with odd fields must leave it reporting, not raise. The
same holds for the checkpoint marker the trainer reads on resume (a bad one is skipped with
a `checkpoint_skipped` event) and for the end markers the trainer reads before training.

Documents are generated in two kinds: bytes that are not JSON (or not an object), and
objects with the fields the readers look at holding any JSON value, times included.
"""

from __future__ import annotations

import io
import json
import tempfile
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ops import status
from runfolder import layout
from runfolder.storage import FileStore
from trainer.checkpoint_store import CheckpointStore

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC).timestamp()

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
# ISO 8601 times anywhere in datetime's range, with any UTC offset, and a few near NOW.
OFFSETS = st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)).map(
    timezone)
TIMES = (st.datetimes(timezones=OFFSETS).map(lambda d: d.isoformat())
         | st.floats(0, 10 * 86400).map(lambda s: datetime.fromtimestamp(NOW - s, UTC).isoformat()))
NOT_AN_OBJECT = (st.binary(max_size=40)
                 | JSON.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode())
                 # a JSON object cut short, as a write torn by a full disk leaves it
                 | st.tuples(st.dictionaries(st.text(max_size=6), JSON, min_size=1, max_size=3), st.integers(1, 40)).map(
                     lambda t: json.dumps(t[0]).encode()[: t[1]]))


def shaped(fields: dict) -> st.SearchStrategy[bytes]:
    """A JSON object with some of `fields` (name: strategy of its value), serialized."""
    return st.fixed_dictionaries({}, optional=fields).map(lambda d: json.dumps(d).encode())


def document(fields: dict) -> st.SearchStrategy[bytes]:
    return shaped(fields) | NOT_AN_OBJECT


# Values that break readers which trust a field's type: an empty list or object where a name or a
# number belongs, an integer no float holds, NaN and infinities (Python's json reads them), a bool.
WEIRD = st.sampled_from([[], {}, [1], {"a": 1}, 10**400, -(10**400), float("nan"), float("inf"), float("-inf"), -1, 0,
                         "", True, None])
ANY = WEIRD | JSON
PROGRESS = document({"step": ANY, "total": ANY, "loss": ANY, "examples_per_sec": ANY, "updated": TIMES | ANY})
EVENT_NAMES = st.sampled_from(sorted(layout.LIFECYCLE | {layout.CHECKPOINT, layout.SPOT_NOTICE, layout.UPLOAD_RETRY}))
EVENT = document({
    layout.EVENT: EVENT_NAMES | ANY, layout.TIME: TIMES | ANY, layout.ATTEMPT: ANY, "step": ANY, "reason": ANY,
    "global_batch": ANY, "workers": ANY,
    "config": st.fixed_dictionaries({}, optional={"steps": ANY, "progress_every_seconds": ANY, "price_per_hour": ANY,
                                                  "price_note": ANY}) | ANY,
})
SIGNATURE = st.fixed_dictionaries({}, optional={"endpoint": ANY, "inputs": st.dictionaries(
    st.text(max_size=4), st.fixed_dictionaries({}, optional={"dtype": ANY, "shape": ANY}) | ANY, max_size=2) | ANY,
    "outputs": ANY})
END = document({layout.MARKER_STEP: ANY, layout.MARKER_REASON: ANY, "finished_at": TIMES | ANY,
                layout.TIME: TIMES | ANY, "signature": SIGNATURE | ANY, "metrics": ANY})
MARKER = document({"step": ANY, "created": TIMES | ANY, "files": ANY})


def _jsonl(lines: list[bytes]) -> bytes:
    return b"".join(line.replace(b"\n", b" ") + b"\n" for line in lines)


def _doc(**fields) -> bytes:
    return json.dumps(fields).encode()


STARTED = _doc(event="started", time=datetime.fromtimestamp(NOW - 100, UTC).isoformat(), attempt=1,
               config={"steps": 1000, "price_per_hour": 1.0}, global_batch=64)


# Crashes this test found, kept as fixed cases: each raised in `ops status` before its fix.
@example(progress=None, events=[_doc(event=[])], machine=[], end=None, marker=None, local=False)
@example(progress=_doc(step=1, total=1000, loss=10**400, examples_per_sec=float("nan")), events=[STARTED], machine=[],
         end=None, marker=None, local=False)
@example(progress=None, events=[_doc(event="started", time=datetime.fromtimestamp(NOW, UTC).isoformat(),
                                     config={"price_per_hour": 10**400}, workers=10**400)],
         machine=[], end=None, marker=None, local=False)
@example(progress=None, events=[], machine=[], end=(layout.COMPLETE, _doc(step=1, signature={"inputs": {"x": [1]}})),
         marker=None, local=False)
@settings(max_examples=100)
@given(progress=st.none() | PROGRESS, events=st.lists(EVENT, max_size=4), machine=st.lists(EVENT, max_size=2),
       end=st.none() | st.tuples(st.sampled_from(layout.END_MARKERS), END), marker=st.none() | MARKER,
       local=st.booleans())
def test_status_of_any_run_folder_reports_and_never_raises(progress, events, machine, end, marker, local):
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStore(f"file://{tmp}/runs/r")
        if progress is not None:
            store.put_bytes(layout.PROGRESS_KEY, progress)
        if events:
            store.put_bytes(layout.EVENTS_KEY, _jsonl(events))
        if machine:
            store.put_bytes(layout.machine_events_key("i-0abc"), _jsonl(machine))
        if end is not None:
            store.put_bytes(end[0], end[1])
        if marker is not None:
            store.put_bytes(layout.committed_key(40), marker)
        # A cloud URI over the same files: the cloud-only branches (PREEMPTED, STALLED) run too.
        uri = f"file://{tmp}/runs/r" if local else "s3://bucket/runs/r"
        st_ = status.read_status(uri, store=store, now=NOW)
        assert st_.state in {status.NOT_STARTED, status.RUNNING, status.STALLED, status.PREEMPTED, status.STOPPED,
                             *layout.END_MARKERS}
        # What `ops status --json` prints and what the terminal shows.
        json.dumps(st_.to_json())
        from rich.console import Console

        Console(file=io.StringIO(), width=120).print(status.render(st_))
        assert status.exit_code(st_) in (0, 1, 3)
        if end is not None:
            # A marker that exists ends the run even when its content is unreadable.
            assert st_.state == end[0]
        if progress is not None and st_.progress_updated is not None:
            assert isinstance(st_.progress_updated, str)


@given(marker=MARKER, step=st.integers(0, 10**6))
def test_a_bad_checkpoint_marker_is_skipped_on_resume_never_raised(marker, step):
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStore(f"file://{tmp}/runs/r")
        store.put_bytes(layout.committed_key(step), marker)
        skipped = []
        ck = CheckpointStore(store, emit=lambda kind, fields: skipped.append((kind, fields)))
        # No checkpoint file exists beside the marker, so nothing can restore: whatever the
        # marker says, the step is skipped with a reason.
        assert ck.restore_latest(f"{tmp}/restore") is None
        assert [(k, f["step"]) for k, f in skipped] == [(layout.CHECKPOINT_SKIPPED, step)], skipped
        assert isinstance(skipped[0][1]["reason"], str) and skipped[0][1]["reason"]
