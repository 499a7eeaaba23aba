"""`ops status` takes the trainer's heartbeat from its newest sign of life, not its oldest.

The heartbeat is the later of `progress.json`'s `updated` and the newest line of
`events.jsonl`. A run whose progress file is stale or missing (its writes failed, or it
was lost) but whose newest event is fresh is alive: reading the oldest event instead
would call it stalled (exit 3) or stopped while it trains. The run folder is written with
explicit times relative to a fixed `now`, so no case depends on the machine's speed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from ops import status
from runfolder import layout
from runfolder.storage import open_store

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC).timestamp()
HOURS_AGO_3 = 3 * 3600.0


def at(seconds_ago: float) -> str:
    return datetime.fromtimestamp(NOW - seconds_ago, UTC).isoformat(timespec="milliseconds")


def write_events(store, *events: tuple[str, float, dict]) -> None:
    """events.jsonl as the trainer appends it: (event, seconds before NOW, fields), oldest first."""
    lines = [json.dumps({layout.EVENT: kind, layout.TIME: at(ago), layout.ATTEMPT: 1, **fields})
             for kind, ago, fields in events]
    store.put_bytes(layout.EVENTS_KEY, ("\n".join(lines) + "\n").encode())


STARTED = (layout.STARTED, HOURS_AGO_3, {"config": {"steps": 1000, "progress_every_seconds": 10}, "global_batch": 64})


@pytest.mark.parametrize("progress", ["missing", "stale", "corrupt"])
@pytest.mark.parametrize("newest", [layout.CHECKPOINT, layout.UPLOAD_RETRY])
def test_a_fresh_newest_event_is_a_heartbeat_whatever_progress_json_says(file_run, progress, newest):
    store = open_store(file_run.uri)
    # Started three hours ago (longer than any quiet phase), trained, and its newest event
    # is 5 s old: a checkpoint just committed, or a transfer being retried right now.
    write_events(store, STARTED, (layout.CHECKPOINT, 7200.0, {"step": 100, "seconds": 1.0, "bytes": 10}),
                 (newest, 5.0, {"step": 900, "seconds": 1.0, "bytes": 10} if newest == layout.CHECKPOINT
                  else {"error": "SlowDown", "op": "put", "key": "progress.json"}))
    if progress == "stale":
        store.put_bytes(layout.PROGRESS_KEY, json.dumps(
            {"step": 100, "total": 1000, "loss": 0.9, "examples_per_sec": 640.0, "updated": at(HOURS_AGO_3 - 60)}).encode())
    elif progress == "corrupt":
        store.put_bytes(layout.PROGRESS_KEY, b'{"step": 1')
    st = status.read_status(file_run.uri, now=NOW)
    assert st.heartbeat_age_seconds == 5.0, st
    assert (st.state, st.attempts) == (status.RUNNING, 1), st.detail
    if progress == "stale":
        # The stale file's own age is still reported as it is: only the heartbeat moved.
        assert st.progress_age_seconds == HOURS_AGO_3 - 60


def test_a_stale_newest_event_with_a_stale_progress_file_is_still_a_stall(file_run):
    """The other side: when the newest sign of life is old too, the run is not running."""
    store = open_store(file_run.uri)
    write_events(store, STARTED, (layout.CHECKPOINT, 7200.0, {"step": 100, "seconds": 1.0, "bytes": 10}))
    store.put_bytes(layout.PROGRESS_KEY, json.dumps({"step": 100, "total": 1000, "updated": at(7000.0)}).encode())
    st = status.read_status(file_run.uri, now=NOW)
    assert st.heartbeat_age_seconds == 7000.0
    # A local run nothing restarts: STOPPED (a cloud run would read STALLED).
    assert st.state == status.STOPPED and "no heartbeat for" in st.detail, st.detail
