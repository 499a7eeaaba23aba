"""Two and three machines at once, losing one: the real boot scripts, one group, one bucket.

Each machine has its own metadata service and loopback address (tests/userdata/cluster.py).
A machine is taken with a spot notice (the trainers stop together at one committed step)
or without one (SIGKILL); the group brings a replacement with a new address; a new
generation is sealed (userdata/rendezvous.sh) and training resumes from the committed
step to COMPLETE, with no failure counted on any machine and every machine finishing
once. The real trainer runs the main scenario and the chief-as-victim one; the stand-in
(tests/userdata/cluster_trainer.py) runs the variants where TensorFlow adds nothing but
minutes. Every wait has a timeout.
"""

from __future__ import annotations

import pytest

from tests.userdata.cluster import Cluster, cluster_trainer_uri
from tests.userdata.conftest import group_size, machine_events, make_group, settings_for, wait_for
from trainer import layout

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path, s3_run):
    """Makes a Cluster (`cluster(nodes, code_uri=..., **kw)`) on a fresh group; powers it off after."""
    made: list[Cluster] = []

    def make(nodes: int, code_uri: str | None = None, **kw) -> Cluster:
        group = make_group(s3_run, nodes)
        c = Cluster(tmp_path, s3_run, group, code_uri or cluster_trainer_uri(s3_run), nodes=nodes, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def assert_complete_without_failures(c: Cluster, timeout: float = 120) -> None:
    """Every live machine finishes once, COMPLETE; no machine counted a failure."""
    codes = c.wait_all(timeout)
    assert codes == [0] * len(codes), c.journals()
    keys = set(c.keys())
    assert layout.COMPLETE in keys and layout.FAILED not in keys, (sorted(keys), c.journals())
    for box in c.machines:
        assert set(box.failures_counted()) <= {0}, (box.number, box.failures_counted(), box.journal()[-3000:])
    for box in c.live():
        finishes = [e for e in machine_events(c.run, box.instance_id) if e["event"] == layout.MACHINE_FINISH]
        assert [e["outcome"] for e in finishes] == [layout.COMPLETE], (box.number, finishes)
    assert group_size(c.run, c.group) == (0, 0, 0)


def stopped_together(c: Cluster, boxes, timeout: float = 90) -> int:
    """Waits until each of `boxes` has a trainer exit of 143; the step all stopped at."""
    for box in boxes:
        wait_for(lambda b=box: 143 in b.exits(), timeout, f"machine {box.number}'s trainer to stop")
    preempted = [e["step"] for e in c.events() if e["event"] == "preempted"]
    assert preempted and preempted[-1] == c.committed()[-1], (preempted, c.committed())
    return preempted[-1]


def test_a_noticed_worker_is_replaced_and_training_resumes_with_the_stand_in(cluster):
    c = cluster(2, env={"TRAINSTACK_STEPS": "80", "TRAINSTACK_CHECKPOINT_EVERY_STEPS": "10"})
    a, b = c.boot(), c.boot()
    first = c.wait_generation(0, 60)
    assert sorted(first) == sorted([a.endpoint, b.endpoint])
    wait_for(lambda: c.committed(), 60, "a first committed checkpoint")
    victim = next(m for m in (a, b) if m.endpoint == first[1])  # worker 1
    c.notice(victim)
    step = stopped_together(c, [a, b])
    wait_for(lambda: "waiting for the cloud" in victim.journal(), 30, "the victim to wait for the cloud")
    c.take(victim)
    new = c.boot()
    second = c.wait_generation(1, 60)
    assert sorted(second) == sorted([m.endpoint for m in (a, b, new) if m is not victim])
    assert_complete_without_failures(c)
    assert [e["step"] for e in c.events() if e["event"] == "resumed"] == [step]


def test_a_noticed_worker_is_replaced_and_the_real_trainer_resumes(cluster, code_uri):
    settings = settings_for(steps=300, checkpointEverySteps=20, batchSize=16)
    c = cluster(2, code_uri=code_uri, settings=settings)
    a, b = c.boot(), c.boot()
    first = c.wait_generation(0, 90)
    wait_for(lambda: c.committed(), 180, "a first committed checkpoint")
    victim = next(m for m in (a, b) if m.endpoint == first[1])  # worker 1
    c.notice(victim)
    step = stopped_together(c, [a, b], timeout=120)
    wait_for(lambda: "waiting for the cloud" in victim.journal(), 30, "the victim to wait for the cloud")
    c.take(victim)
    new = c.boot()
    second = c.wait_generation(1, 90)
    assert sorted(second) == sorted([m.endpoint for m in (a, b, new) if m is not victim])
    assert_complete_without_failures(c, timeout=300)
    assert [e["step"] for e in c.events() if e["event"] == "resumed"] == [step]
