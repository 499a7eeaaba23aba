"""The controller's GCP side: a regional managed instance group read and sized through the Compute
Engine REST API (a fake that answers in the API's shapes, tests/fixtures/gce_groups.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from controller.clouds import CloudError, GcpGroups
from controller.config import Placement, parse
from controller.decide import CAPACITY, MOVE, GroupState, RunView, decide
from controller.record import Record
from tests.fixtures.gce_groups import GceGroups

PROJECT, REGION = "my-proj", "us-central1"
P = Placement(index=0, cloud="gcp", region=REGION, group="ts-gpu", project=PROJECT)


@pytest.fixture
def gce() -> Iterator[GceGroups]:
    server = GceGroups(PROJECT, REGION)
    server.add("ts-gpu", 1)
    yield server
    server.close()


def _groups(gce: GceGroups, pauses: list[float] | None = None) -> GcpGroups:
    return GcpGroups(requests.Session(), api=gce.url, sleep=(pauses.append if pauses is not None else lambda s: None))


def test_a_group_with_its_machine_running(gce):
    state = _groups(gce).state(P)
    assert state == GroupState(running=1, desired=1, failures=(), machines=("ts-gpu-0000",))


def test_a_stockout_reads_as_capacity_failures_and_moves_the_run(gce):
    gce.stockout("ts-gpu", "us-central1-a")
    state = _groups(gce).state(P)
    assert state.running == 0 and state.desired == 1
    assert {f.kind for f in state.failures} == {CAPACITY} and len(state.failures) == 2
    assert state.failures[0].time is not None  # listErrors' timestamp, newest first
    assert state.failures[0].message.startswith("ZONE_RESOURCE_POOL_EXHAUSTED: The zone 'projects/my-proj/zones/")
    config = parse({"run_uri": "gs://b/runs/r", "nodes": 1, "wait_minutes": 15, "placements": [
        {"cloud": "gcp", "region": REGION, "project": PROJECT, "group": "ts-gpu"},
        {"cloud": "gcp", "region": "europe-west4", "project": PROJECT, "group": "ts-gpu-1"}]})
    now = time.time()
    assert decide(config, Record(), RunView(heartbeat=now - 16 * 60), state, now).action == MOVE


def test_resize_sets_the_target_size(gce):
    groups = _groups(gce)
    groups.set_size(P, 0)
    assert gce.sizes["ts-gpu"] == 0 and groups.desired(P) == 0
    assert ("POST", f"/compute/v1/projects/{PROJECT}/regions/{REGION}/instanceGroupManagers/ts-gpu/resize") \
        in gce.requests


def test_transient_answers_are_retried_with_backoff_and_a_verdict_is_not(gce):
    pauses: list[float] = []
    gce.fail_next(2, 503)
    assert _groups(gce, pauses).desired(P) == 1
    assert pauses == [1.0, 2.0]

    pauses.clear()
    gce.fail_next(1, 403)
    with pytest.raises(CloudError, match="HTTP 403"):
        _groups(gce, pauses).desired(P)
    assert pauses == []

    gce.fail_next(10, 503)
    with pytest.raises(CloudError, match="ts-gpu .gcp us-central1. failed: HTTP 503"):
        _groups(gce, pauses).desired(P)
    assert len(pauses) == 4  # five tries in all, then the tick fails and the next one starts again


@pytest.mark.slow
def test_a_gcs_run_moves_between_two_gcp_regions_when_one_stocks_out(gce, gs_run_enforced):
    from controller.clouds import Clouds
    from controller.tick import tick
    from runfolder.storage import open_store
    from tests.controller.helpers import moved_events, trained

    gce.add("ts-gpu-1", 0, region="europe-west4")
    gce.stockout("ts-gpu", "us-central1-a")
    config = parse({"run_uri": gs_run_enforced.uri, "nodes": 1, "wait_minutes": 15, "placements": [
        {"cloud": "gcp", "region": REGION, "project": PROJECT, "group": "ts-gpu"},
        {"cloud": "gcp", "region": "europe-west4", "project": PROJECT, "group": "ts-gpu-1"}]})
    store = open_store(config.run_uri)
    now = time.time()
    trained(store, step=30, last_beat=now - 16 * 60)

    result = tick(config, Clouds(gcp=_groups(gce)), now + 1)

    assert result.action == MOVE and "ZONE_RESOURCE_POOL_EXHAUSTED" in result.reason
    assert gce.sizes == {"ts-gpu": 0, "ts-gpu-1": 1}
    [event] = moved_events(store)
    assert (event["from_placement"], event["to_placement"], event["step"]) == (
        "gcp us-central1", "gcp europe-west4", 30)
    assert any(not refused for *_rest, refused in gs_run_enforced.proxy.gate.decisions)  # conditional writes
