"""Whole runs of `python -m trainer` against file://, moto_server (S3) and the GCS emulator."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.trainer.helpers import FAST, kinds, run_trainer, store_events, trainer_env

pytestmark = pytest.mark.slow


def _store(uri):
    from runfolder.storage import open_store

    return open_store(uri)


def test_fresh_run_leaves_every_output_and_second_start_exits_at_once(run_root, tmp_path):
    store = _store(run_root.uri)
    # Configured through the environment alone, as on the machines (env file, no flags).
    env = trainer_env(
        run_root.env,
        TRAINSTACK_RUN_URI=run_root.uri,
        TRAINSTACK_SYNTHETIC="1",
        TRAINSTACK_STEPS="60",
        TRAINSTACK_BATCH_SIZE="32",
        TRAINSTACK_CHECKPOINT_EVERY_STEPS="20",
        TRAINSTACK_KEEP_CHECKPOINTS="2",
        TRAINSTACK_EXTRA_ARGS="--log-every 10 --seed 3",
    )
    import subprocess

    from tests.trainer.helpers import REPO, parse_events, trainer_command

    # `python -m trainer` with no arguments, forked from the warm trainer server (the plain
    # start-up has its own tests): the child reads the environment it was handed, as the
    # plain process reads its own.
    argv, env = trainer_command("trainer", [], env)
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    printed = parse_events(p.stdout)
    assert kinds(printed)[0] == "started" and kinds(printed)[-1] == "finished", kinds(printed)
    started = printed[0]
    assert started["config"]["steps"] == 60 and started["config"]["seed"] == 3 and started["config"]["log_every"] == 10
    assert all({"time", "attempt"} <= set(e) and e["attempt"] == 1 for e in printed)
    ckpts = [e for e in printed if e["event"] == "checkpoint"]
    steps = [e["step"] for e in ckpts]
    # A queued background upload may be superseded by a newer checkpoint; the last one is always committed.
    assert steps[-1] == 60 and steps == sorted(set(steps)) and set(steps) <= {20, 40, 60}, steps
    assert all(e["bytes"] > 0 and e["seconds"] >= 0 for e in ckpts)

    # The same events are in the bucket, in order.
    assert kinds(store_events(run_root.uri)) == kinds(printed)

    done = json.loads(store.get_bytes("COMPLETE"))
    assert done["step"] == 60 and done["attempts"] == 1
    assert done["examples_seen"] == 60 * 32
    assert done["seconds_lost_to_preemption"] == 0 and done["total_seconds"] > 0
    assert np.isfinite(done["metrics"]["loss"])

    keys = store.list("")
    committed = sorted(k for k in keys if k.endswith("/COMMITTED"))
    # keep=2: only the newest two committed checkpoints remain, and nothing uncommitted.
    assert committed == [f"checkpoints/ckpt-{s}/COMMITTED" for s in steps[-2:]], committed
    assert {k.split("/")[1] for k in keys if k.startswith("checkpoints/")} == {f"ckpt-{s}" for s in steps[-2:]}
    assert any(k.startswith("tensorboard/") and "tfevents" in k for k in keys), keys
    assert "model/saved_model.pb" in keys and "progress.json" in keys
    progress = json.loads(store.get_bytes("progress.json"))
    assert progress["total"] == 60 and 0 < progress["step"] <= 60

    # The SavedModel loads with plain TensorFlow and predicts class probabilities.
    import tensorflow as tf

    model_dir = tmp_path / "model"
    for k in keys:
        if k.startswith("model/"):
            (model_dir / k[len("model/"):]).parent.mkdir(parents=True, exist_ok=True)
            store.get_file(k, str(model_dir / k[len("model/"):]))
    loaded = tf.saved_model.load(str(model_dir))
    probs = loaded.serve(tf.random.uniform((5, 784))).numpy()
    assert probs.shape == (5, 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-4)

    # Started again after COMPLETE: exit 0 at once, nothing new in the run's log.
    rc, again, err = run_trainer(run_root.uri, *FAST, env=trainer_env(run_root.env))
    assert rc == 0, err[-2000:]
    assert kinds(again) == ["complete"] and again[0]["step"] == 60
    assert kinds(store_events(run_root.uri)) == kinds(printed)
