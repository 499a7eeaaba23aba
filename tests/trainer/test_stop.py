"""Stopping a run on request: the run folder's STOP ends it as CANCELLED after a committed checkpoint."""

from __future__ import annotations

import json
import time

import pytest

from runfolder import exits, layout
from tests.trainer.helpers import FAST, Trainer, kinds, run_trainer, store_events, trainer_env, waiting_model

pytestmark = pytest.mark.slow


def _store(uri):
    from runfolder.storage import open_store

    return open_store(uri)


def _committed(uri):
    from trainer.checkpoint_store import CheckpointStore

    return CheckpointStore(_store(uri)).committed_steps()


def test_stop_found_at_start_cancels_after_the_first_steps_and_stays_cancelled(file_run):
    store = _store(file_run.uri)
    store.put_bytes(layout.STOP_KEY, json.dumps({layout.MARKER_REASON: "budget reached"}).encode())
    env = trainer_env(file_run.env)
    rc, events, err = run_trainer(file_run.uri, *FAST, env=env)
    assert rc == exits.OK, err[-3000:]
    assert kinds(events)[0] == layout.STARTED and kinds(events)[-1] == layout.CANCELLED_EVENT, kinds(events)
    step = events[-1]["step"]
    assert 0 < step < 60 and events[-1]["reason"] == "budget reached"
    # The step it stopped at is committed, then CANCELLED names it; nothing says COMPLETE.
    assert _committed(file_run.uri)[-1] == step
    marker = json.loads(store.get_bytes(layout.CANCELLED))
    assert marker[layout.MARKER_STEP] == step and marker[layout.MARKER_ATTEMPTS] == 1
    assert marker[layout.MARKER_REASON] == "budget reached"
    assert not store.exists(layout.COMPLETE)
    assert kinds(store_events(file_run.uri)) == kinds(events)

    # A later start (the group relaunching, a new `pulumi up`) ends at once, training nothing.
    rc, again, err = run_trainer(file_run.uri, *FAST, env=env)
    assert rc == exits.OK, err[-3000:]
    assert kinds(again) == [layout.ALREADY_CANCELLED] and again[0]["step"] == step
    assert kinds(store_events(file_run.uri)) == kinds(events)


def test_stop_written_mid_run_is_seen_within_the_poll_interval(s3_run, tmp_path):
    from trainer.signals import STOP_POLL_SECONDS

    env = trainer_env(s3_run.env)
    # Each batch 25 ms late: it trains on until the next poll (up to 10 s) at a small part of a core.
    args = [*waiting_model(tmp_path / "code"), "--steps", "100000", "--batch-size", "32", "--checkpoint-every-steps",
            "50", "--log-every", "10"]
    t = Trainer(s3_run.uri, *args, env=env)
    t.wait_event("checkpoint", pred=lambda e: e["step"] >= 50)
    _store(s3_run.uri).put_bytes(layout.STOP_KEY, b"")
    asked = time.monotonic()
    rc = t.wait(timeout=120)
    took = time.monotonic() - asked
    assert rc == exits.OK, t.stderr[-3000:]
    assert took < STOP_POLL_SECONDS + 20, took
    last = t.events[-1]
    assert last["event"] == layout.CANCELLED_EVENT and last["step"] > 50, kinds(t.events)
    assert "STOP" in last["reason"]
    assert _committed(s3_run.uri)[-1] == last["step"]
    marker = json.loads(_store(s3_run.uri).get_bytes(layout.CANCELLED))
    assert marker[layout.MARKER_STEP] == last["step"] and marker[layout.MARKER_ATTEMPTS] == 1
