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


def test_the_real_trainer_survives_a_noticed_worker_then_a_noticed_chief(cluster, code_uri):
    # Two machines. Worker 1 gets a spot notice: both trainers stop after the same step,
    # which is committed; the group brings a replacement (a new address); generation 1
    # forms and resumes from that step. Then the chief gets a notice, and its replacement's
    # address sorts before the survivor's: generation 2 takes its order from its sealed
    # record all the same. The run ends COMPLETE; no machine counted a failure.
    settings = settings_for(steps=400, checkpointEverySteps=20, batchSize=16)
    c = cluster(2, code_uri=code_uri, settings=settings, env={"TRAINSTACK_MAX_FAILURES": "1"})
    a, b = c.boot(), c.boot()
    first = c.wait_generation(0, 90)
    wait_for(lambda: c.committed(), 180, "a first committed checkpoint")
    victim = next(m for m in (a, b) if m.endpoint == first[1])
    survivor = a if victim is b else b
    c.notice(victim)
    step1 = stopped_together(c, [a, b], timeout=120)
    wait_for(lambda: "waiting for the cloud" in victim.journal(), 30, "the worker to wait for the cloud")
    c.take(victim)
    new = c.boot()
    second = c.wait_generation(1, 90)
    assert sorted(second) == sorted([survivor.endpoint, new.endpoint])
    wait_for(lambda: c.committed()[-1] > step1, 180, "a checkpoint of generation 1")

    chief = next(m for m in (survivor, new) if m.endpoint == second[0])
    other = new if chief is survivor else survivor
    c.notice(chief)
    step2 = stopped_together(c, [chief, other], timeout=120)
    assert step2 > step1
    wait_for(lambda: "waiting for the cloud" in chief.journal(), 30, "the chief to wait for the cloud")
    c.take(chief)
    first_in_order = c.boot(address="127.0.0.5")
    third = c.wait_generation(2, 90)
    assert third == [first_in_order.endpoint, other.endpoint]  # the replacement is the new chief

    assert_complete_without_failures(c, timeout=300)
    assert [e["step"] for e in c.events() if e["event"] == "resumed"] == [step1, step2]
    c.assert_one_list_per_generation()
