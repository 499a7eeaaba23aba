"""Training from TFRecord files in a bucket (`--data-uri`), staged to local disk first."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.trainer.helpers import kinds, mlp_example, run_trainer, trainer_env

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("run_root", ["gs"], indirect=True)
def test_trains_from_tfrecords_in_the_bucket_and_restages_nothing(run_root, tmp_path):
    import tensorflow as tf

    from runfolder.storage import open_store
    from trainer import data

    # Two record files and a stray file, uploaded next to the run.
    data_uri = run_root.uri.rsplit("/runs/", 1)[0] + "/datasets/mnist"
    store = open_store(data_uri)
    x, y = data.synthetic_mnist(n=600, seed=4)
    for part in range(2):
        path = tmp_path / f"train-{part}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as w:
            for i in range(part * 300, (part + 1) * 300):
                w.write(mlp_example(x[i] / 255.0, y[i]))
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
                w.write(mlp_example(xi / 255.0, yi))

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


LM_FLAGS = ["--model", "transformer-lm", "--lm-layers", "1", "--lm-dim", "16", "--lm-heads", "2", "--lm-seq-len", "8",
            "--lm-vocab", "32", "--steps", "140", "--batch-size", "256", "--checkpoint-every-steps", "20",
            "--log-every", "10", "--deterministic"]


def _lm_files(folder, n_files=16, per_file=2000):
    """`transformer-lm` records (9 tokens): 16 files of 2000, so the first shuffle window reads the first 8 files."""
    import tensorflow as tf

    folder.mkdir(parents=True)
    rng = np.random.default_rng(7)
    for f in range(n_files):
        with tf.io.TFRecordWriter(str(folder / f"train-{f:02d}.tfrecord")) as w:
            for _ in range(per_file):
                toks = tf.train.Int64List(value=rng.integers(0, 32, 9))
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    "tokens": tf.train.Feature(int64_list=toks)})).SerializeToString())
    return sorted(folder.iterdir())


def test_a_streamed_run_trains_before_its_last_file_and_resumes_to_the_staged_runs_weights(faulty_s3, tmp_path):
    """The data downloads through a slow link while the run trains; stopped and resumed on a fresh disk from the
    bucket's index, it ends with the weights of a run whose files were all on disk before its first step."""
    from runfolder import exits, layout
    from runfolder.storage import open_store
    from tests.trainer.helpers import Trainer, committed_weights, max_abs_diff
    from trainer import data

    files = _lm_files(tmp_path / "local")
    data_uri = f"s3://{faulty_s3.bucket}/datasets/lm"
    store = open_store(data_uri)
    for f in files:
        store.put_file(f.name, str(f))
    env = trainer_env(faulty_s3.vars)

    # The reference: every file staged before the trainer starts.
    local_uri = f"file://{tmp_path}/local"
    data.stage(local_uri, str(tmp_path / "stage-ref"))
    rc, events, err = run_trainer(f"file://{tmp_path}/runs/ref", "--data-uri", local_uri, "--data-dir",
                                  str(tmp_path / "stage-ref"), *LM_FLAGS, env=env)
    assert rc == 0, err[-3000:]
    (staged,) = [e for e in events if e["event"] == layout.DATA_STAGED]
    assert staged["downloaded"] == 0 and staged["files"] == 16 and staged["records"] == 32_000

    # A first machine: the store answers at 4 KB/s a download (a file in ~18 s, 8 at a time), so the
    # epoch's first 8 files (its first shuffle window) are on disk well before the last 8.
    faulty_s3.proxy.throttle_answers(4096)
    run = f"file://{tmp_path}/runs/streamed"
    first = Trainer(run, "--data-uri", data_uri, "--data-dir", str(tmp_path / "stage-1"), *LM_FLAGS, env=env)
    at_first = first.wait_event(layout.DATA_FIRST_STEP, timeout=240)
    assert at_first["files"] < at_first["files_total"] == 16 and at_first["bytes"] < at_first["bytes_total"]
    # Stopped after its first checkpoint; the stream waits for the last files meanwhile.
    first.wait_event(layout.CHECKPOINT, timeout=240)
    first.signal()
    assert first.wait(timeout=240) == exits.PREEMPTED, first.stderr[-3000:]
    (stopped,) = [e["step"] for e in first.events if e["event"] == layout.PREEMPTED]
    staged = [e for e in first.events if e["event"] == layout.DATA_STAGED]
    assert [(e["downloaded"], e["counted"], e["index"]) for e in staged] == [(16, 16, "written")]
    assert kinds(first.events).index(layout.DATA_FIRST_STEP) < kinds(first.events).index(layout.DATA_STAGED)

    # A replacement on a fresh disk: the index places it, nothing is counted again.
    faulty_s3.proxy.throttle_answers(0)
    rc, events, err = run_trainer(run, "--data-uri", data_uri, "--data-dir", str(tmp_path / "stage-2"), *LM_FLAGS,
                                  env=env)
    assert rc == 0, err[-3000:]
    assert [e["step"] for e in events if e["event"] == layout.RESUMED] == [stopped] and 20 <= stopped < 140
    (staged,) = [e for e in events if e["event"] == layout.DATA_STAGED]
    assert (staged["downloaded"], staged["counted"], staged["index"]) == (16, 0, "used")
    diff = max_abs_diff(committed_weights(run, 140, tmp_path / "w-streamed"),
                        committed_weights(f"file://{tmp_path}/runs/ref", 140, tmp_path / "w-ref"))
    assert diff == 0.0
