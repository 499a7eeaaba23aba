"""Training from TFRecord files in a bucket (`--data-uri`), staged to local disk first."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.trainer.helpers import run_trainer, trainer_env

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("run_root", ["gs"], indirect=True)
def test_trains_from_tfrecords_in_the_bucket_and_restages_nothing(run_root, tmp_path):
    import tensorflow as tf

    from trainer import data
    from trainer.storage import open_store

    # Two record files and a stray file, uploaded next to the run.
    data_uri = run_root.uri.rsplit("/runs/", 1)[0] + "/datasets/mnist"
    store = open_store(data_uri)
    x, y = data.synthetic_mnist(n=600, seed=4)
    for part in range(2):
        path = tmp_path / f"train-{part}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as w:
            for i in range(part * 300, (part + 1) * 300):
                w.write(data.mlp_example(x[i] / 255.0, y[i]))
        store.put_file(path.name, str(path))
    store.put_bytes("LICENSE", b"not records")

    stage = tmp_path / "stage"
    args = ["--data-uri", data_uri, "--data-dir", str(stage), "--steps", "30", "--batch-size", "32",
            "--checkpoint-every-steps", "15"]
    rc, events, err = run_trainer(run_root.uri, *args, env=trainer_env(run_root.env))
    assert rc == 0, err[-3000:]
    done = json.loads(open_store(run_root.uri).get_bytes("COMPLETE"))
    # 600 records make 18 batches of 32 per epoch: 30 steps cross into a second epoch.
    assert done["step"] == 30 and done["examples_seen"] == 960 and np.isfinite(done["metrics"]["loss"])
    staged = sorted(p.name for p in stage.rglob("*.tfrecord"))
    assert staged == ["train-0.tfrecord", "train-1.tfrecord"]
    assert not list(stage.rglob("LICENSE"))


def test_the_mlp_evaluates_every_record_of_its_validation_uri(tmp_path):
    import tensorflow as tf

    from trainer import data

    def write(folder, x, y):
        folder.mkdir()
        with tf.io.TFRecordWriter(str(folder / "part-0.tfrecord")) as w:
            for xi, yi in zip(x, y, strict=True):
                w.write(data.mlp_example(xi / 255.0, yi))

    write(tmp_path / "train", *data.synthetic_mnist(n=320, seed=4))
    write(tmp_path / "validation", *data.synthetic_mnist_validation(n=100, seed=4))  # 3 batches of 32 and 4 more
    rc, events, err = run_trainer(f"file://{tmp_path}/run", "--data-uri", f"file://{tmp_path}/train",
                                  "--validation-data-uri", f"file://{tmp_path}/validation", "--data-dir",
                                  str(tmp_path / "stage"), "--steps", "10", "--batch-size", "32",
                                  "--eval-every-steps", "5", "--keep-best", "val_accuracy")
    assert rc == 0, err[-3000:]
    evals = [e for e in events if e["event"] == "evaluated"]
    assert [(e["step"], e["examples"]) for e in evals] == [(5, 100), (10, 100)]
    done = json.loads((tmp_path / "run" / "COMPLETE").read_text())
    assert done["best"]["metric"] == "val_accuracy" and done["best"]["step"] in (5, 10)
    assert done["metrics"]["val_accuracy"] == evals[-1]["metrics"]["val_accuracy"]
