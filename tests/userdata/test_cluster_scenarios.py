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

import time

import pytest

from devtools.sandbox import make_group, settings_for
from runfolder import layout
from tests.userdata.cluster import Cluster, cluster_trainer_uri
from tests.userdata.helpers import group_size, machine_events, wait_for

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


def notice_and_stop(c: Cluster, victim, boxes, timeout: float = 90) -> int:
    """Serves `victim` a spot notice; waits until each of `boxes` has one more trainer exit,
    a 143; the step all stopped at."""
    seen = {box.number: len(box.exits()) for box in boxes}
    c.notice(victim)
    for box in boxes:
        wait_for(lambda b=box: len(b.exits()) > seen[b.number], timeout, f"machine {box.number}'s trainer to stop")
        assert box.exits()[seen[box.number]] == 143, (box.number, box.exits())
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
    step1 = notice_and_stop(c, victim, [a, b], timeout=120)
    wait_for(lambda: "waiting for the cloud" in victim.journal(), 30, "the worker to wait for the cloud")
    c.take(victim)
    new = c.boot()
    second = c.wait_generation(1, 90)
    assert sorted(second) == sorted([survivor.endpoint, new.endpoint])
    wait_for(lambda: c.committed()[-1] > step1, 180, "a checkpoint of generation 1")

    chief = next(m for m in (survivor, new) if m.endpoint == second[0])
    other = new if chief is survivor else survivor
    step2 = notice_and_stop(c, chief, [chief, other], timeout=120)
    assert step2 > step1
    wait_for(lambda: "waiting for the cloud" in chief.journal(), 30, "the chief to wait for the cloud")
    c.take(chief)
    first_in_order = c.boot(address="127.0.0.5")
    third = c.wait_generation(2, 90)
    assert third == [first_in_order.endpoint, other.endpoint]  # the replacement is the new chief

    assert_complete_without_failures(c, timeout=300)
    assert [e["step"] for e in c.events() if e["event"] == "resumed"] == [step1, step2]
    c.assert_one_list_per_generation()


def test_three_machines_survive_three_losses_in_a_row_with_the_stand_in(cluster):
    # One failure allowed: any exit counted as this machine's failure would end the run FAILED.
    c = cluster(3, env={"TRAINSTACK_STEPS": "400", "TRAINSTACK_CHECKPOINT_EVERY_STEPS": "10",
                        "TRAINSTACK_MAX_FAILURES": "1"},
                # Machines here see a seal up to several seconds apart (a poll is a few CLI calls).
                box_env={"TRAINSTACK_STARTUP_TIMEOUT": "12", "FAKE_STEP_S": "0.05"})
    boxes = [c.boot(), c.boot(), c.boot()]
    by_endpoint = lambda e: next(m for m in c.machines if m.endpoint == e)  # noqa: E731
    first = c.wait_generation(0, 90)
    assert sorted(first) == sorted(m.endpoint for m in boxes)
    wait_for(lambda: c.committed(), 60, "a first committed checkpoint")

    # 1. Worker 1 is gone at once (SIGKILL, no notice): the others' trainers lose their peer
    #    (exit 76) and wait in generation 1. The replacement comes late, later than the
    #    trainer's start-up timeout (the old supervisor counted such a wait as a failure);
    #    waiting in the rendezvous starts no trainer and costs no failure.
    c.take(by_endpoint(first[1]))
    survivors = [by_endpoint(first[0]), by_endpoint(first[2])]
    for box in survivors:
        wait_for(lambda b=box: "joining the next generation after 0" in b.journal(), 60, "a survivor to rejoin")
    assert all(b.exits() == [76] for b in survivors), [b.exits() for b in survivors]
    time.sleep(16)  # the replacement's delay
    assert 1 not in c.sealed() and all(b.exits() == [76] for b in survivors)  # no trainer started meanwhile
    late = c.boot()
    second = c.wait_generation(1, 90)
    assert sorted(second) == sorted([*(b.endpoint for b in survivors), late.endpoint])
    step = c.committed()[-1]
    wait_for(lambda: c.committed()[-1] > step, 60, "a checkpoint of generation 1")

    # 2. The chief gets a notice: all three stop after one committed step; the replacement's
    #    address sorts first, and it is the chief of generation 2 because the sealed record says so.
    chief = by_endpoint(second[0])
    rest = [by_endpoint(e) for e in second[1:]]
    step2 = notice_and_stop(c, chief, [chief, *rest])
    wait_for(lambda: "waiting for the cloud" in chief.journal(), 30, "the chief to wait for the cloud")
    c.take(chief)
    first_in_order = c.boot(address="127.0.0.5")
    third = c.wait_generation(2, 90)
    assert third[0] == first_in_order.endpoint and sorted(third[1:]) == sorted(b.endpoint for b in rest)

    # 3. The new chief is gone the moment generation 2 is sealed: its peers' trainers cannot
    #    form the cluster (75 after the start-up timeout) or lose it (76); a later generation
    #    forms with its replacement.
    c.take(first_in_order)
    last = c.boot()
    assert_complete_without_failures(c, timeout=150)
    c.assert_one_list_per_generation()
    final = c.sealed()[max(c.sealed())]
    assert max(c.sealed()) >= 3 and sorted(final) == sorted([*(b.endpoint for b in rest), last.endpoint])
    resumed = [e["step"] for e in c.events() if e["event"] == "resumed"]
    # Generation 2 never trained: every later generation resumed from the chief's notice step.
    assert resumed[0] == step and set(resumed[1:]) == {step2}, resumed
    for box in rest:
        assert set(box.exits()) <= {0, 75, 76, 143} and box.exits()[-1] == 0, box.exits()
