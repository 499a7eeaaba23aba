"""The run folder's names as the layout spells them: checkpoint keys, per-writer event keys, attempts."""

from __future__ import annotations

import pytest

from runfolder import layout


@pytest.mark.parametrize(("key", "expected"), [
    ("checkpoints/ckpt-10/ckpt.index", (10, "ckpt.index")),
    ("checkpoints/ckpt-7/COMMITTED", (7, "COMMITTED")),
    ("checkpoints/ckpt-7/variables/data-0", (7, "variables/data-0")),
    ("checkpoints/ckpt-5/", None),  # a folder, no object in it
    ("checkpoints/ckpt-5", None),
    ("checkpoints/ckpt-/x", None),
    ("checkpoints/ckpt-5a/x", None),
    ("checkpoints/ckpt-\u0663/x", None),  # a digit, but not an ASCII one: no step the trainer writes
    ("checkpoints/other-5/x", None),
    ("events.jsonl", None),
])
def test_checkpoint_key_step_reads_the_step_and_the_rest(key, expected):
    assert layout.checkpoint_key_step(key) == expected


def test_committed_key_is_the_marker_inside_the_checkpoint_folder():
    assert layout.committed_key(12) == "checkpoints/ckpt-12/COMMITTED"
    assert layout.checkpoint_key_step(layout.committed_key(12)) == (12, layout.COMMITTED)


@pytest.mark.parametrize(("address", "expected"), [
    ("10.0.0.2:2222", "worker-events/10.0.0.2-2222.jsonl"),
    ("host_a-1.internal:80", "worker-events/host_a-1.internal-80.jsonl"),
    ("[::1]:9000", "worker-events/---1--9000.jsonl"),
])
def test_worker_events_key_is_one_safe_name_per_address(address, expected):
    assert layout.worker_events_key(address) == expected


@pytest.mark.parametrize(("events", "expected"), [
    ([], 0),
    ([{layout.EVENT: layout.STARTED}], 1),
    ([{layout.EVENT: layout.STARTED}, {layout.EVENT: layout.CHECKPOINT}, {layout.EVENT: layout.PREEMPTED},
      {layout.EVENT: layout.STARTED}, {layout.EVENT: layout.RESUMED}], 2),
    ([{layout.EVENT: layout.RESUMED}, {"other": layout.STARTED}], 0),
])
def test_attempts_count_the_started_events(events, expected):
    assert layout.attempts(events) == expected


def test_the_placement_events_are_read_with_the_machines_events():
    # `ops status` reads every machine-events/*.jsonl: the controller's `moved` events show there.
    assert layout.machine_events_key("placement") == layout.PLACEMENT_EVENTS_KEY
    assert layout.PLACEMENT_EVENTS_KEY.startswith(layout.MACHINE_EVENTS_PREFIX)
    assert layout.MOVED not in layout.LIFECYCLE  # a move changes where the run trains, not its state
    assert layout.EVENT_FIELDS[layout.MOVED] == ("from", "to", "reason", "step")


def test_decision_tables_are_named_by_their_utc_time_and_sort_by_it():
    first, second = layout.decision_key(1_765_000_000.25), layout.decision_key(1_765_000_000.5)
    assert first == "decisions/20251206T054640.250000Z.json"
    assert first.startswith(layout.DECISIONS_PREFIX) and sorted([second, first]) == [first, second]
    # The wider run folder's listing sees neither the cache nor the tables as a machine's or a checkpoint's.
    assert not layout.is_checkpoint_key(first) and not layout.PRICES_KEY.startswith(layout.MACHINE_EVENTS_PREFIX)
