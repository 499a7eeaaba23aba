"""A user model needs run.dataUri only when it reads TFRecords: one that brings no data fails at once (exit 78)."""

from __future__ import annotations

import pytest

from runfolder import exits, layout
from tests.trainer.helpers import REPO, kinds, run_trainer, store_events


@pytest.mark.slow
def test_a_records_model_without_data_uri_exits_78_with_one_line(tmp_path):
    uri = f"file://{tmp_path}/run"
    rc, events, err = run_trainer(uri, "--code-dir", str(REPO / "examples" / "image-cnn"),
                                  "--model", "shapes.model:build", "--steps", "5", timeout=240)
    assert rc == exits.UNUSABLE, err[-2000:]
    failed = [e for e in store_events(uri) if e["event"] == layout.FAILED_EVENT]
    assert len(failed) == 1, kinds(events)
    reason = failed[0]["reason"]
    assert "run.dataUri" in reason and "parse_tfrecord, which reads --data-uri" in reason and "\n" not in reason, reason
