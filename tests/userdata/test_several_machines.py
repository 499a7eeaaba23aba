"""Several machines in one group: finishing together, and waiting for a missing peer.

(Who is a peer is decided under the run folder, never by listing the cloud's machines:
tests/userdata/test_rendezvous.py.)
- A worker that ends before the chief has written the end marker (the chief still
  exports the model) waits for it and finishes the same way, with no failure counted.
- Waiting for a peer that is not there is no failure either: the run's deadline bounds it.
(Losing a machine and bringing a replacement: tests/userdata/test_cluster_scenarios.py.)
"""

from __future__ import annotations

import json

import pytest

from devtools.metadata import INSTANCE_ID
from devtools.sandbox import make_group
from runfolder import layout
from tests.userdata.cluster import Cluster, cluster_trainer_uri
from tests.userdata.helpers import group_size, machine_events, s3_keys


@pytest.mark.slow
def test_a_worker_that_ends_before_the_chief_waits_for_the_end_marker(tmp_path, s3_run):
    # The chief exports the model for a few seconds after the last step; worker 1 has ended
    # by then. It waits for the chief's COMPLETE and finishes the same way: no failure, no
    # restart, each machine finishes once.
    c = Cluster(tmp_path, s3_run, make_group(s3_run, 2), cluster_trainer_uri(s3_run), nodes=2,
                env={"TRAINSTACK_STEPS": "20", "TRAINSTACK_MAX_FAILURES": "1"}, box_env={"FAKE_EXPORT_S": "6"})
    try:
        boxes = [c.boot(), c.boot()]
        workers = c.wait_generation(0, 90)
        codes = c.wait_all(150)
        assert codes == [0, 0], c.journals()
        worker1 = next(b for b in boxes if b.endpoint == workers[1])
        assert "waiting for the chief" in worker1.journal()
        objects = c.keys()
        assert layout.COMPLETE in objects and layout.FAILED not in objects, sorted(objects)
        for box in boxes:
            assert box.exits() == [0], box.journal()  # not restarted
            assert set(box.failures_counted()) == {0}
            assert [(e["event"], e["outcome"]) for e in machine_events(s3_run, box.instance_id)] == [
                ("finish", "COMPLETE")]
            assert box.argvs("shutdown") == [["-h", "now"]]
        assert group_size(s3_run, c.group) == (0, 0, 0)
    finally:
        c.close()


@pytest.mark.slow
def test_waiting_for_a_missing_peer_is_no_failure_and_ends_at_the_deadline(machines, s3_run, code_uri):
    # Two machines asked for, one there (its peer was taken, no spot capacity for a
    # replacement): it waits in the rendezvous, heartbeating, with no failure counted and
    # no trainer started; the run's deadline ends it. The deadline runs from the boot's
    # start, so it leaves room for a slow boot to reach the rendezvous and heartbeat.
    name = make_group(s3_run, 1)
    box = machines(s3_run, name, code_uri, env_overrides={
        "TRAINSTACK_NODES": "2", "TRAINSTACK_MAX_FAILURES": "1", "TRAINSTACK_MAX_RUNTIME_S": "40"})
    box.env.update({"TRAINSTACK_CLUSTER_POLL_S": "3"})
    assert box.boot(watcher=False).wait(timeout=120) == 0, box.journal()
    objects = s3_keys(s3_run)
    assert layout.FAILED not in objects, objects.get(layout.FAILED)
    assert json.loads(objects[layout.TIMED_OUT])[layout.MARKER_REASON] == (
        "the run's deadline passed while waiting for the other machines")
    members = [k for k in objects if k.startswith(f"{layout.RENDEZVOUS_PREFIX}gen-0/members/{INSTANCE_ID}-")]
    assert len(members) == 1 and json.loads(objects[members[0]])["endpoint"] == "10.0.0.10:2222"
    assert not [k for k in objects if k.endswith("/sealed")]
    assert [a for a in box.argvs("docker") if a[0] == "run" and a[-3:] == ["python", "-m", "trainer"]] == []
