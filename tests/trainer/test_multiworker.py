"""Two worker processes on 127.0.0.1 (TF_CONFIG): MultiWorkerMirroredStrategy trains and stops together."""

from __future__ import annotations

import json
import signal

import pytest

from devtools.servers import free_ports
from tests.trainer.helpers import Trainer, trainer_env

pytestmark = pytest.mark.slow



def test_two_workers_train_and_stop_at_the_same_step_when_one_is_signalled(file_run):
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    # Checkpoints by time only: the chief's clock decides, the all-reduced request makes every worker save.
    args = ["--synthetic", "--steps", "100000", "--batch-size", "16", "--checkpoint-every-steps", "0",
            "--checkpoint-every-seconds", "1", "--log-every", "10"]
    procs = []
    for i in range(2):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
        procs.append(Trainer(file_run.uri, *args, env=trainer_env(file_run.env, TF_CONFIG=tf_config)))
    chief, other = procs
    try:
        started = chief.wait_event("started", timeout=240)
        assert started["workers"] == 2 and started["replicas"] == 2 and started["global_batch"] == 32
        first = chief.wait_event("checkpoint", timeout=240)["step"]
        chief.wait_event("checkpoint", timeout=60, pred=lambda e: e["step"] > first)
        # Only the non-chief gets the signal: the all-reduced request stops both after one step.
        other.signal(signal.SIGTERM)
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.proc.poll() is None:
                p.proc.kill()
    assert codes == [143, 143], [p.stderr[-2000:] for p in procs]
    stops = [[e for e in p.events if e["event"] == "preempted"] for p in procs]
    assert all(len(s) == 1 for s in stops), stops
    assert stops[0][0]["step"] == stops[1][0]["step"]
    step = stops[0][0]["step"]
    assert stops[0][0]["examples_seen"] == step * 32  # both workers' batches counted
    from trainer.checkpoints import CheckpointStore
    from trainer.storage import open_store

    store = open_store(file_run.uri)
    assert CheckpointStore(store).committed_steps()[-1] == step
    # Only the chief writes to the run: its checkpoint events, nobody else's.
    assert not any(e["event"] == "checkpoint" for e in other.events)
    stored = [json.loads(line) for line in store.get_bytes("events.jsonl").decode().splitlines()]
    assert [e["event"] for e in stored].count("started") == 1
