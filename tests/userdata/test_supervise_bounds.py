"""Every wait of the supervisor has a bound, and every ending a reason: the real scripts in the
boot sandbox, with a stand-in trainer (`WAYS`) that ends the way each case needs.

- A bucket that does not answer for a while at boot is waited out; one that stays
  unreadable past `TRAINSTACK_STORE_WAIT_S` ends the run with the group at zero.
- A lease another machine keeps (exit 77) is tried again after a growing pause, and after
  `TRAINSTACK_LEASE_HELD_S` this machine's group stands down without an end marker.
- Machines of several waiting for peers that do not come end the run FAILED after
  `TRAINSTACK_PEER_WAIT_S`, and say so in their events first.
- A cluster that forms generation after generation and never trains (exit 75) ends FAILED
  after `TRAINSTACK_MAX_IDLE_GENERATIONS`.
Every wait below polls for what the machine does, with a generous timeout.
"""

from __future__ import annotations

import json
import time

import pytest

from devtools.metadata import INSTANCE_ID
from devtools.sandbox import make_group
from runfolder import layout
from tests.userdata.cluster import Cluster, upload_code
from tests.userdata.helpers import group_size, machine_events, s3_keys, wait_for

pytestmark = pytest.mark.slow

WAYS = '''\
"""A stand-in trainer: ends as FAKE_TRAINER says."""
import json, os, sys

way = os.environ["FAKE_TRAINER"]
if way == "cancel":  # asked to stop: CANCELLED written, exit 0
    import boto3

    bucket, _, prefix = os.environ["TRAINSTACK_RUN_URI"].removeprefix("s3://").partition("/")
    boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).put_object(
        Bucket=bucket, Key=prefix + "/CANCELLED", Body=json.dumps({"step": 0, "attempts": 1}).encode())
    sys.exit(0)
sys.exit({"lease-held": 77, "no-cluster": 75}[way])
'''
ENDINGS = set(layout.END_MARKERS)


@pytest.fixture
def ways_uri(s3_run) -> str:
    return upload_code(s3_run, {"trainer/__init__.py": "", "trainer/__main__.py": WAYS})


def _trainer_runs(box) -> list[list[str]]:
    return [a for a in box.argvs("docker") if a[0] == "run" and a[-3:] == ["python", "-m", "trainer"]]


# -- the store at boot -----------------------------------------------------------------------


def test_a_bucket_that_does_not_answer_for_a_while_at_boot_is_waited_out(sandbox_factory, s3_run, ways_uri):
    # Longer than the old five quick tries, far shorter than the bound: the run goes on.
    box = sandbox_factory(code_uri=ways_uri)
    box.env["FAKE_TRAINER"] = "cancel"
    box.env["TRAINSTACK_RETRY_BASE_S"] = "1"  # the machines' pauses, doubling (the sandbox's 0 does not pause)
    (box.state / "s3-outage-until").write_text(str(time.time() + 15))
    assert box.boot(watcher=False).wait(timeout=180) == 0, box.journal()
    assert "failed: run_entries; retrying in" in box.journal()
    assert len(_trainer_runs(box)) == 1, box.journal()
    objects = s3_keys(s3_run)
    assert layout.CANCELLED in objects and not (ENDINGS - {layout.CANCELLED}) & set(objects), sorted(objects)


def test_a_deadline_that_cannot_be_written_for_a_while_at_first_boot_is_written_once_it_can(
        sandbox_factory, s3_run, ways_uri):
    # The listing answers, the deadline's write does not (for longer than five quick tries):
    # it is written once the bucket answers, whole (a retried pipe used to write nothing).
    box = sandbox_factory(code_uri=ways_uri, env_overrides={"TRAINSTACK_MAX_RUNTIME_S": "3600"})
    box.env["FAKE_TRAINER"] = "cancel"
    box.env["TRAINSTACK_RETRY_BASE_S"] = "1"
    (box.state / "s3-outage-only").write_text(f"/{layout.DEADLINE_KEY}")
    (box.state / "s3-outage-until").write_text(str(time.time() + 15))
    started = time.time()
    assert box.boot(watcher=False).wait(timeout=180) == 0, box.journal()
    assert "failed: write_deadline; retrying in" in box.journal()
    objects = s3_keys(s3_run)
    deadline = int(objects[layout.DEADLINE_KEY].decode())
    assert started + 3600 - 5 <= deadline <= time.time() + 3600, (deadline, started)
    assert layout.CANCELLED in objects and len(_trainer_runs(box)) == 1


def test_a_bucket_unreadable_past_the_bound_ends_the_run_with_the_group_at_zero(sandbox_factory, s3_run, group,
                                                                                 ways_uri):
    box = sandbox_factory(code_uri=ways_uri, env_overrides={"TRAINSTACK_STORE_WAIT_S": "5"})
    box.env["TRAINSTACK_RETRY_BASE_S"] = "1"
    (box.state / "s3-outage-until").write_text(str(time.time() + 3600))
    assert box.boot(watcher=False).wait(timeout=180) == 0, box.journal()
    assert "gave up after 5s: run_entries" in box.journal()
    assert f"cannot read the run folder {s3_run.uri}: no answer for 5s" in box.journal()
    # The marker cannot be written either, but no replacement boots into the same wait.
    assert group_size(s3_run, group) == (0, 0, 0) and box.argvs("shutdown") == [["-h", "now"]]
    assert _trainer_runs(box) == [] and not [a for a in box.argvs("docker") if a[0] == "pull"]


# -- a lease held elsewhere ------------------------------------------------------------------


def test_a_lease_held_elsewhere_is_retried_with_pauses_then_the_group_stands_down(sandbox_factory, s3_run, group,
                                                                                  ways_uri):
    box = sandbox_factory(code_uri=ways_uri, env_overrides={
        "TRAINSTACK_LEASE_RETRY_S": "1", "TRAINSTACK_LEASE_HELD_S": "20", "TRAINSTACK_MAX_RUNTIME_S": "120"})
    box.env["FAKE_TRAINER"] = "lease-held"
    assert box.boot(watcher=False).wait(timeout=240) == 0, box.journal()
    runs = _trainer_runs(box)
    # Pauses of 1, 2, 3 ... s: the 20 s bound is passed after at most six of them (21 s),
    # however quick each try is; the window leaves a slow machine room for the second pause.
    assert 2 <= len(runs) <= 7, (len(runs), box.journal()[-3000:])
    assert "trying again in 1s" in box.journal() and "trying again in 2s" in box.journal()
    # The run is the holder's: no end marker; this group is at zero and says why.
    objects = s3_keys(s3_run)
    assert not ENDINGS & set(objects), sorted(objects)
    assert group_size(s3_run, group) == (0, 0, 0) and box.argvs("shutdown") == [["-h", "now"]]
    finish = [e for e in machine_events(s3_run) if e["event"] == layout.MACHINE_FINISH]
    assert len(finish) == 1 and finish[0]["outcome"] == layout.CANCELLED, finish
    assert finish[0]["reason"].startswith("another machine held the run's lease for "), finish
    assert "stands down without an end marker" in finish[0]["reason"]


# -- several machines ------------------------------------------------------------------------


def test_machines_left_without_their_peers_end_the_run_failed_after_the_bound(machines, s3_run, ways_uri):
    # Two machines asked for, one came (no spot capacity for the other): it waits in the
    # rendezvous, says so in its events, and after TRAINSTACK_PEER_WAIT_S ends the run FAILED
    # with the reason, long before the run's deadline.
    name = make_group(s3_run, 1)
    box = machines(s3_run, name, ways_uri, env_overrides={
        "TRAINSTACK_NODES": "2", "TRAINSTACK_MAX_RUNTIME_S": "600", "TRAINSTACK_PEER_WAIT_S": "10"})
    box.env.update({"TRAINSTACK_CLUSTER_POLL_S": "1", "TRAINSTACK_RENDEZVOUS_TTL_S": "3"})
    box.boot(watcher=False)
    waiting = wait_for(lambda: [e for e in machine_events(s3_run) if e["event"] == layout.WAITING_FOR_MACHINES],
                       120, "the machine's waiting_for_machines event")
    assert (waiting[0]["generation"], waiting[0]["came"], waiting[0]["nodes"]) == (0, 1, 2), waiting
    assert box.wait(timeout=180) == 0, box.journal()
    objects = s3_keys(s3_run)
    assert layout.TIMED_OUT not in objects
    reason = json.loads(objects[layout.FAILED])[layout.MARKER_REASON]
    assert reason.startswith("the cluster did not form: 1 of 2 machines came to generation 0 in "), reason
    assert "to go on once there is capacity, delete FAILED and set the group back to 2 machines" in reason
    assert group_size(s3_run, name) == (0, 0, 0) and _trainer_runs(box) == []
    assert [e["event"] for e in machine_events(s3_run)] == [layout.WAITING_FOR_MACHINES, layout.MACHINE_FINISH]
    assert any(k.startswith(f"{layout.RENDEZVOUS_PREFIX}gen-0/members/{INSTANCE_ID}-") for k in objects)


def test_a_cluster_that_never_trains_ends_failed_after_idle_generations(tmp_path, s3_run, ways_uri):
    # Every generation seals, and every trainer exits 75 (the workers cannot reach each other:
    # a blocked port). Three generations without a newer checkpoint end the run, with the reason.
    c = Cluster(tmp_path, s3_run, make_group(s3_run, 2), ways_uri, nodes=2,
                env={"TRAINSTACK_MAX_IDLE_GENERATIONS": "3", "TRAINSTACK_MAX_RUNTIME_S": "300"},
                box_env={"FAKE_TRAINER": "no-cluster"})
    try:
        boxes = [c.boot(), c.boot()]
        assert c.wait_all(240) == [0, 0], c.journals()
        keys = c.keys()
        assert layout.TIMED_OUT not in keys, c.journals()
        reason = json.loads(c.get(layout.FAILED))[layout.MARKER_REASON]
        assert reason.startswith("the cluster formed 3 generations in a row without progress (last exit 75"), reason
        assert "check the worker port" in reason
        assert sorted(c.sealed()) == [0, 1, 2]
        for box in boxes:
            assert box.exits() == [75, 75, 75], box.journal()[-3000:]
            assert set(box.failures_counted()) == {0}
        assert group_size(s3_run, c.group) == (0, 0, 0)
    finally:
        c.close()
