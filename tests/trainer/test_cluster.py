"""Several workers on 127.0.0.1: a cluster that cannot form ends in bounded time (75), a lost peer ends in 76.

Real trainer processes with `TF_CONFIG`; the peer that "never starts" is a port nobody
listens on, the peer "taken" mid-training is SIGKILLed (no notice, as a reclaimed machine).
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import pytest

from devtools.servers import free_ports
from runfolder import exits, layout
from runfolder.events import read_jsonl
from runfolder.storage import open_store
from tests.trainer.helpers import Trainer, store_events, trainer_env
from trainer import cluster


def _tf_config(workers: list[str], index: int) -> str:
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def _kill_all(procs) -> None:
    for p in procs:
        if p.proc.poll() is None:
            p.proc.kill()


# -- the pieces --


def test_watchdog_fires_once_when_not_disarmed_and_never_after_disarm():
    fired = []
    late = cluster.StartupWatchdog(0.2, lambda: fired.append("late")).start()
    early = cluster.StartupWatchdog(0.2, lambda: fired.append("early")).start()
    assert late.armed and early.armed
    early.disarm()
    # Each watchdog's thread ends once it has fired or seen its disarm: wait for those ends, not
    # for a guessed time.
    for dog in (late, early):
        dog._thread.join(30)
        assert not dog._thread.is_alive()
    assert fired == ["late"] and not early.armed


def test_unreachable_names_only_the_ports_where_nothing_listens():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = f"127.0.0.1:{listening.getsockname()[1]}"
        down = f"127.0.0.1:{free_ports(1)[0]}"
        assert cluster.unreachable([up, down, "no-port"], timeout=1) == [down, "no-port"]


def test_peer_loss_and_its_message_are_told_apart_from_other_errors():
    import tensorflow as tf

    msg = ("Graph execution error:\n\nDetected at node while/CollectiveReduceV2_1 defined at:\n"
           '  File "loop.py", line 154, in train_steps\n\n'
           "Collective ops is aborted by: The following tasks are unhealthy (stopped sending heartbeats):\n"
           "/job:worker/replica:0/task:1\nThe tasks have crashed.\n\t [[{{node while/CollectiveReduceV2_1}}]]")
    err = tf.errors.UnavailableError(None, None, msg)
    assert cluster.peer_loss(err)
    assert not cluster.peer_loss(tf.errors.InvalidArgumentError(None, None, "bad shape"))
    assert not cluster.peer_loss(ValueError("no"))
    workers = ["10.0.0.1:2222", "10.0.0.2:2222"]
    assert cluster.lost_peers(err, workers, own_index=0) == ["10.0.0.2:2222"]
    assert cluster.lost_peers(err, workers, own_index=1) == []  # a message naming only itself names no peer
    brief = cluster.brief_error(err)
    assert brief.startswith("UnavailableError: Collective ops is aborted by: The following tasks are unhealthy")
    assert "File " not in brief and "Detected at node" not in brief


NATIVE = """
import re, sys, threading
from trainer.cluster import NativeDeadline
threading.Timer(0.2, lambda: print("python ran", flush=True)).start()
deadline = NativeDeadline(0.5, 75)
assert deadline.ok
if sys.argv[1] == "cancel":
    deadline.cancel()
    sys.exit(0)
# Catastrophic backtracking: one C call that never releases the GIL (as TensorFlow's start-up).
re.match(r"(a+)+$", "a" * 40 + "b")
print("not reached", flush=True)
"""


@pytest.mark.parametrize("mode, code", [("fire", 75), ("cancel", 0)])
def test_the_native_deadline_ends_a_process_whose_python_cannot_run(mode, code):
    import subprocess
    import sys

    from tests.trainer.helpers import REPO

    started = time.monotonic()
    p = subprocess.run([sys.executable, "-c", NATIVE, mode], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == code, p.stderr
    if mode == "fire":
        assert time.monotonic() - started < 30
        # The Python timer never got the GIL: only the native deadline could end it.
        assert "python ran" not in p.stdout and "not reached" not in p.stdout


def test_a_stuck_store_does_not_keep_a_dying_worker_alive():
    entered, released = threading.Event(), threading.Event()

    class Stuck:
        def append_line(self, key, line):
            entered.set()
            released.wait(60)

    assert not cluster.record_worker_event(Stuck(), "10.0.0.2:2222", {"event": "failed"}, timeout=0.3)
    # It gave up while the store's call was still stuck (released only now): an order, which a
    # loaded machine cannot change, instead of a time it can.
    assert entered.is_set() and not released.is_set()
    released.set()


# -- real trainers --

ARGS = ["--synthetic", "--steps", "100000", "--batch-size", "16", "--checkpoint-every-steps", "50",
        "--log-every", "10"]


@pytest.mark.slow
def test_a_worker_whose_peer_never_starts_exits_75_within_the_timeout_and_says_whom_it_waited_for(tmp_path):
    # Two runs at once, each with only one of its two workers started: the chief alone (it
    # records in events.jsonl) and worker 1 alone (it records in its own worker-events object).
    timeout = 20
    chief_run, other_run = f"file://{tmp_path}/chief", f"file://{tmp_path}/other"
    a = [f"127.0.0.1:{p}" for p in free_ports(2)]
    b = [f"127.0.0.1:{p}" for p in free_ports(2)]
    started = time.monotonic()
    procs = [Trainer(chief_run, *ARGS, "--startup-timeout", str(timeout), env=trainer_env(TF_CONFIG=_tf_config(a, 0))),
             Trainer(other_run, *ARGS, env=trainer_env(TF_CONFIG=_tf_config(b, 1), TRAINSTACK_STARTUP_TIMEOUT=str(timeout)))]
    try:
        codes = [p.wait(timeout=180) for p in procs]
    finally:
        _kill_all(procs)
    elapsed = time.monotonic() - started
    assert codes == [exits.NO_CLUSTER] * 2, [p.stderr[-2000:] for p in procs]
    # TF's import and start-up come first (~10 s here); the wait itself is the timeout.
    assert timeout <= elapsed < timeout + 90
    chief, other = procs
    other_store = open_store(other_run)
    recorded = read_jsonl(other_store, layout.worker_events_key(b[1]))
    for proc, missing in ((chief, a[1]), (other, b[0])):
        failed = [e for e in proc.events if e["event"] == "failed"]
        # One CI run under load saw a process exit 75 with nothing on its stdout: say what its run
        # recorded, its stderr and the time, so that a recurrence shows which side lost the event.
        assert len(failed) == 1, json.dumps({"stdout_events": proc.events, "elapsed_s": round(elapsed, 1),
                                             "chief_store": store_events(chief_run), "worker_1_store": recorded,
                                             "stderr": proc.stderr[-3000:]}, indent=1, default=str)
        assert failed[0]["exit_code"] == 75 and failed[0]["waited_for"] == [missing]
        assert failed[0]["unreachable"] == [missing] and missing in failed[0]["reason"]
        assert "--startup-timeout 20 s" in failed[0]["reason"]
        assert not any(e["event"] == "started" for e in proc.events)
    assert [e["event"] for e in store_events(chief_run)] == ["failed"]
    assert store_events(other_run) == []  # not the chief: events.jsonl is not its to write
    assert [(e["event"], e["exit_code"], e["address"]) for e in recorded] == [("failed", 75, b[1])]


@pytest.mark.slow
def test_a_stop_signal_while_waiting_for_peers_ends_the_wait_at_once_with_143(file_run):
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    proc = Trainer(file_run.uri, *ARGS, "--startup-timeout", "600", env=trainer_env(TF_CONFIG=_tf_config(workers, 0)))
    try:
        # The peer wait is under way once the chief listens on its own port (its peer never
        # comes): wait for that, however long TF's import takes on this machine.
        deadline = time.monotonic() + 240
        while cluster.unreachable([workers[0]], timeout=0.5):
            assert proc.proc.poll() is None, proc.stderr[-2000:]
            assert time.monotonic() < deadline, "the chief never began its peer wait"
            time.sleep(0.2)
        proc.signal(signal.SIGTERM)
        # The wait it ends would last 600 s (--startup-timeout): ending within 60 s is "at once"
        # on a loaded machine too.
        rc = proc.wait(timeout=60)
    finally:
        _kill_all([proc])
    assert rc == exits.PREEMPTED, proc.stderr[-2000:]
    (pre,) = [e for e in proc.events if e["event"] == "preempted"]
    assert pre["step"] == 0 and pre["signal"] == "SIGTERM"


@pytest.mark.slow
def test_a_peer_that_answers_but_never_joins_still_ends_the_wait_with_75(file_run):
    # The peer's port accepts connections (a stale process, or a worker of another cluster)
    # but no TensorFlow worker joins: the chief's wait inside TensorFlow holds the GIL, and
    # only the native deadline ends it, at --startup-timeout + 45 s.
    with socket.socket() as peer:
        peer.bind(("127.0.0.1", 0))
        peer.listen(16)
        workers = [f"127.0.0.1:{free_ports(1)[0]}", f"127.0.0.1:{peer.getsockname()[1]}"]
        started = time.monotonic()
        chief = Trainer(file_run.uri, *ARGS, "--startup-timeout", "5", env=trainer_env(TF_CONFIG=_tf_config(workers, 0)))
        try:
            rc = chief.wait(timeout=240)
        finally:
            _kill_all([chief])
    assert rc == exits.NO_CLUSTER, chief.stderr[-2000:]
    assert 5 + 45 <= time.monotonic() - started < 5 + 45 + 90
    assert not any(e["event"] == "started" for e in chief.events)


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0], ids=["worker-killed", "chief-killed"])
def test_a_peer_killed_mid_training_ends_the_survivor_with_76_not_a_hang(file_run, victim):
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = [Trainer(file_run.uri, *ARGS, env=trainer_env(TF_CONFIG=_tf_config(workers, i))) for i in range(2)]
    survivor = procs[1 - victim]
    try:
        procs[0].wait_event("checkpoint", timeout=300)
        procs[victim].signal(signal.SIGKILL)
        killed = time.monotonic()
        rc = survivor.wait(timeout=120)  # heartbeats: ~10 s for a silent peer, at once for a reset connection
        waited = time.monotonic() - killed
    finally:
        _kill_all(procs)
    assert rc == exits.PEER_LOST, survivor.stderr[-3000:]
    assert waited < 60
    failed = [e for e in survivor.events if e["event"] == "failed"]
    assert len(failed) == 1 and failed[0]["exit_code"] == 76
    assert failed[0]["lost"] in ([workers[victim]], [])  # named when TF's message names it
    assert "a peer was lost after step" in failed[0]["reason"]
    if victim == 1:  # the chief commits, so it knows the step a resume starts from
        assert failed[0]["committed_step"] >= 50
    assert "File " not in failed[0]["reason"]
    store = open_store(file_run.uri)
    if victim == 1:  # the chief survived: its own log has the failure
        assert [e["event"] for e in store_events(file_run.uri)][-1] == "failed"
        assert store.list(layout.WORKER_EVENTS_PREFIX) == []
    else:  # worker 1 survived: its own object has it, the chief's log does not
        assert "failed" not in [e["event"] for e in store_events(file_run.uri)]
        recorded = read_jsonl(store, layout.worker_events_key(workers[1]))
        assert [(e["event"], e["exit_code"]) for e in recorded] == [("failed", 76)]


# -- the all-reduce really runs --

EQ_MODEL = '''
"""A small MLP without dropout: replicas draw no random masks, so 1 and 2 workers can agree exactly."""
import keras

from trainer import data as data_mod
from trainer.models import ModelSpec


def build(config):
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    return ModelSpec(model=model, loss=keras.losses.SparseCategoricalCrossentropy(reduction=None),
                     # Plain SGD: the update is linear in the gradient, so float round-off stays round-off.
                     optimizer=keras.optimizers.SGD(learning_rate=0.1),
                     synthetic=lambda seed: data_mod.synthetic_mnist(2048, seed), name="eqnet")
'''


@pytest.mark.slow
def test_two_workers_end_with_the_weights_of_one_worker_with_the_same_global_batch(tmp_path):
    from tests.trainer.helpers import committed_weights, max_abs_diff, run_trainer

    code = tmp_path / "code"
    code.mkdir()
    (code / "eqnet.py").write_text(EQ_MODEL)
    steps = 20
    common = ["--model", "eqnet:build", "--code-dir", str(code), "--synthetic", "--steps", str(steps),
              "--checkpoint-every-steps", str(steps), "--log-every", "5", "--steps-per-call", "5",
              "--seed", "3", "--deterministic"]
    one, alone, two = (f"file://{tmp_path}/{n}" for n in ("one", "alone", "two"))
    rc, _, err = run_trainer(one, *common, "--batch-size", "32")
    assert rc == 0, err[-2000:]
    # What a worker would reach if gradients were not all-reduced: its own half of each global batch.
    rc, _, err = run_trainer(alone, *common, "--batch-size", "16")
    assert rc == 0, err[-2000:]
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = [Trainer(two, *common, "--batch-size", "16", env=trainer_env(TF_CONFIG=_tf_config(workers, i)))
             for i in range(2)]
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        _kill_all(procs)
    assert codes == [0, 0], [p.stderr[-2000:] for p in procs]
    started = [e for e in procs[0].events if e["event"] == "started"][0]
    assert started["workers"] == 2 and started["global_batch"] == 32

    w_one = committed_weights(one, steps, tmp_path / "w-one")
    w_two = committed_weights(two, steps, tmp_path / "w-two")
    w_alone = committed_weights(alone, steps, tmp_path / "w-alone")
    assert max_abs_diff(w_one, w_two) < 1e-5
    # The comparison can tell: without the all-reduce the weights are far apart.
    assert max_abs_diff(w_one, w_alone) > 1e-3
