"""A run moves to another region, end to end: two sandbox machines, the controller's tick between them.

Placement A (us-east-1) trains in the boot sandbox and is preempted by a spot notice. A's group
then cannot launch (its Auto Scaling answers carry no instance and a failed scaling activity per
try, in AWS's words for no capacity: tests/fixtures/no_capacity.py). The controller's tick, at a
moment past `waitMinutes`, moves the run: A's group to zero, B's (us-west-2) to one. A machine of
placement B boots with the same run URI in the same bucket, resumes from A's last committed
checkpoint and ends the run COMPLETE; its finish path puts B's group to zero. The final weights
equal those of the same run never interrupted (max |Δ| = 0, on CPU).
"""

from __future__ import annotations

import time

import pytest

from components.settings import load_settings
from controller import record as records
from controller.clouds import AwsGroups, Clouds
from controller.decide import MOVE
from controller.tick import tick
from devtools.metadata import MetadataServer
from devtools.sandbox import Sandbox
from runfolder import layout
from runfolder.storage import open_store
from tests.controller.helpers import moved_events, sizes
from tests.fixtures.no_capacity import insufficient_capacity, placements  # noqa: F401 - a fixture, found by name
from tests.userdata.helpers import diff_from_uninterrupted, events, preempted_after_first_checkpoint

pytestmark = pytest.mark.slow

# A's trainer holds after its first checkpoint (step 200) until the notice's stop signal
# (tests/userdata/held_trainer.py), so the notice lands mid-run at a known step however slowly
# the machine trains: it stops at the next call's end (step 400 at most), and B's part and the
# reference run are short.
STEPS, EVERY, BATCH, SEED = 1000, 200, 16, 11


def _settings(region: str):
    return load_settings({
        "cloud": "aws", "region": region,
        "run": {"model": "mlp", "synthetic": True, "steps": STEPS, "batchSize": BATCH, "seed": SEED,
                "checkpointEverySteps": EVERY, "checkpointEverySeconds": 600, "extraArgs": ["--deterministic"]},
        "compute": {"instanceTypes": ["g5.xlarge"], "maxRuntimeHours": 1},
    }, stack="sandbox")


def test_a_preempted_run_whose_region_cannot_launch_moves_and_ends_as_if_never_stopped(
        placements, code_uri, tmp_path):  # noqa: F811
    run, config = placements.run, placements.config
    home, west = config.placements
    store = open_store(run.uri)
    md_a = MetadataServer(instance_id="i-0aaaaaaaaaaaaaaa1")
    md_b = MetadataServer(instance_id="i-0bbbbbbbbbbbbbbb2")
    boxes = []
    try:
        # 1. Placement A trains and is preempted.
        box_a = Sandbox(tmp_path / "a", run, md_a, home.group, code_uri, settings=_settings(home.region),
                        warm_trainer=True)
        boxes.append(box_a)
        stopped_at = preempted_after_first_checkpoint(box_a, md_a, store)
        assert EVERY < stopped_at < STEPS  # the stop's own checkpoint, after the held step

        # 2. A's group cannot launch; 3. a tick past waitMinutes moves the run.
        later = time.time() + (config.wait_minutes + 1) * 60
        placements.no_capacity_at_home(insufficient_capacity("g5.xlarge", "us-east-1a"), later)
        result = tick(config, Clouds(aws=AwsGroups()), later)
        assert result.action == MOVE, result
        assert sizes(config) == [0, 1]
        [moved] = moved_events(store)
        assert (moved["from"], moved["to"], moved["step"]) == (0, 1, stopped_at)

        # 4. A machine of placement B resumes from A's last committed checkpoint; 5. COMPLETE.
        box_b = Sandbox(tmp_path / "b", run, md_b, west.group, code_uri, settings=_settings(west.region),
                        warm_trainer=True)
        boxes.append(box_b)
        assert box_b.boot().wait(timeout=300) == 0, box_b.journal()[-4000:]
    finally:
        for box in boxes:
            box.power_off()
        md_a.close()
        md_b.close()

    log = events(run)
    resumed = [e for e in log if e[layout.EVENT] == layout.RESUMED]
    assert [e["step"] for e in resumed] == [stopped_at]
    assert store.exists(layout.COMPLETE)
    assert sizes(config) == [0, 0]  # B's finish path put its own group to zero
    assert records.read(store)[0].active == 1
    assert tick(config, Clouds(aws=AwsGroups()), time.time()).action == "finish"

    diff = diff_from_uninterrupted(run.uri, tmp_path, steps=STEPS, batch=BATCH, seed=SEED, every=EVERY)
    assert diff == 0.0, diff
