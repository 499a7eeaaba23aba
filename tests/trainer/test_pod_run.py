"""A pod-like run: `python -m trainer.pod` as the stack's Job runs it, evicted twice by spot node shutdowns, ends
COMPLETE with the weights of a run never stopped, and the Job (the fake controller, with the stack's own
manifest) counts no failure.

Each pod has what the Job gives it: the downward API's name, namespace and node, and its completion index. Each
eviction is what the kubelet's graceful node shutdown does: the DisruptionTarget condition, SIGTERM, and the
trainer's exit 143 after its checkpoint commits.
"""

from __future__ import annotations

import json
import signal

import pytest

from components.kubernetes.stack import job_manifest
from ops import synth
from runfolder import environment, layout
from runfolder.storage import open_store
from tests.components.kubernetes.fake_controller import FakeJob, disrupted
from tests.trainer.helpers import Trainer, committed_weights, max_abs_diff, run_trainer, trainer_env
from trainer import pod as pod_module

pytestmark = pytest.mark.slow

STEPS = 400
ARGS = ["--synthetic", "--deterministic", "--steps", str(STEPS), "--batch-size", "32", "--seed", "11",
        "--checkpoint-every-steps", "20", "--log-every", "20"]


def test_a_pod_evicted_twice_resumes_exactly_and_the_job_counts_no_failure(tmp_path):
    ref = f"file://{tmp_path}/ref/runs/ref"
    rc, _events, err = run_trainer(ref, *ARGS)
    assert rc == 0, err[-3000:]

    settings = synth.load_source(synth.STACKS_DIR / "Pulumi.eks.yaml").settings
    uri = f"file://{tmp_path}/bucket/runs/eks"
    job = FakeJob(job_manifest(settings, uri))
    namespace = job.manifest["metadata"]["namespace"]

    def pod_env(p):
        return trainer_env(**{environment.MACHINE_ID: p.name, environment.POD_NAMESPACE: namespace,
                              environment.NODE_NAME: f"node-{p.name[-5:]}", pod_module.COMPLETION_INDEX: str(p.index)})

    names, stopped_at = [], []
    # Early in the run: a loaded machine can read a checkpoint's report late enough for the loop to finish first.
    for target in (20, 100):
        p = job.pods[0]
        names.append(p.name)
        t = Trainer(uri, *ARGS, env=pod_env(p), module="trainer.pod")
        t.wait_event("checkpoint", pred=lambda e, tg=target: e["step"] >= tg)
        t.signal(signal.SIGTERM)
        code = t.wait()
        assert code == 143, t.stderr[-3000:]
        stopped_at.append(t.events[-1]["step"])
        assert job.pod_failed(disrupted(p, "TerminationByKubelet", {"trainer": code})) == "Ignore"
    assert stopped_at[0] < stopped_at[1] < STEPS

    last = job.pods[0]
    t = Trainer(uri, *ARGS, env=pod_env(last), module="trainer.pod")
    assert t.wait() == 0, t.stderr[-3000:]
    job.pod_succeeded(0)
    assert job.finished == "Complete" and job.status["failed"] == 0 and job.ignored == 2
    assert len({*names, last.name}) == 3

    store = open_store(uri)
    done = json.loads(store.get_bytes("COMPLETE"))
    assert done["step"] == STEPS and done["attempts"] == 3
    # Each pod said which it was, in its own event object (the dashboard's lanes, ops status's events).
    assert sorted(store.list(layout.MACHINE_EVENTS_PREFIX)) == sorted(
        layout.machine_events_key(name) for name in [*names, last.name])
    # The last pod held the run's lease under its own name (the downward API's).
    assert json.loads(store.get_bytes(layout.LEASE_KEY))["holder"].startswith(f"{last.name}/")
    diff = max_abs_diff(committed_weights(uri, STEPS, tmp_path / "w"), committed_weights(ref, STEPS, tmp_path / "r"))
    assert diff <= 1e-6, diff
