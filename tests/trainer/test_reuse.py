"""Reusing a run folder: another model's checkpoints fail at once with one line, a COMPLETE run is not extended.

The first attempt is stopped by SIGTERM after a committed checkpoint; the next attempt asks for
another model or other shapes. It must refuse before restoring or writing anything but its
`started`/`failed` events (and the run's lease, taken and let go), and exit with the code the
machines never retry.
"""

from __future__ import annotations

import json
import signal

import pytest

from runfolder import exits, layout
from tests.trainer.helpers import REPO, Trainer, run_trainer

pytestmark = pytest.mark.slow

LONG = ["--synthetic", "--steps", "100000", "--batch-size", "16", "--checkpoint-every-steps", "10", "--log-every", "5"]
LM = ["--model", "transformer-lm", "--lm-layers", "1", "--lm-dim", "32", "--lm-heads", "2", "--lm-seq-len", "16"]


def _stopped_run(uri: str, *args: str) -> int:
    t = Trainer(uri, *LONG, *args)
    t.wait_event("checkpoint", pred=lambda e: e["step"] >= 10)
    t.signal(signal.SIGTERM)
    assert t.wait() == exits.PREEMPTED, t.stderr[-2000:]
    return t.events[-1]["step"]


def _snapshot(root) -> dict[str, bytes]:
    # The run's lease is bookkeeping, not the run's content: every attempt takes and releases it.
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in (layout.EVENTS_KEY, layout.LEASE_KEY)
            and not p.name.startswith(".trainstack-tmp-lock-")}


@pytest.mark.parametrize(("first", "second", "words"), [
    ([], ["--code-dir", str(REPO / "examples" / "image-cnn"), "--model", "shapes.model:build"],
     "this run was trained with --model mlp"),
    (LM, [*LM[:-4], "--lm-heads", "2", "--lm-seq-len", "24"], "holds another model's shapes"),
], ids=["other-model", "other-shapes"])
def test_another_model_on_a_run_folder_fails_at_once_and_changes_nothing(tmp_path, first, second, words):
    uri = f"file://{tmp_path / 'run'}"
    _stopped_run(uri, *first)
    before = _snapshot(tmp_path / "run")
    rc, events, err = run_trainer(uri, *LONG, *second)
    assert rc == exits.UNUSABLE, (rc, err[-2000:])
    failed = [e for e in events if e["event"] == layout.FAILED_EVENT]
    assert len(failed) == 1 and words in failed[0]["reason"] and "new run id" in failed[0]["reason"], failed
    assert "\n" not in failed[0]["reason"]
    assert not [e for e in events if e["event"] in (layout.RESUMED, layout.CHECKPOINT)]
    assert _snapshot(tmp_path / "run") == before  # no checkpoint, progress or marker touched
    lease = json.loads((tmp_path / "run" / layout.LEASE_KEY).read_text())
    assert lease["released"] and lease["epoch"] == 2  # taken before the restore, let go on the refusal


def test_a_complete_run_asked_for_more_steps_says_how_to_train_further(tmp_path):
    uri = f"file://{tmp_path / 'run'}"
    rc, _, err = run_trainer(uri, "--synthetic", "--steps", "20", "--checkpoint-every-steps", "10")
    assert rc == 0, err[-2000:]
    rc, events, _ = run_trainer(uri, "--synthetic", "--steps", "40")
    assert rc == 0
    (done,) = [e for e in events if e["event"] == layout.ALREADY_COMPLETE]
    assert "COMPLETE at 20 steps" in done["message"] and "new run id" in done["message"]
    rc, events, _ = run_trainer(uri, "--synthetic", "--steps", "20")
    assert [e["message"] for e in events if e["event"] == layout.ALREADY_COMPLETE] == ["run already COMPLETE; nothing to do"]
