"""Chaos: an 800-step run against moto_server stopped at random points ends COMPLETE, bit-for-bit.

SIGTERM three times (and, in one variant, SIGKILL once) at seeded random points; each
time the run is started again, as the group would relaunch a preempted machine. With
`--deterministic` the final weights equal those of a run never stopped (max |Δ| ≤ 1e-6),
and the examples seen are the same.
"""

from __future__ import annotations

import json
import random
import signal

import pytest

from tests.trainer.helpers import Trainer, committed_weights, max_abs_diff, run_trainer, trainer_env

pytestmark = pytest.mark.slow

STEPS = 800
ARGS = ["--synthetic", "--deterministic", "--steps", str(STEPS), "--batch-size", "32", "--seed", "11",
        "--checkpoint-every-steps", "25", "--log-every", "25"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Final weights and COMPLETE of the same run, never interrupted."""
    root = tmp_path_factory.mktemp("reference")
    uri = f"file://{root}/runs/ref"
    rc, events, err = run_trainer(uri, *ARGS)
    assert rc == 0, err[-3000:]
    from runfolder.storage import open_store

    done = json.loads(open_store(uri).get_bytes("COMPLETE"))
    return committed_weights(uri, STEPS, root / "weights"), done


@pytest.mark.parametrize("kills", [("TERM", "TERM", "TERM"), ("TERM", "TERM", "TERM", "KILL")], ids=["sigterm", "mixed"])
def test_stopped_run_matches_uninterrupted(kills, s3_run, reference, tmp_path):
    rng = random.Random(len(kills))
    order = list(kills)
    rng.shuffle(order)
    # In the first third: the stop lands before the run's end whatever the loop's speed.
    targets = sorted(rng.sample(range(30, 250, 10), len(order)))
    env = trainer_env(s3_run.env)
    codes, last_target = [], 0
    for sig_name, target in zip(order, targets, strict=True):
        # A random point: a random moment after the first checkpoint at or past the target, timed in
        # the trainer itself (tests/trainer/signalled_trainer.py): a loaded machine that reads the
        # trainer's reports late cannot let it run on past the point, or to its end.
        at = f"{target}:{sig_name}:{rng.uniform(0, 0.1):.3f}"
        t = Trainer(s3_run.uri, *ARGS, "--signal-at", at, env=env, module="tests.trainer.signalled_trainer")
        rc = t.wait()
        codes.append(rc)
        if sig_name == "TERM":
            assert rc == 143, t.stderr[-3000:]
            assert t.events[-1]["event"] == "preempted"
            assert t.events[-1]["step"] < STEPS, t.events[-1]
        else:
            assert rc == -signal.SIGKILL, t.stderr[-3000:]
        last_target = target
    assert last_target < STEPS

    rc, events, err = run_trainer(s3_run.uri, *ARGS, env=env)
    assert rc == 0, err[-3000:]
    assert codes == [143 if k == "TERM" else -9 for k in order]
    from runfolder.storage import open_store

    done = json.loads(open_store(s3_run.uri).get_bytes("COMPLETE"))
    ref_weights, ref_done = reference
    assert done["step"] == STEPS and done["attempts"] == len(order) + 1
    assert done["examples_seen"] == ref_done["examples_seen"] == STEPS * 32
    diff = max_abs_diff(committed_weights(s3_run.uri, STEPS, tmp_path / "weights"), ref_weights)
    assert diff <= 1e-6, diff
