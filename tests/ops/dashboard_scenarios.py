"""The bucket the dashboard's tests read: ``devtools.story_run``'s preempted-and-moved run and
``test_status.build``'s runs (resumed, failed, complete), each in its own ``runs/<id>/`` folder."""

from __future__ import annotations

from pathlib import Path

from devtools.story_run import Story, story
from runfolder.storage import open_store
from tests.ops.test_status import build

# build() kinds the bucket holds besides the story, with the state each shows.
BUILT = {"resumed": "RUNNING", "failed": "FAILED", "complete": "COMPLETE"}
__all__ = ["BUILT", "Story", "bucket", "story"]


def bucket(bucket_uri: str, work: Path, *, start: float) -> dict[str, str]:
    """Write the bucket; returns run id -> the state each run shows. ``work``: a local scratch folder."""
    story(f"{bucket_uri}/runs/night", work / "night", start=start)
    for kind in BUILT:
        build(kind, open_store(f"{bucket_uri}/runs/{kind}"), work / kind)
    return {"night": "COMPLETE", **BUILT}
