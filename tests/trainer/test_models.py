"""Models: the transformer LM with gradient accumulation, a user's own model module, the step itself."""

from __future__ import annotations

import json
import os
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.trainer.helpers import REPO, run_trainer, trainer_env
from trainer.config import load_config
from trainer.models import ModelSpec, build_model
from trainer.step import make_train_step


def _store(uri):
    from runfolder.storage import open_store

    return open_store(uri)


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch():
    keras.mixed_precision.set_global_policy("float32")
    strategy = tf.distribute.MirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 5)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")
    weights, losses = [], []
    for accum in (1, 2, 4):
        cfg = load_config(["--run-uri", "file:///unused", "--synthetic", "--batch-size", str(16 // accum),
                           "--grad-accum", str(accum)], {})
        keras.utils.set_random_seed(1)
        with strategy.scope():
            model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
            spec = ModelSpec(model=model, loss=keras.losses.MeanSquaredError(reduction=None),
                             optimizer=keras.optimizers.SGD(0.1))
            spec.optimizer.build(model.trainable_variables)
        examples = tf.Variable(0, dtype=tf.int64)
        step = make_train_step(strategy, spec, cfg, 16 // accum, False, examples)
        it = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors((x, y)).repeat()))
        step_losses, _ = step(it, tf.constant(1, tf.int64), tf.constant((0.0, 0.0, 0.0)))
        assert step_losses.shape == (1,)  # one loss per step of the call
        losses.append(float(step_losses[-1]))
        weights.append(np.concatenate([v.numpy().ravel() for v in model.trainable_variables]))
        assert int(examples.numpy()) == 16
    assert len(weights) == 3
    for w, loss in zip(weights[1:], losses[1:], strict=True):
        assert np.max(np.abs(w - weights[0])) < 1e-6
        assert abs(loss - losses[0]) < 1e-6
    assert not np.allclose(weights[0], 0)


def test_builtin_models_build_with_the_documented_shapes():
    keras.mixed_precision.set_global_policy("float32")
    cfg = load_config(["--run-uri", "file:///unused", "--synthetic", "--model", "transformer-lm", "--lm-layers", "1",
                       "--lm-dim", "16", "--lm-heads", "2", "--lm-seq-len", "8", "--lm-vocab", "32", "--lm-tied"], {})
    spec = build_model(cfg)
    out = spec.model(np.zeros((2, 8), dtype="int32"))
    assert out.shape == (2, 8, 32) and out.dtype == "float32"
    # Tied head: no separate output matrix of vocab x dim.
    assert not any(v.shape == (16, 32) for v in spec.model.trainable_variables)
    x, y = spec.synthetic(0)
    assert x.shape[1] == 8 and y.shape[1] == 8
    mlp = build_model(load_config(["--run-uri", "file:///unused", "--synthetic"], {}))
    assert mlp.model(np.zeros((3, 784), "float32")).shape == (3, 10)
    assert [type(layer).__name__ for layer in mlp.model.layers] == ["Dense", "Dropout", "Dense"]
    assert isinstance(mlp.optimizer, keras.optimizers.Adam)


@pytest.mark.slow
def test_the_digits_demo_learns_real_handwriting(file_run):
    # The README's demo: the seed's model on the UCI digits (trainer/digits.csv.gz), validated on its held-out fifth.
    from trainer.data import DIGITS_VALIDATION

    args = ["--model", "digits", "--steps", "400", "--checkpoint-every-steps", "200", "--eval-every-steps", "200"]
    rc, events, err = run_trainer(file_run.uri, *args, env=trainer_env(file_run.env))
    assert rc == 0, err[-3000:]
    evals = [e for e in events if e["event"] == "evaluated"]
    assert evals[-1]["step"] == 400 and evals[-1]["examples"] == DIGITS_VALIDATION
    done = json.loads(_store(file_run.uri).get_bytes("COMPLETE"))
    assert done["metrics"]["val_accuracy"] > 0.9, done["metrics"]  # a chance guess is 0.1
    assert done["signature"]["inputs"]["x"]["shape"] == [None, 64]


@pytest.mark.slow
def test_transformer_lm_trains_with_gradient_accumulation_and_exports(file_run, tmp_path):
    args = ["--model", "transformer-lm", "--synthetic", "--steps", "6", "--batch-size", "4", "--grad-accum", "2",
            "--lm-layers", "1", "--lm-dim", "32", "--lm-heads", "2", "--lm-seq-len", "16", "--lm-vocab", "64",
            "--checkpoint-every-steps", "3", "--log-every", "2"]
    rc, events, err = run_trainer(file_run.uri, *args, env=trainer_env(file_run.env))
    assert rc == 0, err[-3000:]
    assert events[0]["global_batch"] == 8 and events[0]["precision"] == "float32"
    store = _store(file_run.uri)
    done = json.loads(store.get_bytes("COMPLETE"))
    assert done["step"] == 6 and done["examples_seen"] == 6 * 8 and np.isfinite(done["metrics"]["loss"])
    model_dir = tmp_path / "model"
    for k in store.list("model/"):
        (model_dir / k[6:]).parent.mkdir(parents=True, exist_ok=True)
        store.get_file(k, str(model_dir / k[6:]))
    loaded = tf.saved_model.load(str(model_dir))  # keep a reference: serve needs its variables alive
    logits = loaded.serve(tf.zeros((2, 16), tf.int32)).numpy()
    assert logits.shape == (2, 16, 64) and np.all(np.isfinite(logits))


USER_MODULE = textwrap.dedent('''
    """A user's model module for the trainer tests."""
    import keras
    import numpy as np
    import tensorflow as tf

    from trainer.models import ModelSpec


    def regression(config):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])

        def make_dataset(batch_size, seed):
            rng = np.random.default_rng(seed)
            x = rng.normal(size=(256, 4)).astype("float32")
            y = x @ np.array([[1.0], [2.0], [-1.0], [0.5]], dtype="float32")
            return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size, drop_remainder=True)

        return ModelSpec(model=model, loss=keras.losses.MeanSquaredError(reduction=None),
                         make_dataset=make_dataset, optimizer=keras.optimizers.SGD(0.1))


    def not_a_spec():
        return 3
''')


@pytest.mark.slow
def test_user_model_module(file_run, tmp_path):
    (tmp_path / "mymodels.py").write_text(USER_MODULE)
    env = trainer_env(file_run.env, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    rc, events, err = run_trainer(file_run.uri, "--model", "mymodels:regression", "--steps", "80", "--batch-size", "16",
                                  "--checkpoint-every-steps", "40", env=env)
    assert rc == 0, err[-3000:]
    done = json.loads(_store(file_run.uri).get_bytes("COMPLETE"))
    # y has variance ~6.25 at the start; a learned linear map gets it near zero.
    assert done["step"] == 80 and done["metrics"]["loss"] < 0.05, done

    bad = f"file://{tmp_path}/runs/bad"
    rc, events, err = run_trainer(bad, "--model", "mymodels:not_a_spec", "--steps", "5", env=env)
    assert rc == 1
    assert events[-1]["event"] == "failed" and "expected trainer.models.ModelSpec" in events[-1]["reason"]
    assert not _store(bad).exists("COMPLETE")


@pytest.mark.slow
def test_transformer_lm_mixed_float16_with_xla_and_tied_head(file_run):
    args = ["--model", "transformer-lm", "--synthetic", "--steps", "3", "--batch-size", "4", "--precision",
            "mixed_float16", "--xla", "--lm-tied", "--lm-layers", "1", "--lm-dim", "32", "--lm-heads", "2",
            "--lm-seq-len", "16", "--lm-vocab", "64", "--checkpoint-every-steps", "3"]
    rc, events, err = run_trainer(file_run.uri, *args, env=trainer_env(file_run.env))
    assert rc == 0, err[-3000:]
    assert events[0]["precision"] == "mixed_float16"
    finished = events[-1]
    assert finished["event"] == "finished" and finished["step"] == 3 and np.isfinite(finished["metrics"]["loss"])
    # float16 trains with a dynamic loss scale, saved with the optimizer: Adam holds two slots
    # per variable plus its iteration and learning rate; the loss-scale wrapper adds four more.
    import tensorflow as tf

    store = _store(file_run.uri)
    assert store.exists("checkpoints/ckpt-3/COMMITTED")
    names = tf.train.load_checkpoint(f"{file_run.uri[len('file://'):]}/checkpoints/ckpt-3/ckpt").get_variable_to_shape_map()
    n_model = sum(1 for k in names if k.startswith("model/"))
    n_opt = sum(1 for k in names if k.startswith("optimizer/"))
    assert n_model > 0 and n_opt == 2 * n_model + 2 + 4, (n_model, n_opt)


@pytest.mark.slow
def test_transformer_lm_reports_next_token_accuracy_on_its_held_out_set(file_run, tmp_path):
    # The built-in LM, as the mlp: accuracy on the training batches, and with --synthetic a held-out
    # set evaluated every --eval-every-steps and at the end, in TensorBoard, COMPLETE and ops status.
    import io

    from rich.console import Console

    from bench.run_all import tensorboard_scalars
    from ops import status
    from trainer.data import LM_VALIDATION

    args = ["--model", "transformer-lm", "--synthetic", "--steps", "6", "--batch-size", "8", "--lm-layers", "1",
            "--lm-dim", "16", "--lm-heads", "2", "--lm-seq-len", "8", "--lm-vocab", "32", "--eval-every-steps", "3",
            "--log-every", "3", "--checkpoint-every-steps", "6"]
    rc, events, err = run_trainer(file_run.uri, *args, env=trainer_env(file_run.env))
    assert rc == 0, err[-3000:]
    evals = [e for e in events if e["event"] == "evaluated"]
    assert [e["step"] for e in evals] == [3, 6] and all(e["examples"] == LM_VALIDATION for e in evals), evals
    assert all(0.0 <= e["metrics"]["val_accuracy"] <= 1.0 and np.isfinite(e["metrics"]["val_loss"]) for e in evals)
    done = json.loads(_store(file_run.uri).get_bytes("COMPLETE"))
    assert {k: done["metrics"][k] for k in ("val_loss", "val_accuracy")} == evals[-1]["metrics"]
    assert 0.0 <= done["metrics"]["accuracy"] <= 1.0
    board = f"{file_run.uri[len('file://'):]}/tensorboard"
    assert dict(tensorboard_scalars(board, "validation/accuracy")) == pytest.approx(
        {e["step"]: e["metrics"]["val_accuracy"] for e in evals})
    assert [s for s, _ in tensorboard_scalars(board, "train/accuracy")] == [3, 6]
    out = io.StringIO()
    Console(file=out, width=160).print(status.render(status.read_status(file_run.uri)))
    assert f"val_accuracy {done['metrics']['val_accuracy']:.4g}" in out.getvalue(), out.getvalue()
